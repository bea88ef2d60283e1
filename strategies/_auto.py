"""Hardware-aware tree sizing shared by the ``"auto"`` options (talon, eagle, opt-tree, chain).

Model (docs/auto-sizing.md has the argument):

* Calibration. ``c(u)`` = P(node u accepted | its parent accepted) is learned online, binned by
  the draft's conditional probability of u and by whether u is its parent's top-ranked child.
  A node is *tried* when its parent is on the accepted path; it *succeeds* when it is on the
  path itself. Each bin is a Beta posterior mean with an optimistic prior (every bin starts at
  >= 0.5), so new kinds of nodes get verified until the data says otherwise.
* Expected accepted length. The calibrated path probability of u is the product of ``c`` along
  its path; E[accepted | tree] = sum of the calibrated path probabilities of its drafted nodes.
  Path probabilities only decrease along a path, so the top-n nodes form a prefix-closed tree.
* Rate. The tree of n nodes (root included) yields ``1 + E(n)`` tokens per step and costs
  ``k * T(n) + D + O`` seconds: T from the measured cost curve (:mod:`specframe.profile`) at the
  step's context length, ``k`` a running correction of the curve to the observed target time
  (CPU timers only: on a GPU they do not wait for kernels), D this step's draft time, O the
  running per-step overhead. The chooser keeps the n (n = 1: root only, a plain step) that
  maximises the rate.
* Build size. Drafting a larger tree than the chooser keeps is waste, so the tree is built with
  a cap of twice the largest size kept over the last few steps (doubling while it saturates),
  and growing policies stop adding layers whose best node could not pay for itself.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import torch

from specframe.interfaces import DraftSession, StepStats
from specframe.tree import DraftTree

#: Upper edges of the draft-probability bins (the last bin runs to 1). The lowest bin holds
#: drafters' "nothing to offer" guesses (the ngram fallback's 1e-6).
Q_EDGES = (1e-4, 1e-3, 1e-2, 0.03, 0.1, 0.2, 0.35, 0.5, 0.65, 0.8, 0.9, 0.97)
#: Prior pseudo-observations per bin, and the lowest prior mean (optimism).
PRIOR_STRENGTH = 2.0
PRIOR_FLOOR = 0.5
#: Calibrated conditionals stay below 1 so that a child always ranks below its parent.
C_MAX = 0.995
EMA = 0.1  # weight of the newest step in the running timings
WINDOW = 4  # steps over which the largest kept size sets the next build cap
FALLBACK_STEP_SECONDS = 1e-3  # flat curve used until a target is attached (model-free tests)


class Calibration:
    """Online P(accepted | parent accepted) per (draft-probability bin, top-ranked or not)."""

    def __init__(self) -> None:
        n_bins = len(Q_EDGES) + 1
        upper = list(Q_EDGES) + [1.0]
        prior = [min(max(PRIOR_FLOOR, q), 0.95) for q in upper]
        # Row 0: top-ranked children; row 1: the others (and unknown ranks).
        self.prior = torch.tensor([prior, prior], dtype=torch.float64)
        self.tried = torch.zeros(2, n_bins, dtype=torch.float64)
        self.accepted = torch.zeros(2, n_bins, dtype=torch.float64)
        self._log_c: dict[torch.device, torch.Tensor] = {}
        self._top_rate: float | None = None

    def probabilities(self) -> torch.Tensor:
        """Posterior mean ``c`` per ``[rank class, bin]``."""
        mean = (self.accepted + PRIOR_STRENGTH * self.prior) / (self.tried + PRIOR_STRENGTH)
        return mean.clamp(1e-6, C_MAX)

    def log_table(self, device: torch.device) -> torch.Tensor:
        """Flattened ``log c`` on ``device`` (index = rank class * bins + bin), cached per update."""
        if device not in self._log_c:
            self._log_c[device] = self.probabilities().log().flatten().to(device)
        return self._log_c[device]

    def record(self, cells: list[int], accepted: list[bool]) -> None:
        """Count tried nodes (flat cell index each) and which of them were accepted."""
        if not cells:
            return
        index = torch.tensor(cells, dtype=torch.long)
        self.tried.view(-1).index_add_(0, index, torch.ones(len(cells), dtype=torch.float64))
        self.accepted.view(-1).index_add_(0, index, torch.tensor(accepted, dtype=torch.float64))
        self._log_c = {}
        self._top_rate = None

    def top_child_rate(self) -> float:
        """P(accepted | parent accepted) of top-ranked children over all bins (prior: 0.5 + 1 try)."""
        if self._top_rate is None:
            self._top_rate = float((self.accepted[0].sum() + 0.5) / (self.tried[0].sum() + 1.0))
        return self._top_rate


_EDGES: dict[torch.device, torch.Tensor] = {}


def node_cells(tree: DraftTree, start: int = 0) -> torch.Tensor:
    """Calibration cell of nodes ``start..`` (the root's is unused) from each node's conditional
    draft probability and whether it is its parent's top-ranked child."""
    logp = tree.logp.double()
    parents = tree.parents[start:].clamp(min=0)
    cond = (logp[start:] - logp[parents]).clamp(max=0.0).exp()
    edges = _EDGES.get(tree.device)
    if edges is None:
        edges = _EDGES[tree.device] = torch.tensor(Q_EDGES, dtype=torch.float64, device=tree.device)
    bins = torch.bucketize(cond, edges, right=True)
    other = (tree.ranks[start:] != 0).long()
    return other * (len(Q_EDGES) + 1) + bins


def calibrated_logp(tree: DraftTree, calibration: Calibration) -> tuple[torch.Tensor, torch.Tensor]:
    """(calibrated log path probability of every node (root 0), cell of every node)."""
    cells = node_cells(tree)
    log_c = calibration.log_table(tree.device)[cells]
    log_c[0] = 0.0
    return tree.ancestor_mask().double() @ log_c, cells


class RunningFit:
    """Exponentially weighted least squares of y = a + b x (recent steps weigh most).

    Prices one more draft layer (x = draft forwards) or one more built node (x = tree size) by
    the slope b, so a per-step fixed cost does not inflate the price of growing."""

    def __init__(self, weight: float = EMA) -> None:
        self.weight = weight
        self.moments: list[float] | None = None  # E[x], E[y], E[xx], E[xy]

    def add(self, x: float, y: float) -> None:
        """Record one observation."""
        new = [x, y, x * x, x * y]
        if self.moments is None:
            self.moments = new
        else:
            self.moments = [m + self.weight * (v - m) for m, v in zip(self.moments, new)]

    @property
    def slope(self) -> float:
        """b (>= 0); y / x while the x seen so far barely vary."""
        if self.moments is None:
            return 0.0
        mx, my, mxx, mxy = self.moments
        var = mxx - mx * mx
        if var < 0.25:  # x nearly constant: no slope to fit
            return max(my / mx, 0.0) if mx > 0 else 0.0
        return max((mxy - mx * my) / var, 0.0)


class AutoSizer:
    """Chooses each step's tree size from the cost curve and the acceptance history."""

    def __init__(self, max_size: int, start_cap: int = 8) -> None:
        self.max_size = int(max_size)
        self.start_cap = min(int(start_cap), self.max_size)
        self.calibration = Calibration()
        self.curve: Any = None
        self.sync_timers = True
        self.correction = 1.0
        self.overhead = 0.0
        self.layer_cost = RunningFit()  # build seconds against draft forwards
        self.node_cost = RunningFit()  # build seconds against tree size
        self.rate = 0.0  # tokens per modelled second, running
        self._times: dict[int, list[float]] = {}
        self._cal: torch.Tensor | None = None  # scores of the tree being grown
        self._cal_tree: DraftTree | None = None
        self.kept: deque[int] = deque(maxlen=WINDOW)
        self._last: dict[str, Any] | None = None

    # ------------------------------------------------------------------ set-up
    def attach(self, target: Any) -> None:
        """Read (or measure and cache) the target's cost curve."""
        from specframe.profile import curve_for

        self.curve = curve_for(target)
        self.sync_timers = target.device.type == "cpu"

    def reset(self) -> None:
        """New generation: the per-sequence state goes; what was learned about the pair stays."""
        self._last = None

    @property
    def cap(self) -> int:
        """Build budget of the next tree: twice the largest size kept lately, within limits."""
        if not self.kept:
            return self.start_cap
        return max(2, min(self.max_size, 2 * max(self.kept)))

    # ------------------------------------------------------------------ cost model
    def target_times(self, n_max: int, context: int | None) -> list[float]:
        """Modelled target seconds ``[T(1), ..., T(n_max)]`` at this context length."""
        if self.curve is None:
            return [FALLBACK_STEP_SECONDS] * n_max
        # Interpolating the curve every step costs more than a tree forward of a tiny model:
        # tabulate it once per context bucket of 32 tokens.
        bucket = 0 if context is None else int(context) // 32
        table = self._times.get(bucket)
        if table is None or len(table) < n_max:
            table = self.curve.times(max(n_max, self.max_size + 1), None if context is None else 32 * bucket + 16)
            self._times[bucket] = table
        return [self.correction * t for t in table[:n_max]]

    def rates(self, gains: list[float], draft: float | list[float], context: int | None) -> list[float]:
        """Modelled tokens per second of the top-m trees, m = 1..len(gains)+1; ``draft`` is the
        draft seconds of every size (one number: the same for all, e.g. already spent)."""
        times = self.target_times(len(gains) + 1, context)
        drafts = draft if isinstance(draft, list) else [draft] * len(times)
        out, expected = [], 0.0
        for m, t in enumerate(times, start=1):
            if m > 1:
                expected += gains[m - 2]
            out.append((1.0 + expected) / (t + drafts[m - 1] + self.overhead))
        return out

    def worth_growing(self, best_new: float, size: int, context: int | None) -> bool:
        """Whether drafting another layer can pay. Its best node is expected to be accepted with
        probability ``best_new`` (the best calibrated path probability of the layer just added)
        times the acceptance rate of top-ranked children; that must buy the node's marginal
        target time (the curve's mean slope up to here) plus one draft forward at the running
        rate (tokens per second)."""
        if self.rate <= 0.0:
            return True  # nothing measured yet: stay optimistic
        times = self.target_times(min(size + 1, self.max_size) + 1, context)
        slope = max(times[-1] - times[0], 0.0) / max(len(times) - 1, 1)
        gain = best_new * self.calibration.top_child_rate()
        return gain >= self.rate * (slope + self.layer_cost.slope)

    # ------------------------------------------------------------------ choosing
    def scores(self, tree: DraftTree) -> torch.Tensor:
        """Calibrated log path probabilities of a tree being grown layer by layer.

        Called after each layer: the nodes added since the last call are scored from their
        parents, which must all be older nodes (true of layer-wise growth), so a layer costs a
        few small ops instead of a pass over the whole tree. A new build starts from the root.
        """
        cal, old = self._cal, self._cal_tree
        if cal is None or old is None or len(old) > len(tree):
            cal, k = torch.zeros(1, dtype=torch.float64, device=tree.device), 1
        else:
            k = len(old)
        if k < len(tree):
            log_c = self.calibration.log_table(tree.device)[node_cells(tree, k)]
            cal = torch.cat([cal, cal[tree.parents[k:]] + log_c])
        self._cal, self._cal_tree = cal, tree
        return cal

    def prune(self, tree: DraftTree, session: DraftSession, choose: bool = True) -> DraftTree:
        """Keep the top-n nodes by calibrated path probability, n maximising the modelled rate
        (``choose=False``: keep the whole tree, only record it for :meth:`observe`)."""
        score = self.scores(tree) if self._cal_tree is tree else calibrated_logp(tree, self.calibration)[0]
        self._cal = self._cal_tree = None
        cells = node_cells(tree)
        n = len(tree)
        host = torch.cat([score, tree.parents.double(), tree.ranks.double(), cells.double()]).tolist()
        score_h, parents = host[:n], [int(p) for p in host[n : 2 * n]]
        ranks, cells_h = [int(r) for r in host[2 * n : 3 * n]], [int(c) for c in host[3 * n :]]
        order = sorted(range(1, n), key=lambda i: (-score_h[i], i))
        gains = [math.exp(score_h[i]) for i in order]
        context = getattr(session, "context_len", None)
        # This step: the draft time is spent, so only the target's cost depends on the size.
        m = _argmax(self.rates(gains, session.draft_time, context)) + 1 if choose else n
        # Next steps: drafting scales with the tree, so the build cap follows the size that pays
        # in steady state, with each kept node also carrying its share of the draft time.
        per_node = self.node_cost.slope
        steady = [per_node * k for k in range(1, n + 1)]
        self.kept.append(_argmax(self.rates(gains, steady, context)) + 1)
        keep = _closed(sorted([0] + order[: m - 1]), parents)
        index = {old: new for new, old in enumerate(keep)}
        self._last = {"parents": [index[parents[i]] if i else -1 for i in keep],
                      "ranks": [ranks[i] for i in keep], "cells": [cells_h[i] for i in keep],
                      "context": getattr(session, "context_len", None)}
        if len(keep) == n:
            return tree
        return tree.select(torch.tensor(keep, dtype=torch.long, device=tree.device))

    # ------------------------------------------------------------------ learning
    def observe(self, step: StepStats) -> float:
        """Learn from one verified step; returns its modelled rate (tokens per second)."""
        last, self._last = self._last, None
        if last is None or len(last["parents"]) != step.tree_size:
            return 0.0
        self._learn_acceptance(last, step.accepted_ranks)
        curve_t = self.target_times(step.tree_size, last["context"])[-1] / self.correction
        if self.sync_timers and curve_t > 0 and step.target_time > 0:
            self.correction += EMA * (min(max(step.target_time / curve_t, 0.2), 5.0) - self.correction)
        model_t = self.correction * curve_t
        rest = max(step.total_time - model_t - step.draft_time, 0.0)
        self.overhead += EMA * (rest - self.overhead) if self.rate else rest - self.overhead
        # Growing costs the drafter's forward and the policy's own work per layer alike.
        building = step.draft_time + step.policy_time
        self.layer_cost.add(step.draft_forwards, building)
        self.node_cost.add(step.tree_size, building)
        rate = step.emitted / max(model_t + step.draft_time + self.overhead, 1e-9)
        self.rate = rate if self.rate == 0.0 else self.rate + EMA * (rate - self.rate)
        return rate

    def _learn_acceptance(self, last: dict[str, Any], accepted_ranks: list[int]) -> None:
        """Walk the accepted path by ranks; every child of a path node was tried."""
        parents, ranks, cells = last["parents"], last["ranks"], last["cells"]
        children: dict[int, list[int]] = {}
        for i in range(1, len(parents)):
            children.setdefault(parents[i], []).append(i)
        node, tried, ok = 0, [], []
        depth = 0
        while True:
            kids = children.get(node, [])
            nxt = None
            if depth < len(accepted_ranks):
                match = [k for k in kids if ranks[k] == accepted_ranks[depth]]
                if len(match) != 1:
                    return  # ranks do not identify the path (unknown ranks): learn nothing
                nxt = match[0]
            tried += [cells[k] for k in kids]
            ok += [k == nxt for k in kids]
            if nxt is None:
                break
            node, depth = nxt, depth + 1
        self.calibration.record(tried, ok)


def _argmax(values: list[float]) -> int:
    """Index of the largest value; ties go to the smaller index (the smaller tree)."""
    return max(range(len(values)), key=lambda j: (values[j], -j))


def _closed(keep: list[int], parents: list[int]) -> list[int]:
    """``keep`` plus any missing ancestor (a guard: the ordering already makes it closed)."""
    have = set(keep)
    for i in list(keep):
        p = parents[i]
        while p > 0 and p not in have:
            have.add(p)
            p = parents[p]
    return sorted(have)


class MuBandit:
    """Discounted UCB over a grid of TALON gates; reward = emitted tokens per modelled second.

    No prior knowledge of the pair: every mu is tried once, then the arm with the best
    discounted mean plus an exploration bonus (scaled to the rewards seen) is played. The
    discount lets the choice follow a change of text (prose to code) within a few hundred steps.
    """

    GRID = (0.01, 0.03, 0.1, 0.3, 1.0)

    def __init__(self, grid: tuple[float, ...] = GRID, discount: float = 0.98, bonus: float = 0.5) -> None:
        self.grid = tuple(grid)
        self.discount = discount
        self.bonus = bonus
        self.count = [0.0] * len(self.grid)
        self.total = [0.0] * len(self.grid)
        self.arm = 0

    def choose(self) -> float:
        """The gate for the next tree."""
        untried = [i for i, c in enumerate(self.count) if c == 0.0]
        if untried:
            self.arm = untried[0]
        else:
            n = sum(self.count)
            means = [t / c for t, c in zip(self.total, self.count)]
            scale = max(means) or 1.0
            self.arm = max(range(len(self.grid)), key=lambda i: (
                means[i] + self.bonus * scale * math.sqrt(math.log(max(n, 1.0)) / self.count[i]), -i))
        return self.grid[self.arm]

    def reward(self, value: float) -> None:
        """Credit the last chosen gate with ``value``."""
        self.count = [c * self.discount for c in self.count]
        self.total = [t * self.discount for t in self.total]
        self.count[self.arm] += 1.0
        self.total[self.arm] += value

    @property
    def best(self) -> float:
        """The gate with the best discounted mean so far."""
        means = [t / c if c else -1.0 for t, c in zip(self.total, self.count)]
        return self.grid[max(range(len(self.grid)), key=lambda i: means[i])]


def stop_growing(sizer: AutoSizer | None, tree: DraftTree, new_nodes: torch.Tensor, session: DraftSession) -> bool:
    """True when ``sizer`` judges that the layer just added (``new_nodes``) should be the last:
    even its best node, at its calibrated path probability, would not pay for another layer."""
    if sizer is None or not len(new_nodes):
        return False
    score = sizer.scores(tree)
    best = float(score[new_nodes].max().exp())  # the policy's one read per layer
    return not sizer.worth_growing(best, len(tree), getattr(session, "context_len", None))


def auto_top_k(top_k: int, cap: int) -> int:
    """Width of a first layer under a build cap: a quarter of the cap (at most ``top_k``), so a
    small tree keeps room for depth instead of spending everything on the root's children."""
    return min(top_k, max(1, cap // 4))


AUTO = "auto"


def check_size_option(value: Any, option: str, minimum: int) -> None:
    """``value`` must be an int >= ``minimum`` or ``"auto"``."""
    from specframe.options import require

    require(value == AUTO or (isinstance(value, int) and not isinstance(value, bool) and value >= minimum),
            option, f"must be an integer >= {minimum} or \"auto\", got {value!r}")
