"""The ``goodput`` allocator's model of one batched step (docs/load.md, "The goodput rule").

A row's tree is valued by the depth its policy reaches with it, not by its node count: every
accepted token is one more depth passed, and the row's acceptance rate is measured per depth
(accepted tokens over depths tried, on the trees the row's policy built). So an ``n``-node
budget is worth ``a + a^2 + ... + a^D(n)`` tokens, ``D(n)`` the depth of the tree the policy
grows for ``n`` nodes: ``n - 1`` for a chain, far less for a wide tree. ``D(n)`` is read from
the row's own recent trees (depths per draft node), pooled over the live rows for a row that
has not speculated yet. Drafting is paid per depth (one draft call per layer, and in lockstep
one draft forward per layer shared by the rows), building per node.
"""

from __future__ import annotations

import heapq
import math
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Any, Sequence

from specframe.interfaces import StepStats


def recent_speculative(steps: Sequence[StepStats], window: int) -> list[StepStats]:
    """A row's last ``window`` steps that verified more than their root (what it measured)."""
    return [s for s in steps if s.tree_size > 1][-window:]


def acceptance_rate(steps: Sequence[StepStats], window: int, prior: float, weight: float = 0.0) -> float:
    """A row's per-depth acceptance rate from its last ``window`` speculative steps: accepted
    tokens over tries, a try being each accepted token plus the rejection that ended a step
    short of its tree's depth (the geometric model's estimate), with ``prior`` counted as
    ``weight`` tries beside them (a Beta prior's mean); ``prior`` without such steps."""
    spec = recent_speculative(steps, window)
    tries = sum(s.accepted + (1 if s.accepted < s.depth else 0) for s in spec)
    if tries + weight == 0:
        return prior
    return min((sum(s.accepted for s in spec) + prior * weight) / (tries + weight), 0.999)


def pooled_acceptance(history: Sequence[Sequence[StepStats]], window: int, prior: float, weight: float) -> float:
    """The rows' acceptance rate together: :func:`acceptance_rate` over each row's last
    ``window`` speculative steps; ``prior`` (with ``weight``) where no row has any."""
    steps = [s for h in history for s in recent_speculative(h, window)]
    return acceptance_rate(steps, max(len(steps), 1), prior, weight)


@dataclass
class RowModel:
    """One row's model: what a budget of ``n`` nodes is worth and costs.

    Attributes:
        alpha: acceptance rate per depth.
        depth_ratio: depths per draft node of the trees the row's policy builds (1: a chain).
        depth_cost: seconds of drafting per depth of the tree (one draft call per layer).
        node_cost: seconds of building (the policy's own time) per draft node.
    """

    alpha: float
    depth_ratio: float = 1.0
    depth_cost: float = 0.0
    node_cost: float = 0.0

    def depth(self, n: int) -> int:
        """The depth of the tree grown with ``n`` nodes (root included): 0 for the root alone,
        ``n - 1`` for a chain, at least 1 once it drafts."""
        if n <= 1:
            return 0
        return min(n - 1, max(1, math.ceil(self.depth_ratio * (n - 1) - 1e-9)))

    def value(self, n: int) -> float:
        """Expected accepted tokens of the tree grown with ``n`` nodes: ``a + ... + a^D(n)``."""
        a, d = self.alpha, self.depth(n)
        return float(d) if a >= 1.0 else a * (1.0 - a ** d) / (1.0 - a)

    def cost(self, n: int) -> float:
        """Seconds of drafting and building the tree grown with ``n`` nodes."""
        return self.depth_cost * self.depth(n) + self.node_cost * max(n - 1, 0)

    def next_size(self, n: int, cap: int) -> int | None:
        """The smallest budget above ``n`` (at most ``cap``) whose tree is one depth deeper; None
        when none is (nodes that only widen the tree add nothing under this model)."""
        want = self.depth(n) + 1
        if cap <= n or self.depth(cap) < want:
            return None
        lo, hi = n + 1, cap  # depth(n) is non-decreasing: bisect for the first reaching `want`
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (mid + 1, hi) if self.depth(mid) < want else (lo, mid)
        return lo


def row_model(steps: Sequence[StepStats], window: int, alpha: float, fallback: RowModel | None = None) -> RowModel:
    """A row's :class:`RowModel` from its last ``window`` speculative steps (acceptance
    ``alpha``): depths per draft node, drafting seconds per depth, building seconds per node;
    ``fallback``'s shape and costs (else a chain at no cost) where it has no such steps."""
    spec = recent_speculative(steps, window)
    nodes, depths = sum(s.tree_size - 1 for s in spec), sum(s.depth for s in spec)
    if not spec or depths == 0:
        base = fallback or RowModel(alpha)
        return RowModel(alpha, base.depth_ratio, base.depth_cost, base.node_cost)
    return RowModel(alpha, depths / nodes, sum(s.draft_time for s in spec) / depths,
                    sum(s.policy_time for s in spec) / nodes)


def step_overhead(history: Sequence[Sequence[StepStats]], window: int) -> float:
    """Seconds of a step beside its target forward and its trees' building: the median of
    ``overhead_time`` (the same for every row of a step) over the rows' last
    ``window`` steps; 0 before any step."""
    rests = [s.overhead_time for h in history for s in h[-window:]]
    return statistics.median(rests) if rests else 0.0


