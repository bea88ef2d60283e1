"""Replay: evaluate drafters x policies over a recorded greedy target trace, without the target.

``record_trace`` writes a trace directory (:mod:`.trace`), ``replay_experiment`` runs an
experiment's arms over it with projected wall times (:mod:`.projection`), and :mod:`.sweep`
replays grids of configurations in local processes or on Ray. See docs/replay.md.
"""

from specframe.replay.projection import ProjectedPolicy, StepModel
from specframe.replay.record import record_trace
from specframe.replay.runner import ReplayError, ReplayExperiment, replay_experiment, step_model
from specframe.replay.target import ReplayTarget, ReplayVerifier
from specframe.replay.trace import Trace, TraceError

__all__ = ["ProjectedPolicy", "ReplayError", "ReplayExperiment", "ReplayTarget", "ReplayVerifier", "StepModel",
           "Trace", "TraceError", "record_trace", "replay_experiment", "step_model"]
