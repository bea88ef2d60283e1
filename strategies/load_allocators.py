"""Load-aware batch allocators: speculation that shrinks and grows with the live batch.

- ``threshold``: vLLM's ``disable_by_batch_size``: every sequence speculates as it would alone
  until the live batch reaches the threshold, then none does (docs/load.md).
- ``schedule``: vLLM's ``num_speculative_tokens_per_batch_size``: a list of
  ``[min batch, max batch, tokens]`` (inclusive ranges) picks each step's draft size by the live
  batch size.
- ``goodput``: SmartSpec's rule (arXiv 2406.14066) per row: each step, the node budgets that
  maximise expected emitted tokens per second of step time, priced by the target's cost curve at
  the live batch shape, each row's running acceptance estimate and the depth of the tree its
  policy grows for a budget (:mod:`specframe.strategies.goodput_model`). A row may get its root
  alone (no speculation) while another keeps a deep tree.

A budget of 1 switches a row's speculation off: the engine then verifies its root alone without
building (no policy call, no draft forward), as a plain decoding step.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from specframe.decode.allocate import AllocatorOptions, BatchAllocator, StepAccount, water_fill
from specframe.interfaces import StepStats
from specframe.strategies.goodput_model import Calibration, Plan, StepPrice, acceptance_rate, goodput_plan, \
    pooled_acceptance, recent_speculative, row_model, step_overhead


def _all_on(caps: Sequence[int], total: int) -> list[int]:
    """Every sequence up to its cap, within the batch budget (the ``equal`` split)."""
    return water_fill(caps, total)


@dataclass
class ThresholdOptions(AllocatorOptions):
    """Options of the ``threshold`` allocator.

    Attributes:
        disable_by_batch_size: speculation is off for every sequence of a step whose live batch
            has at least this many sequences (vLLM: ``running_queue_size >= disable_by_batch_size``).
    """

    disable_by_batch_size: int = 4

    def __post_init__(self) -> None:
        if int(self.disable_by_batch_size) < 1:
            raise ValueError(f"disable_by_batch_size must be >= 1 (a live batch size), got {self.disable_by_batch_size!r}")


class Threshold(BatchAllocator):
    """vLLM's ``disable_by_batch_size``: all on below the threshold, all off at or above it."""

    name = "threshold"
    Options = ThresholdOptions

    def budgets(self, caps: Sequence[int], history: Sequence[Sequence[StepStats]], total: int) -> list[int]:
        """Root only for every sequence once ``len(caps)`` reaches the threshold, else the equal split."""
        if len(caps) >= int(self.options.disable_by_batch_size):
            return [1] * len(caps)
        return _all_on(caps, total)


@dataclass
class ScheduleOptions(AllocatorOptions):
    """Options of the ``schedule`` allocator.

    Attributes:
        schedule: ``[[min batch, max batch, tokens], ...]``: inclusive batch-size ranges, sorted,
            not overlapping, the first starting at 1; ``tokens`` draft tokens (0 = speculation
            off) give a budget of ``tokens + 1`` nodes, capped by the sequence's own. A batch size
            in a gap or past the last range takes the range before it (vLLM's rule).
    """

    schedule: list = field(default_factory=lambda: [[1, 1, 4]])

    def __post_init__(self) -> None:
        self.schedule = check_schedule(self.schedule)


def check_schedule(schedule: Any) -> list[list[int]]:
    """``schedule`` as ``[[lo, hi, tokens], ...]`` sorted by ``lo``; a ValueError names the bad entry."""
    if not isinstance(schedule, (list, tuple)) or not schedule:
        raise ValueError(f"schedule must be a non-empty list of [min batch, max batch, tokens], got {schedule!r}")
    rows = []
    for entry in schedule:
        if not isinstance(entry, (list, tuple)) or len(entry) != 3 or not all(isinstance(v, int) and not isinstance(v, bool) for v in entry):
            raise ValueError(f"schedule entry {entry!r} is not [min batch, max batch, tokens] (three integers)")
        lo, hi, tokens = entry
        if lo < 1 or hi < lo or tokens < 0:
            raise ValueError(f"schedule entry {list(entry)}: need 1 <= min batch <= max batch and tokens >= 0")
        rows.append([lo, hi, tokens])
    rows.sort()
    if rows[0][0] != 1:
        raise ValueError(f"schedule's first range starts at {rows[0][0]}: it must start at batch size 1")
    for before, after in zip(rows, rows[1:]):
        if after[0] <= before[1]:
            raise ValueError(f"schedule ranges {before} and {after} overlap")
    return rows


def scheduled_tokens(schedule: Sequence[Sequence[int]], live: int) -> int:
    """The draft tokens ``schedule`` gives a live batch of ``live`` sequences."""
    tokens = schedule[0][2]
    for lo, _hi, k in schedule:
        if lo > live:
            break
        tokens = k  # in the range, or in a gap / past the end after it
    return tokens