class Calibration:
    """The model against the measurement over the last ``steps`` steps it predicted: how much
    slower the target forward ran than its cost curve said, per live batch size (the curves
    were measured before the clock started, at other context lengths, maybe on a quieter
    machine, and each live size reads its own), and the step's rest as the batch decoder
    measured it (the step less its forward and its building), per live size too: it grows
    with the rows (each verified and kept on its own)."""

    #: Steps of a live size before its own forward scale is trusted over all sizes' together.
    OWN = 4

    def __init__(self, steps: int = 32) -> None:
        self.steps = steps
        self.forwards: dict[int, deque[tuple[float, float]]] = {}
        self.rests: dict[int, deque[float]] = {}

    def add(self, live: int, predicted_forward: float, measured: Any) -> None:
        """One step of ``live`` rows: the curve's forward for its sizes and its measured
        :class:`~specframe.decode.allocate.StepAccount`."""
        if predicted_forward > 0 and measured.target_time > 0:
            self.forwards.setdefault(live, deque(maxlen=self.steps)).append((predicted_forward, measured.target_time))
        self.rests.setdefault(live, deque(maxlen=self.steps)).append(max(measured.overhead_time, 0.0))

    def _own(self, table: dict[int, deque], live: int) -> list:
        """``live``'s samples, or every size's while it has fewer than :attr:`OWN`."""
        own = list(table.get(live, ()))
        return own if len(own) >= self.OWN else [x for q in table.values() for x in q]

    def scale(self, live: int) -> float:
        """Measured over predicted forward seconds at ``live`` rows (every size's steps
        together while it has fewer than :attr:`OWN`; 1 before any), kept within 4x either way."""
        pairs = self._own(self.forwards, live)
        if not pairs:
            return 1.0
        return min(max(sum(m for _, m in pairs) / sum(p for p, _ in pairs), 0.25), 4.0)

    def rest(self, live: int) -> float | None:
        """The median measured rest of a step of ``live`` rows (every size's steps together
        while it has fewer than :attr:`OWN`); None before any step."""
        rests = self._own(self.rests, live)
        return statistics.median(rests) if rests else None


class StepPrice:
    """Seconds of one step of ``live`` rows given their tree sizes, from the row curve: the
    padded layout pays for its longest tree in every row, the flat one for the mean size;
    ``scale``: the :class:`Calibration`'s measured over predicted forward."""

    def __init__(self, curves: Any, layout: str, live: int, cache_len: int, largest: int, scale: float = 1.0) -> None:
        self.layout, self.live, self.scale = layout, live, scale
        self.seconds = curves.row_curve(live).times(largest, cache_len)  # T(n) / live, n = 1..largest

    def __call__(self, sizes: Sequence[int]) -> float:
        """One step's target time for trees of ``sizes`` nodes."""
        n = max(sizes) if self.layout == "padded" else math.ceil(sum(sizes) / len(sizes))
        return self.scale * self.live * self.seconds[min(n, len(self.seconds)) - 1]


@dataclass
class Plan:
    """The budgets the rule chose and what it expects of the step.

    Attributes:
        sizes: each row's node budget.
        tokens: expected emitted tokens (every row's bonus token plus its expected accepted).
        target_time: the target forward's predicted seconds (the cost curve).
        build_time: the predicted seconds of drafting and building.
    """

    sizes: list[int]
    tokens: float
    target_time: float
    build_time: float


def goodput_plan(models: Sequence[RowModel], caps: Sequence[int], total: int, price: Any,
                 overhead: float = 0.0) -> Plan:
    """The sizes maximising expected emitted tokens per second of step time. Each row grows
    one depth at a time (to the smallest budget whose tree is that deep), the row whose next
    depth brings the most expected tokens per node first, and the best point along that path
    is kept (the all-roots start included, so every row may stay off). ``price(sizes)``: the
    step's target seconds; ``overhead``: the step's seconds that no size changes."""
    sizes = [1] * len(caps)
    value, spent, room = float(len(caps)), 0.0, total - len(caps)  # every row emits its bonus token
    best = Plan(list(sizes), value, price(sizes), 0.0)
    best_rate = value / max(best.target_time + overhead, 1e-12)
    heap: list[tuple[float, int, int]] = []

    def push(b: int) -> None:
        nxt = models[b].next_size(sizes[b], caps[b])
        gain = models[b].value(nxt) - models[b].value(sizes[b]) if nxt else 0.0
        if nxt and gain > 0:
            heapq.heappush(heap, (-gain / (nxt - sizes[b]), b, nxt))

    for b in range(len(caps)):
        push(b)
    while heap:
        _, b, nxt = heapq.heappop(heap)
        if nxt - sizes[b] > room:
            continue  # this row's next depth does not fit the batch budget
        m = models[b]
        value += m.value(nxt) - m.value(sizes[b])
        spent += m.cost(nxt) - m.cost(sizes[b])
        room -= nxt - sizes[b]
        sizes[b] = nxt
        target = price(sizes)
        rate = value / max(target + spent + overhead, 1e-12)
        if rate > best_rate:
            best, best_rate = Plan(list(sizes), value, target, spent), rate
        push(b)
    return best
