"""The auto sizer's cost model: what a step of a given tree size costs on this machine.

A tree of n nodes (root included) costs ``k * T(n) + D + O`` seconds: T from the measured cost
curve (:mod:`specframe.sizing.profile`) at the step's context length, ``k`` a running correction of the
curve to the observed target time (CPU timers only: on a GPU they do not wait for kernels), D the
draft time (first layer and later layers priced apart, timed per layer) and O the running rest
of a step (policy, verification, bookkeeping: a fixed part plus a part per node, fitted online).
"""

from __future__ import annotations

import time
from typing import Any

EMA = 0.1  # weight of the newest step in the running timings
#: Weight of the newest step in the moments that fit the rest of a step against the tree size:
#: slower than EMA, since a slope needs many sizes to show through the timer noise.
SLOW_EMA = 0.02
#: Least variance of the tree size (nodes^2) before a slope is fitted: a fixed size has none.
MIN_SIZE_VARIANCE = 0.25
FALLBACK_STEP_SECONDS = 1e-3  # flat curve used until a target is attached (model-free tests)
#: A draft layer cheaper than this fraction of T(1) is free: no build cap, no dry-spell skips.
CHEAP_LAYER = 0.02


def running_mean(mean: float, value: float) -> float:
    """Exponential running mean (weight ``EMA`` on the newest value); 0 means none yet."""
    return value if mean == 0.0 else mean + EMA * (value - mean)


def argmax_first(values: list[float]) -> int:
    """Index of the largest value; ties go to the smaller index (the smaller tree)."""
    return max(range(len(values)), key=lambda j: (values[j], -j))