class Schedule(BatchAllocator):
    """vLLM's per-batch-size draft length: ``tokens + 1`` nodes per sequence at each live size."""

    name = "schedule"
    Options = ScheduleOptions

    def budgets(self, caps: Sequence[int], history: Sequence[Sequence[StepStats]], total: int) -> list[int]:
        """Every sequence ``min(cap, tokens + 1)`` nodes, within the batch budget."""
        size = scheduled_tokens(self.options.schedule, len(caps)) + 1
        return water_fill([min(cap, size) for cap in caps], total)


@dataclass
class GoodputOptions(AllocatorOptions):
    """Options of the ``goodput`` allocator.

    Attributes:
        window: how many of a sequence's recent speculative steps estimate its acceptance.
        prior: the acceptance rate assumed for a sequence that has not speculated yet.
        prior_weight: how many tries the prior counts as beside the measured ones, so one
            rejected step does not switch a sequence off for good (a sequence that never
            speculates again never measures again).
        cache_len: the context length the cost curve is read at (tokens).
        draft_cost: also charge each row's measured drafting time per depth of its tree (one
            draft call per layer) and its building time per node.
        step_overhead: also charge the step's rest, what it costs beside the target forward
            and the trees' building (verification, the host read, bookkeeping): the median
            over the live rows' last ``window`` steps. It costs as much whether rows speculate
            or not, so leaving it out makes a step's extra tokens look dearer than they are.
        calibrate: scale the cost curve by the forward seconds the last steps measured over
            those it predicted, and take the step's rest from what the batch decoder measured
            (the step less its forward and building) instead of the rows' verification and
            bookkeeping alone.
        pool_prior: a row's prior is the live rows' acceptance rate together (their last
            ``window`` speculative steps each; ``prior`` while none has any), so a request that
            just joined starts from what its companions measure, as SmartSpec's moving average
            over the batch does, instead of from a fixed guess.
    """

    window: int = 8
    prior: float = 0.6
    prior_weight: float = 2.0
    cache_len: int = 256
    draft_cost: bool = True
    pool_prior: bool = True
    step_overhead: bool = True
    calibrate: bool = True

    def __post_init__(self) -> None:
        if int(self.window) < 1:
            raise ValueError(f"window must be >= 1 (steps), got {self.window!r}")
        if not 0.0 <= float(self.prior) < 1.0:
            raise ValueError(f"prior must be an acceptance rate in [0, 1), got {self.prior!r}")
        if float(self.prior_weight) < 0:
            raise ValueError(f"prior_weight must be >= 0 (tries), got {self.prior_weight!r}")
        if int(self.cache_len) < 1:
            raise ValueError(f"cache_len must be >= 1 (tokens), got {self.cache_len!r}")


class Goodput(BatchAllocator):
    """SmartSpec's goodput rule per row, priced by the cost curve at the live batch shape."""

    name = "goodput"
    Options = GoodputOptions
    wants_batch_curve = True

    def __init__(self, options: Any) -> None:
        super().__init__(options)
        self.curves: Any = None
        self.layout = "padded"
        self._plan: Plan | None = None
        self._overhead, self._scale = 0.0, 1.0
        self.calibration = Calibration()

    def price_batch(self, curves: Any, layout: str) -> None:
        """Keep the target's curves at the batch shapes and the layout to price steps with."""
        self.curves, self.layout = curves, layout

    def budgets(self, caps: Sequence[int], history: Sequence[Sequence[StepStats]], total: int) -> list[int]:
        """Each row's budget from :func:`~specframe.strategies.goodput_model.goodput_plan`; without curves (never priced) every
        row builds up to its cap, as ``equal`` does."""
        self._plan = None
        if self.curves is None:
            return _all_on(caps, total)
        o = self.options
        window, weight = int(o.window), float(o.prior_weight)
        prior = pooled_acceptance(history, window, float(o.prior), weight) if o.pool_prior else float(o.prior)
        # A row that has not speculated yet grows its trees as its companions do (same policy).
        recent = [s for h in history for s in recent_speculative(h, window)]
        pooled = row_model(recent, max(len(recent), 1), prior)
        models = [row_model(h, window, acceptance_rate(h, window, prior, weight), pooled) for h in history]
        if not o.draft_cost:
            models = [replace(m, depth_cost=0.0, node_cost=0.0) for m in models]
        cal = self.calibration if o.calibrate else Calibration()
        self._scale = cal.scale(len(caps))
        price = StepPrice(self.curves, self.layout, len(caps), int(o.cache_len), max(caps), self._scale)
        rest = cal.rest(len(caps))
        self._overhead = 0.0 if not o.step_overhead else step_overhead(history, window) if rest is None else rest
        self._plan = goodput_plan(models, caps, total, price, self._overhead)
        return self._plan.sizes

    def prediction(self) -> StepAccount | None:
        """The tokens and seconds the rule expected of the step it last decided (None unpriced)."""
        p = self._plan
        return None if p is None else StepAccount(p.tokens, p.target_time, p.build_time, self._overhead)

    def observe_step(self, measured: StepAccount) -> None:
        """Calibrate the model with what the step it decided measured (docs/load.md)."""
        if self._plan is not None:
            self.calibration.add(len(self._plan.sizes), self._plan.target_time / self._scale, measured)
