"""Replay one arm over some of the questions and score it: tau and the projected speedup.

An :class:`Evaluator` loads the target once per process (a :class:`ReplayExperiment` over the
trace, which checks the trace against the experiment as ``run --replay`` does) and then
replays any number of arms, each from a fresh drafter over the questions in file order (so a
drafter that keeps state across requests sees what a live run of those questions would).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from specframe.errors import ExperimentError
from specframe.experiments.config import ArmConfig, ExperimentConfig
from specframe.experiments.data import Question
from specframe.replay.runner import ReplayError, ReplayExperiment, step_model
from specframe.replay.trace import Trace

#: What ``--objective`` may name.
OBJECTIVES = ("speedup", "tau")
#: How many partial scores a pruned evaluation reports (at equal shares of the questions).
CHECKPOINTS = 4


@dataclass
class Score:
    """An arm's score over some questions.

    Attributes:
        tau: tokens emitted / target forwards, over all answers (the report's tau).
        speedup: projected autoregressive time / projected time of the arm on the same answers
            (the report's speedup, projected).
        tokens: tokens the arm emitted; forwards: its target forwards.
        seconds: its projected time; ar_seconds: the autoregressive arm's on the same questions.
        questions: how many questions were answered.
    """

    tau: float = 0.0
    speedup: float = 0.0
    tokens: int = 0
    forwards: int = 0
    seconds: float = 0.0
    ar_seconds: float = 0.0
    questions: int = 0

    def add(self, record: Any, ar_seconds: float) -> None:
        """Count one answer (an AnswerRecord) and the autoregressive time of its question."""
        self.tokens += sum(record.choice.new_tokens)
        self.forwards += sum(record.choice.decoding_steps)
        self.seconds += sum(record.choice.wall_time)
        self.ar_seconds += ar_seconds
        self.questions += 1
        self.tau = self.tokens / max(1, self.forwards)
        self.speedup = self.ar_seconds / self.seconds if self.seconds > 0 else 0.0

    def value(self, objective: str) -> float:
        """The objective's value (``speedup`` or ``tau``)."""
        return float(getattr(self, objective))

    def to_dict(self) -> dict:
        """Plain data for tune.json."""
        return {k: (round(v, 6) if isinstance(v, float) and math.isfinite(v) else v)
                for k, v in dataclasses.asdict(self).items()}


#: How the questions split into searched and confirmation ones: ``"category"`` (stratified, what
#: a new tune uses) or ``"prefix"`` (the first share in file order: what studies recorded before
#: the stratified split searched, so that resuming one keeps the questions its trials scored).
SPLITS = ("category", "prefix")


def split_questions(questions: list[Question], split: float,
                    by: str = "category") -> tuple[list[Question], list[Question]]:
    """``(searched, confirmation)``; ``by="category"``: stratified by category: each category gives the searched
    side its ``split`` share (its first questions in file order) and the confirmation side the
    rest, so a file sorted by category searches and confirms on the same categories. Each side
    holds at least one question (a tuned arm is never scored on the questions it was tuned on);
    both keep file order."""
    if not 0.0 < split < 1.0:
        raise ExperimentError(f"--split must lie strictly between 0 and 1 (the searched share), got {split}")
    if len(questions) < 2:
        raise ExperimentError(f"tune needs at least 2 questions (some searched, some kept for confirmation); "
                              f"the experiment has {len(questions)}")
    if by not in SPLITS:
        raise ExperimentError(f"split by {by!r} is not one of {', '.join(SPLITS)}")
    if by == "prefix":
        k = min(len(questions) - 1, max(1, round(split * len(questions))))
        return questions[:k], questions[k:]
    groups: dict[str, list[int]] = {}
    for i, q in enumerate(questions):
        groups.setdefault(str(q.category), []).append(i)
    searched: set[int] = set()
    carry = 0.0  # rounding carried across categories, so the total share stays ``split``
    for members in groups.values():
        want = split * len(members) + carry
        k = min(len(members), int(round(want)))
        carry = want - k
        searched.update(members[:k])
    if not searched:
        searched.add(0)
    if len(searched) == len(questions):
        searched.discard(max(searched))
    return ([q for i, q in enumerate(questions) if i in searched],
            [q for i, q in enumerate(questions) if i not in searched])


class Evaluator:
    """One process's replay of arms over the trace (see the module docstring).

    ``arms``: the arms to tune (built once here, so an arm that cannot replay is known before
    any trial runs; :attr:`refused` holds why). ``scratch``: a directory the replay may write
    its bookkeeping into. ``threads``: torch threads (None keeps torch's). ``split`` and
    ``split_by``: :func:`split_questions`."""

    def __init__(self, config: ExperimentConfig, arms: list[ArmConfig], trace_dir: str | Path,
                 curve: str | Path | None, split: float, scratch: str | Path, threads: int | None = None,
                 split_by: str = "category") -> None:
        if threads:
            torch.set_num_threads(int(threads))
        trace = Trace.load(trace_dir)
        Path(scratch).mkdir(parents=True, exist_ok=True)
        ar = ArmConfig(name="autoregressive", baseline="autoregressive")
        config = dataclasses.replace(config, arms=[ar, *arms], warmup=0)
        self.experiment = ReplayExperiment(config, trace, step_model(trace, curve), Path(scratch), progress=False)
        try:
            self.experiment.load()
        except ReplayError as err:  # no arm replays: say why for each
            why = [s for s in self.experiment.skipped if any(s.startswith(f"{a.name} (") for a in arms)]
            if not why:
                raise
            raise ReplayError(f"no arm can be tuned, not replayed: {'; '.join(why)}") from err
        self.exactness: dict[str, str] = dict(self.experiment.exactness)
        #: Arm name -> why it does not replay (left out of the tune).
        self.refused = {a.name: _reason(a, self.experiment.skipped) for a in arms
                        if a.name not in self.experiment.runners}
        self.searched, self.confirmation = split_questions(self.experiment.questions(), split, split_by)
        self._ar: dict[str, float] = {}

    def evaluate(self, arm: ArmConfig, questions: list[Question],
                 report: Callable[[int, Score], None] | None = None) -> Score:
        """Replay ``arm`` from a fresh drafter over ``questions`` in order; ``report(done,
        score)`` gets the running score at :data:`CHECKPOINTS` equal shares (a pruner raises
        there to stop a poor trial)."""
        runner = self.experiment.runner_for(arm)
        self.exactness[arm.name] = self.experiment.exactness.get(arm.name, "exact")
        marks = {max(1, round(len(questions) * (i + 1) / CHECKPOINTS)) for i in range(CHECKPOINTS)}
        score = Score()
        for done, question in enumerate(questions, start=1):
            score.add(self.experiment.answer(arm, runner, question), self._ar_seconds(question))
            if report is not None and done in marks and done < len(questions):
                report(done, score)
        return score

    def _ar_seconds(self, question: Question) -> float:
        """The autoregressive arm's projected time on ``question`` (computed once)."""
        key = repr(question.question_id)
        if key not in self._ar:
            exp = self.experiment
            ar = next(a for a in exp.config.arms if a.baseline == "autoregressive")
            self._ar[key] = sum(exp.answer(ar, exp.runners[ar.name], question).choice.wall_time)
        return self._ar[key]


def _reason(arm: ArmConfig, skipped: list[str]) -> str:
    """Why the replay left ``arm`` out (its note in ReplayExperiment.skipped)."""
    return next((s for s in skipped if s.startswith(f"{arm.name} (")), f"{arm.name} (it does not replay)")
