"""Acceptance measured over a recorded trace, and a fitted static tree replayed beside its arm.

:func:`probe_acceptance` replays an arm's drafter over a trace with a *probe* tree in place of
its policy: every rank path with ranks below ``width`` up to ``depth`` (``static`` choices), so
each node on the accepted path offers ``width`` ranked children and every rank is tested where
the path reaches (specframe.serving.acceptance explains the counts). The trace fixes the
target's greedy continuation, so the probe costs draft forwards only.

:func:`replay_taus` replays arms over the same trace and returns each one's tau (tokens per
target forward), e.g. an adaptive TALON arm beside the static tree fitted to its drafter.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

from specframe.serving.acceptance import Acceptance, AcceptanceError, from_records, full_tree
from specframe.experiments.config import ArmConfig, ExperimentConfig, PluginRef
from specframe.experiments.metrics import load_run, totals
from specframe.replay.runner import replay_experiment


def _speculative_arm(config: ExperimentConfig, name: str) -> ArmConfig:
    """The specframe arm ``name`` (a baseline has no drafter to measure)."""
    arm = config.arm(name)
    if arm.drafter is None:
        specs = [a.name for a in config.arms if a.drafter is not None]
        raise AcceptanceError(f"arm {name!r} is a baseline: it drafts nothing to measure; specframe arms: {', '.join(specs)}")
    return arm


def probe_arm(arm: ArmConfig, width: int, depth: int) -> ArmConfig:
    """``arm``'s drafter under the full ``width``-ary probe tree of ``depth``, verified greedily."""
    return ArmConfig(name=f"{arm.name} probe {width}x{depth}", drafter=arm.drafter,
                     policy=PluginRef("static", {"choices": full_tree(width, depth)}),
                     verifier=PluginRef("greedy", {}))


def replay_taus(config: ExperimentConfig, trace_dir: str | Path, arms: list[ArmConfig],
                out_dir: str | Path | None = None) -> dict[str, float]:
    """Replay ``arms`` over the trace; ``{arm name: tau}`` (answers in ``out_dir`` or a temporary one)."""
    with tempfile.TemporaryDirectory(prefix="specframe-replay-") as tmp:
        out = Path(out_dir) if out_dir is not None else Path(tmp)
        cfg = dataclasses.replace(config, arms=list(arms), output=dataclasses.replace(config.output, dir=out))
        replay_experiment(cfg, trace_dir, out, fresh=True, progress=False)
        run = load_run(out)
        return {a.name: totals(run["arms"].get(a.name, []))["tau"] for a in arms}


def probe_acceptance(config: ExperimentConfig, trace_dir: str | Path, arm_name: str, width: int = 4,
                     depth: int = 4, provenance: dict | None = None) -> Acceptance:
    """Acceptance by depth and rank of ``arm_name``'s drafter over the trace (the probe tree)."""
    arm = probe_arm(_speculative_arm(config, arm_name), width, depth)
    with tempfile.TemporaryDirectory(prefix="specframe-probe-") as tmp:
        cfg = dataclasses.replace(config, arms=[arm], output=dataclasses.replace(config.output, dir=Path(tmp)))
        replay_experiment(cfg, trace_dir, Path(tmp), fresh=True, progress=False)
        records = load_run(Path(tmp))["arms"].get(arm.name, [])
    acc = from_records(records, arm_name, str(trace_dir), method="probe", width=width, provenance=provenance)
    # Pad to the probe's depth: a depth no step reached still was offered (and missed).
    while len(acc.reached) < depth:
        acc.reached.append(0)
        acc.hits.append([0] * width)
    return acc