class CostModel:
    """Modelled seconds of a step by tree size: the cost half of :class:`~specframe.sizing.AutoSizer`
    (which inherits it), usable alone to price trees."""

    def __init__(self, max_size: int) -> None:
        self.max_size = int(max_size)
        self._curve: Any = None
        self._plain_step: float | None = None  # T(1) of the curve (see the curve setter)
        self.sync_timers = True
        self.correction = 1.0
        self.overhead = 0.0  # rest of a step (all but target and draft) of a root-only tree
        self.node_overhead = 0.0  # ... and per node beyond the root, fitted (see _fit_rest)
        self._moments = [0.0, 0.0, 0.0, 0.0]  # slow running E[x], E[x^2], E[a], E[x a]; x = size - 1, a = after
        self.layer_cost = 0.0  # seconds of a build's first draft layer (forward + policy work), running
        self.deep_layer_cost = 0.0  # ... of a later layer (0: none timed yet, the first's stands in)
        self._layers = 0  # layers timed in this build
        self._layer_start: float | None = None
        self.rate = 0.0  # tokens per modelled second, running
        self._times: dict[int, list[float]] = {}

    # ------------------------------------------------------------------ set-up
    @property
    def curve(self) -> Any:
        """The target's :class:`~specframe.sizing.profile.CostCurve` (None: a flat stand-in)."""
        return self._curve

    @curve.setter
    def curve(self, curve: Any) -> None:
        self._curve = curve
        self._times = {}  # tabulated from the old curve
        # T(1) at the shortest cache: the yardstick of cheap_drafts, asked on every layer.
        self._plain_step = None if curve is None else curve.time(1, None)

    def attach(self, target: Any) -> None:
        """Read (or measure and cache) the target's cost curve."""
        from specframe.sizing.profile import curve_for

        self.curve = curve_for(target)
        self.sync_timers = target.device.type == "cpu"

    @property
    def cheap_drafts(self) -> bool:
        """Whether a draft layer (as measured so far, first or later) costs under
        ``CHEAP_LAYER`` of T(1): a free layer is never waste, so the build cap, the dry-spell
        skips and the growth factor do not apply (docs/auto-sizing.md)."""
        if self.layer_cost <= 0.0 or self._plain_step is None:
            return False
        return max(self.layer_cost, self.deep_layer_cost) < CHEAP_LAYER * self.correction * self._plain_step

    @property
    def next_layer_cost(self) -> float:
        """Running seconds of a layer after the first: what growing a tree by one layer costs."""
        return self.deep_layer_cost or self.layer_cost

    def draft_seconds(self, depth: int) -> float:
        """Modelled draft seconds of a tree ``depth`` layers deep."""
        return 0.0 if depth <= 0 else self.layer_cost + (depth - 1) * self.next_layer_cost

    # ------------------------------------------------------------------ cost model
    def target_times(self, n_max: int, context: int | None) -> list[float]:
        """Modelled target seconds ``[T(1), ..., T(n_max)]`` at this context length."""
        table, scale = self._curve_table(n_max, context)
        return [scale * t for t in table[:n_max]]

    def _curve_table(self, n_max: int, context: int | None) -> tuple[list[float], float]:
        """The curve's times at this context (at least ``n_max`` sizes, uncorrected) and the
        factor that makes them modelled seconds (the correction; 1 for the flat stand-in)."""
        if self.curve is None:
            return [FALLBACK_STEP_SECONDS] * n_max, 1.0
        # Interpolating the curve every step costs more than a tree forward of a tiny model:
        # tabulate it once per context bucket of 32 tokens.
        bucket = 0 if context is None else int(context) // 32
        table = self._times.get(bucket)
        if table is None or len(table) < n_max:
            table = self.curve.times(max(n_max, self.max_size + 1), None if context is None else 32 * bucket + 16)
            self._times[bucket] = table
        return table, self.correction

    def rates(self, gains: list[float], draft: float | list[float], context: int | None) -> list[float]:
        """Modelled tokens per second of the top-m trees, m = 1..len(gains)+1; ``draft`` is the
        draft seconds of every size (one number: the same for all, e.g. already spent)."""
        times = self.target_times(len(gains) + 1, context)
        drafts = draft if isinstance(draft, list) else [draft] * len(times)
        out, expected = [], 0.0
        for m, t in enumerate(times, start=1):
            if m > 1:
                expected += gains[m - 2]
            out.append((1.0 + expected) / (t + drafts[m - 1] + self.rest_seconds(m)))
        return out

    def rest_seconds(self, size: int) -> float:
        """Modelled rest of a step of a ``size``-node tree: everything but the target forward
        and the drafting (policy, verification, the commit)."""
        return self.overhead + self.node_overhead * (size - 1)

    def node_seconds(self, size: int, context: int | None) -> float:
        """Modelled seconds one more node adds to a ``size``-node tree: the curve's slope from
        ``size`` to twice that (the curve is noisy; its jump from T(1) to T(2) is paid by the
        first node) plus the rest of a step per node."""
        top = max(min(2 * size, self.max_size), size + 1)
        table, scale = self._curve_table(top, context)
        return scale * max(table[top - 1] - table[size - 1], 0.0) / (top - size) + self.node_overhead

    # ------------------------------------------------------------------ timing
    def layer_done(self, last: bool = False) -> None:
        """A layer was drafted, added and checked: fold its wall time (draft forward and the
        policy's own work) into the running cost of a layer. Timed per layer, not fitted per
        step, since a step's fixed costs grow with the tree. ``last``: growth stops here, so the
        time until the prune is no layer (a near-zero "layer" would halve the price). The first
        layer and later ones are priced apart: a later layer expands a whole frontier under a
        tree mask and costs more (docs/results.md, "layer prices")."""
        now = time.perf_counter()
        if self._layer_start is not None:
            spent = now - self._layer_start
            if self._layers == 0:
                self.layer_cost = running_mean(self.layer_cost, spent)
            else:
                self.deep_layer_cost = running_mean(self.deep_layer_cost, spent)
            self._layers += 1
        self._layer_start = None if last else now

    def observe_timing(self, tree_size: int, context: int | None, step: Any) -> float:
        """Fold a verified step's timings (:class:`~specframe.interfaces.StepStats`) into the
        curve correction and the rest of a step; returns its modelled rate (tokens per second)."""
        table, scale = self._curve_table(tree_size, context)
        curve_t = scale * table[tree_size - 1] / self.correction
        if self.sync_timers and curve_t > 0 and step.target_time > 0:
            self.correction += EMA * (min(max(step.target_time / curve_t, 0.2), 5.0) - self.correction)
        model_t = self.correction * curve_t
        # With waiting timers (CPU) the measured target time is exact; on a GPU it is only the
        # launch, and the modelled time stands in for it.
        target_t = step.target_time if self.sync_timers else model_t
        rest = max(step.total_time - target_t - step.draft_time, 0.0)
        self._fit_rest(tree_size - 1, rest, step.overhead_time)
        rate = step.emitted / max(model_t + step.draft_time + self.rest_seconds(tree_size), 1e-9)
        self.rate = running_mean(self.rate, rate)
        return rate

    def _fit_rest(self, x: int, rest: float, after: float) -> None:
        """Fold one step's rest (seconds; ``x`` drafted nodes) into the fixed part, a fast running
        mean that follows the machine's drift, and the part per node, a slope fitted by slow
        running moments once the sizes vary (verification reads a row of logits per node).

        The slope is fitted to ``after``, the part spent once the size was chosen (verification
        and commit): building costs what the *built* tree costs whatever is kept, and fitting it
        would price the building into every kept node. A sample is capped at three times its
        prediction (at least 1 ms), so one garbage-collector pause does not tilt the slope."""
        first = not self.rate
        if not first:
            after_fit = min(after, 3.0 * (self._moments[2] + self.node_overhead * (x - self._moments[0])) + 1e-3)
            ex, exx, er, exr = (mo + SLOW_EMA * (v - mo) for mo, v in
                                zip(self._moments, (x, x * x, after_fit, x * after_fit)))
        else:
            ex, exx, er, exr = x, x * x, after, x * after
        self._moments = [ex, exx, er, exr]
        variance = exx - ex * ex
        if variance >= MIN_SIZE_VARIANCE:
            self.node_overhead = max((exr - ex * er) / variance, 0.0)
        elif x == 0:
            # A plain step shows nothing per node: the last slope fades, so one fitted on outliers
            # cannot keep every tree at the root (and the sizes from varying again) for good.
            self.node_overhead *= 1.0 - EMA
        fixed = rest - self.node_overhead * x
        self.overhead = fixed if first else self.overhead + EMA * (fixed - self.overhead)

