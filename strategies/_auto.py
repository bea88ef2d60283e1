"""Hardware-aware tree sizing shared by the ``"auto"`` options (talon, eagle, opt-tree, chain).

Model (docs/auto-sizing.md has the argument):

* Calibration. ``c(u)`` = P(node u accepted | its parent accepted) is learned online, binned by
  the draft's conditional probability of u, by whether u is its parent's top-ranked child and
  by the length of the accepted run u extends (tree depth plus the drafted tokens the last step
  accepted; classes 1, 2, 3 or more: a draft that survived two checks is likelier to be right,
  e.g. a copied span of the prompt, and a copy does not stop at a step boundary). A node is
  *tried* when its parent is on the accepted path; it *succeeds* when it is on the path itself.
  Each bin is a Beta posterior mean with an optimistic prior (every bin starts at >= 0.5), so
  new kinds of nodes get verified until the data says otherwise.
* Expected accepted length. The calibrated path probability of u is the product of ``c`` along
  its path; E[accepted | tree] = sum of the calibrated path probabilities of its drafted nodes.
  Path probabilities only decrease along a path, so the top-n nodes form a prefix-closed tree.
* Rate. The tree of n nodes (root included) yields ``1 + E(n)`` tokens per step and costs
  ``k * T(n) + D + O`` seconds: T from the measured cost curve (:mod:`specframe.profile`) at the
  step's context length, ``k`` a running correction of the curve to the observed target time
  (CPU timers only: on a GPU they do not wait for kernels), D this step's draft time, O the
  running rest of a step (policy, verification, bookkeeping: a fixed part plus a part per
  node, fitted online, as verification reads a row of logits per node). The chooser keeps the n (n = 1: root only, a plain step) that
  maximises the rate.
* Build size. Drafting a larger tree than the chooser keeps is waste, so the tree is built with
  a cap of twice the size that pays in steady state over the last few steps (where a size also
  pays for the draft layers it needs), and growing policies stop adding layers whose best node
  could not pay for itself. In a dry spell (no size paid for its drafting for a while) the drafter is
  only asked on one step in four. A drafter whose layer costs next to nothing against a target
  forward (the n-gram lookup) is exempt from both: its waste is nil, and a long match found at
  once is worth more than the time saved.

The bookkeeping runs on the host over plain lists (a layer is read back once): a tree of at most
a few hundred nodes costs less in Python than in a dozen tiny tensor ops per layer.
"""

from __future__ import annotations

import bisect
import math
import time
from collections import deque
from dataclasses import dataclass, replace
from typing import Any

import torch

from specframe.interfaces import DraftSession, StepStats, TreePolicy
from specframe.options import BudgetOptions, require
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
#: Weight of the newest step in the moments that fit the rest of a step against the tree size:
#: slower than EMA, since a slope needs many sizes to show through the timer noise.
SLOW_EMA = 0.02
#: Least variance of the tree size (nodes^2) before a slope is fitted: a fixed size has none.
MIN_SIZE_VARIANCE = 0.25
WINDOW = 4  # steps over which the largest kept size sets the next build cap
PROBE_EVERY = 4  # in a dry spell (plain steps only), draft on one step in this many
GROWTH_PRIOR = 2.0  # pseudo-guesses that fared as guessed (growth_factor starts at 1)
GROWTH_DISCOUNT = 0.99  # per verified step: the factor follows a change of text
FALLBACK_STEP_SECONDS = 1e-3  # flat curve used until a target is attached (model-free tests)
#: Depth classes of the calibration: depth 1, 2, ..., DEPTHS or more.
DEPTHS = 3
#: A draft layer cheaper than this fraction of T(1) is free: no build cap, no dry-spell skips.
CHEAP_LAYER = 0.02


class Calibration:
    """Online P(accepted | parent accepted) per (top-ranked or not, depth class, draft-probability
    bin): cells ``[2, DEPTHS, BINS]``, stored flat."""

    BINS = len(Q_EDGES) + 1
    SHAPE = (2, DEPTHS, BINS)

    def __init__(self) -> None:
        upper = list(Q_EDGES) + [1.0]
        # Flat cells (see cell_of); rank class 0 = top-ranked children, 1 = the others (and
        # unknown ranks). Plain lists: a step updates a few cells, and tensor ops on 78 numbers
        # cost more than the Python (the sizer runs on every step of a tiny model).
        self.prior = [min(max(PRIOR_FLOOR, q), 0.95) for q in upper] * (2 * DEPTHS)
        self.tried_counts = [0.0] * len(self.prior)
        self.accepted_counts = [0.0] * len(self.prior)
        self._log_c: list[float] | None = None  # None: recompute every cell
        self._means: list[float] = []
        self._stale: set[int] = set()  # columns (rank class, bin) whose counts changed

    @property
    def tried(self) -> torch.Tensor:
        """Tries per ``[rank class, depth class, bin]`` (a copy)."""
        return torch.tensor(self.tried_counts, dtype=torch.float64).view(self.SHAPE)

    @property
    def accepted(self) -> torch.Tensor:
        """Acceptances per ``[rank class, depth class, bin]`` (a copy)."""
        return torch.tensor(self.accepted_counts, dtype=torch.float64).view(self.SHAPE)

    def set_counts(self, tried: torch.Tensor, accepted: torch.Tensor) -> None:
        """Replace the counts (``SHAPE`` each): seeds a calibration, e.g. in tests."""
        self.tried_counts = tried.double().flatten().tolist()
        self.accepted_counts = accepted.double().flatten().tolist()
        self._log_c = None
        self._stale = set()

    def probabilities(self) -> torch.Tensor:
        """Posterior mean ``c`` per ``[rank class, depth class, bin]``."""
        return torch.tensor([math.exp(v) for v in self.log_c()], dtype=torch.float64).view(self.SHAPE)

    def log_c(self) -> list[float]:
        """``log c`` per flat cell. A cell of depth class 1 starts from the optimistic prior; a
        deeper one from the posterior of the cell one depth class above it (same rank class and
        bin), so deep nodes are not explored as a new kind of node each, yet learn their own rate
        where the data differs (copied spans). After :meth:`record` only the columns (rank
        class, bin) it touched are recomputed: the whole table every step cost a tiny model's
        step 1% (:meth:`full_log_c` is the plain recomputation)."""
        if self._log_c is None:
            self._means, self._log_c = self._recompute()
            self._stale = set()
        elif self._stale:
            for column in self._stale:
                self._update_column(column)
            self._stale = set()
        return self._log_c

    def full_log_c(self) -> list[float]:
        """``log c`` of every cell, recomputed from the counts (the reference of :meth:`log_c`)."""
        return self._recompute()[1]

    def _recompute(self) -> tuple[list[float], list[float]]:
        """Posterior means and their clipped logs, every cell from the counts."""
        means = [0.0] * len(self.prior)
        table = [0.0] * len(self.prior)
        for cell, (a, t) in enumerate(zip(self.accepted_counts, self.tried_counts)):
            prior = self.prior[cell] if depth_class(cell) == 0 else means[cell - self.BINS]
            means[cell] = (a + PRIOR_STRENGTH * prior) / (t + PRIOR_STRENGTH)
            table[cell] = math.log(min(max(means[cell], 1e-6), C_MAX))
        return means, table

    def _update_column(self, column: int) -> None:
        """Recompute the cells of one column (its depth classes, shallowest first)."""
        rank_class, b = divmod(column, self.BINS)
        cell = rank_class * DEPTHS * self.BINS + b
        prior = self.prior[cell]
        for _ in range(DEPTHS):
            mean = (self.accepted_counts[cell] + PRIOR_STRENGTH * prior) / (self.tried_counts[cell] + PRIOR_STRENGTH)
            self._means[cell] = prior = mean
            self._log_c[cell] = math.log(min(max(mean, 1e-6), C_MAX))
            cell += self.BINS

    def record(self, cells: list[int], accepted: list[bool]) -> None:
        """Count tried nodes (flat cell index each) and which of them were accepted."""
        if not cells:
            return
        per_rank_class = DEPTHS * self.BINS
        for cell, ok in zip(cells, accepted):
            self.tried_counts[cell] += 1.0
            self.accepted_counts[cell] += float(ok)
            self._stale.add((cell // per_rank_class) * self.BINS + cell % self.BINS)


def cell_of(log_q: float, rank: int, depth: int = 1) -> int:
    """Flat calibration cell of a node: whether it is its parent's top-ranked child, its depth
    class (``min(depth, DEPTHS)``) and the bin of its conditional draft probability
    ``exp(log_q)``."""
    q = math.exp(min(log_q, 0.0))
    row = (0 if rank == 0 else DEPTHS) + min(max(depth, 1), DEPTHS) - 1
    return row * Calibration.BINS + bisect.bisect_right(Q_EDGES, q)


def depth_class(cell: int) -> int:
    """The depth class (0 = depth 1, ..., ``DEPTHS - 1`` = deeper) of a flat cell of
    :func:`cell_of`."""
    return (cell // Calibration.BINS) % DEPTHS


def deeper(cell: int) -> int:
    """The cell of a node like ``cell``'s (same rank class and probability bin) one level
    deeper: what the growth guess prices a child with."""
    return cell if depth_class(cell) == DEPTHS - 1 else cell + Calibration.BINS


class HostTree:
    """Host lists of a tree being scored: parents, ranks, depths, cells, calibrated log path
    probabilities. Grown layer by layer (one read per layer) or read whole (one read).

    ``run``: drafted tokens the previous step accepted. A node's calibration cell takes depth
    ``depth + run``: it extends an accepted run of that many drafted tokens, and a run that
    crossed a step boundary is as telling as one inside a tree (a copied span goes on being
    copied whether or not the last step ended in it)."""

    def __init__(self, run: int = 0) -> None:
        self.run = int(run)
        self.parents, self.ranks, self.depths = [-1], [0], [0]
        self.cells, self.cal, self.log_c = [0], [0.0], [0.0]
        self.logp: list[float] = []  # the draft's cumulative log-probs, read with the first layer

    def __len__(self) -> int:
        return len(self.parents)

    def extend(self, tree: DraftTree, calibration: Calibration) -> None:
        """Score nodes ``len(self)..`` of ``tree``; their parents must already be scored (true
        of layer-wise growth and of any topological order read whole)."""
        k, n = len(self), len(tree)
        if k >= n:
            return
        # Only what the host does not know yet is read; depths and the parents' log-probs are
        # derived here (every tensor op costs more than the arithmetic on a tiny model's step).
        first, m = len(self.logp), n - k
        if tree.device.type == "cpu":
            # On the CPU a read is a copy: three whole reads cost less than one concatenation
            # (or than slicing first), and a tree holds at most a few hundred nodes.
            self.logp += tree.logp.tolist()[first:]
            links, ranks = tree.parents.tolist()[k:], tree.ranks.tolist()[k:]
        else:
            # On an accelerator every read waits for the device: read once.
            host = torch.cat([tree.logp[first:].double(), tree.parents[k:].double(), tree.ranks[k:].double()]).tolist()
            self.logp += host[: n - first]
            links = [int(p) for p in host[n - first: n - first + m]]
            ranks = [int(r) for r in host[n - first + m:]]
        # cell_of inlined (it is the reference; a test holds them equal): a call per node was
        # a third of the sizer's time on a tiny model's step.
        table, logp, depths, cal = calibration.log_c(), self.logp, self.depths, self.cal
        bins, run, exp, edges, bisect_right = Calibration.BINS, self.run, math.exp, Q_EDGES, bisect.bisect_right
        for j, parent in enumerate(links):
            depth = depths[parent] + 1
            log_q = logp[k + j] - logp[parent]
            row = (0 if ranks[j] == 0 else DEPTHS) + min(depth + run, DEPTHS) - 1
            cell = row * bins + bisect_right(edges, exp(log_q) if log_q < 0.0 else 1.0)
            depths.append(depth)
            self.cells.append(cell)
            self.log_c.append(table[cell])
            cal.append(cal[parent] + table[cell])
        self.parents += links
        self.ranks += ranks

    @classmethod
    def of(cls, tree: DraftTree, calibration: Calibration, run: int = 0) -> "HostTree":
        """A whole tree, read at once."""
        host = cls(run)
        host.extend(tree, calibration)
        return host


class AutoSizer:
    """Chooses each step's tree size from the cost curve and the acceptance history."""

    def __init__(self, max_size: int, start_cap: int = 8) -> None:
        self.max_size = int(max_size)
        self.start_cap = min(int(start_cap), self.max_size)
        self.calibration = Calibration()
        self._curve: Any = None
        self._plain_step: float | None = None  # T(1) of the curve (see the curve setter)
        self.sync_timers = True
        self.correction = 1.0
        self.overhead = 0.0  # rest of a step (all but target and draft) of a root-only tree
        self.node_overhead = 0.0  # ... and per node beyond the root, fitted (see observe)
        self._moments = [0.0, 0.0, 0.0, 0.0]  # slow running E[x], E[x^2], E[a], E[x a]; x = size - 1, a = after
        self.layer_cost = 0.0  # seconds of a build's first draft layer (forward + policy work), running
        self.deep_layer_cost = 0.0  # ... of a later layer (0: none timed yet, the first's stands in)
        self._layers = 0  # layers timed in this build
        self.rate = 0.0  # tokens per modelled second, running
        self._guesses: list[tuple[int, float, int | None]] = []  # this step's (depth, guess, cell)
        # Discounted sums over the guesses checked, per calibration cell the guess priced.
        self._guessed: dict[int | None, float] = {}
        self._realised: dict[int | None, float] = {}
        self.kept: deque[int] = deque(maxlen=WINDOW)
        self.dry = 0  # consecutive steps where no size paid for its drafting in steady state
        self.run = 0  # drafted tokens the last verified step of this sequence accepted
        self._times: dict[int, list[float]] = {}
        self._host: HostTree | None = None  # the tree being grown
        self._grown: DraftTree | None = None  # ... as last scored
        self._layer_start: float | None = None
        self._last: dict[str, Any] | None = None

    # ------------------------------------------------------------------ set-up
    @property
    def curve(self) -> Any:
        """The target's :class:`~specframe.profile.CostCurve` (None: a flat stand-in)."""
        return self._curve

    @curve.setter
    def curve(self, curve: Any) -> None:
        self._curve = curve
        self._times = {}  # tabulated from the old curve
        # T(1) at the shortest cache: the yardstick of cheap_drafts, asked on every layer.
        self._plain_step = None if curve is None else curve.time(1, None)

    def attach(self, target: Any) -> None:
        """Read (or measure and cache) the target's cost curve."""
        from specframe.profile import curve_for

        self.curve = curve_for(target)
        self.sync_timers = target.device.type == "cpu"

    def reset(self) -> None:
        """New generation: the per-sequence state goes; what was learned about the pair stays."""
        self._last = None
        self._host = self._grown = None
        self.run = 0

    @property
    def cap(self) -> int:
        """Build budget of the next tree: twice the size that paid lately, within limits (the
        largest size when drafting is free: growth then stops only where a layer cannot pay)."""
        if self.cheap_drafts:
            return self.max_size
        if not self.kept:
            return self.start_cap
        return max(2, min(self.max_size, 2 * max(self.kept)))

    @property
    def cheap_drafts(self) -> bool:
        """Whether a draft layer (as measured so far, first or later) costs under
        ``CHEAP_LAYER`` of T(1)."""
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

    def worth_growing(self, best_new: float, c_best: float, size: int, context: int | None,
                      depth: int | None = None, cell: int | None = None) -> bool:
        """Whether drafting another layer can pay. The next layer's best node is expected to be
        accepted with probability ``best_new * c_best``: the best calibrated path probability of
        the layer just added times the calibrated conditional of a node like it (same draft
        probability bin and rank class) one level deeper (drafts that were good keep being
        good: a matched n-gram continues, a fallback guess does not), times
        :meth:`growth_factor` of that ``cell``, how such guesses have fared. That must buy the
        node's marginal target time (the curve's slope from ``size`` to twice that) plus one
        draft layer at the running rate (tokens per second). ``depth``: of the layer just added, so that
        :meth:`observe` can check the guess."""
        if self.rate <= 0.0:
            return True  # nothing measured yet: stay optimistic
        # The marginal node time at this size, smoothed over a doubling of the tree (the curve
        # is noisy; its jump from T(1) to T(2) was paid by the first layer already).
        top = max(min(2 * size, self.max_size), size + 1)
        table, scale = self._curve_table(top, context)
        slope = scale * max(table[top - 1] - table[size - 1], 0.0) / (top - size) + self.node_overhead
        guess = best_new * c_best
        # A free layer (cheap_drafts) needs no second-guessing: over-drafting costs nothing, the
        # chooser keeps only what pays, and a factor learned on fallback guesses or on prose
        # must not stop a copied span from being drafted in full.
        factor = 1.0 if self.cheap_drafts else self.growth_factor(cell)
        grow = guess * factor >= self.rate * (slope + self.next_layer_cost)
        if grow and depth is not None:
            self._guesses.append((depth, guess, cell))
        return grow

    def growth_factor(self, cell: int | None = None) -> float:
        """Accepted next layers over guessed ones, for the layers drafted on a guess priced with
        ``cell`` (discounted): the guess assumes a child as sure as its parent. ``None``: over
        all guesses, starting at 1. A cell's own factor shrinks toward that pooled one
        (``GROWTH_PRIOR`` pseudo-guesses at it), so failed fallback guesses do not hold back
        matched drafts, and a cell with little evidence follows the rest."""
        pooled = (self._realised.get(None, 0.0) + GROWTH_PRIOR) / (self._guessed.get(None, 0.0) + GROWTH_PRIOR)
        if cell is None:
            return pooled
        return (self._realised.get(cell, 0.0) + GROWTH_PRIOR * pooled) / (self._guessed.get(cell, 0.0) + GROWTH_PRIOR)

    def _check_guesses(self, accepted: int) -> None:
        """Score the growth guesses of the step just verified: a layer drafted after depth d
        paid when the accepted path reached depth d + 1. Every step discounts all cells, so a
        factor that stopped growth (and with it its own evidence) drifts back to 1 and its
        guess is tried again."""
        for cell in self._guessed:
            self._guessed[cell] *= GROWTH_DISCOUNT
            self._realised[cell] *= GROWTH_DISCOUNT
        for depth, guess, cell in self._guesses:
            for key in {cell, None}:
                self._guessed[key] = self._guessed.get(key, 0.0) + guess
                self._realised[key] = self._realised.get(key, 0.0) + float(accepted > depth)
        self._guesses = []

    # ------------------------------------------------------------------ growing
    def skip(self, session: DraftSession) -> DraftTree | None:
        """A root-only tree without drafting, on most steps of a dry spell; else None.

        When for the last ``WINDOW`` steps no size paid for its drafting in steady state,
        drafting again on every step only costs time: the drafter is asked on one step in
        ``PROBE_EVERY``, and the first probe that finds something worth verifying ends the spell.
        A drafter whose layers are nearly free (:attr:`cheap_drafts`) is asked every step.
        """
        if self.dry < WINDOW or self.dry % PROBE_EVERY == 0 or self.cheap_drafts:
            return None
        self.dry += 1
        self._last = {"parents": [-1], "ranks": [0], "cells": [0],
                      "context": getattr(session, "context_len", None)}
        return session.new_tree()

    def begin(self) -> None:
        """A build starts: layer timing runs from here, scoring from the root."""
        self._layer_start = time.perf_counter()
        self._layers = 0
        self._guesses = []
        self._host = HostTree(self.run)
        self._grown = None

    def layer_done(self, last: bool = False) -> None:
        """A layer was drafted, added and checked: fold its wall time (draft forward and the
        policy's own work) into the running cost of a layer. Timed per layer, not fitted per
        step, because a step's fixed costs grow with the tree and would be mistaken for
        per-layer costs. ``last``: growth stops here, so the time until :meth:`prune` is not a
        layer (it was once timed as one: every build that stopped early added a near-zero
        "layer", which halved the price where one layer in two was the last, and trees grew
        layers that did not pay). The first layer and the later ones are priced apart: a later
        layer expands a whole frontier under a tree mask, and on the 2-core CPU it cost 1.2x
        the first for the tiny pair's draft model and 1.5x for SmolLM2's EAGLE-3 head (median
        per layer); one shared price, set mostly by first layers, made growth look cheaper than
        it was."""
        now = time.perf_counter()
        if self._layer_start is not None:
            spent = now - self._layer_start
            if self._layers == 0:
                self.layer_cost = _running(self.layer_cost, spent)
            else:
                self.deep_layer_cost = _running(self.deep_layer_cost, spent)
            self._layers += 1
        self._layer_start = None if last else now

    def grown(self, tree: DraftTree) -> HostTree:
        """Host view of the tree being grown, extended by the nodes added since the last call."""
        if self._host is None:
            self._host = HostTree(self.run)
        self._host.extend(tree, self.calibration)
        self._grown = tree
        return self._host

    # ------------------------------------------------------------------ choosing
    def prune(self, tree: DraftTree, session: DraftSession, choose: bool = True) -> DraftTree:
        """Keep the top-n nodes by calibrated path probability, n maximising the modelled rate
        (``choose=False``: keep the whole tree, only record it for :meth:`observe`)."""
        if self._layer_start is not None and len(tree) > 1:
            self.layer_done()  # the last layer ends here (growing loops skip the useless check)
        host = self._host if self._grown is tree and self._host is not None else HostTree.of(tree, self.calibration, self.run)
        self._host = self._grown = None
        self._layer_start = None
        n = len(host)
        # Stable and reversed: equal path probabilities keep index order (the smaller index first).
        order = sorted(range(1, n), key=host.cal.__getitem__, reverse=True)
        context = getattr(session, "context_len", None)
        m, steady = self._best_sizes(host, order, session.draft_time, context)
        m = m if choose else n
        self.kept.append(steady)
        # A dry spell: drafting does not pay for itself in steady state (even if this step's
        # sunk draft is worth verifying).
        self.dry = self.dry + 1 if steady == 1 else 0
        keep = _closed(sorted([0] + order[: m - 1]), host.parents)
        index = {old: new for new, old in enumerate(keep)}
        self._last = {"parents": [index[host.parents[i]] if i else -1 for i in keep],
                      "ranks": [host.ranks[i] for i in keep], "cells": [host.cells[i] for i in keep],
                      "context": context}
        if len(keep) == n:
            return tree
        return _subtree(tree, keep, self._last["parents"])

    def _best_sizes(self, host: HostTree, order: list[int], sunk: float, context: int | None) -> tuple[int, int]:
        """The sizes m that maximise the modelled rate of the top-m tree (``order``: nodes by
        calibrated path probability), ties to the smaller tree: this step's, where the draft
        time ``sunk`` is spent and only the target's cost depends on the size, and the steady
        state's, where a size also costs the draft layers it needs (one forward per depth level
        of its top-m). One pass; :meth:`rates` with :meth:`_layer_costs` is the reference."""
        table, scale = self._curve_table(len(order) + 1, context)
        cal, depths, exp = host.cal, host.depths, math.exp
        over, per_node = self.overhead - self.node_overhead, self.node_overhead
        expected, deepest, drafts = 0.0, 0, 0.0
        best_now = best_steady = -1.0
        m_now = m_steady = 1
        for m in range(1, len(order) + 2):
            if m > 1:
                i = order[m - 2]
                expected += exp(cal[i])
                if depths[i] > deepest:
                    deepest = depths[i]
                    drafts = self.draft_seconds(deepest)
            t = scale * table[m - 1] + over + per_node * m
            now, steady = (1.0 + expected) / (t + sunk), (1.0 + expected) / (t + drafts)
            if now > best_now:
                best_now, m_now = now, m
            if steady > best_steady:
                best_steady, m_steady = steady, m
        return m_now, m_steady

    def _layer_costs(self, order: list[int], depths: list[int]) -> list[float]:
        """Draft seconds of the top-m trees, m = 1..n: :meth:`draft_seconds` of their depth."""
        deepest, out = 0, [0.0]
        for i in order:
            deepest = max(deepest, depths[i])
            out.append(self.draft_seconds(deepest))
        return out

    # ------------------------------------------------------------------ learning
    def observe(self, step: StepStats) -> float:
        """Learn from one verified step; returns its modelled rate (tokens per second)."""
        last, self._last = self._last, None
        self.run = step.accepted
        if last is None or len(last["parents"]) != step.tree_size:
            return 0.0
        self._learn_acceptance(last, step.accepted_ranks)
        self._check_guesses(step.accepted)
        table, scale = self._curve_table(step.tree_size, last["context"])
        curve_t = scale * table[step.tree_size - 1] / self.correction
        if self.sync_timers and curve_t > 0 and step.target_time > 0:
            self.correction += EMA * (min(max(step.target_time / curve_t, 0.2), 5.0) - self.correction)
        model_t = self.correction * curve_t
        # The rest of the step: with waiting timers (CPU) the measured target time is exact;
        # on a GPU it is only the launch, and the modelled time stands in for it.
        target_t = step.target_time if self.sync_timers else model_t
        rest = max(step.total_time - target_t - step.draft_time, 0.0)
        self._fit_rest(step.tree_size - 1, rest, step.verify_time + step.other_time)
        rate = step.emitted / max(model_t + step.draft_time + self.rest_seconds(step.tree_size), 1e-9)
        self.rate = _running(self.rate, rate)
        return rate

    def _fit_rest(self, x: int, rest: float, after: float) -> None:
        """Fold one step's rest (seconds; ``x`` drafted nodes) into the fixed part, a fast running
        mean that follows the machine's drift, and the part per node, a slope fitted by slow
        running moments once the sizes vary (verification reads a row of logits per node, the
        validity flag and the read-back grow with the tree: SmolLM2 + its EAGLE-3 head, 2-core
        CPU, 0.06-0.08 ms a node against 1.5 ms of target time).

        The slope is fitted to ``after``, the part of the rest spent once the size was chosen
        (verification and commit), not to the policy's time: building and scoring cost what the
        *built* tree costs, which the choice cannot change, and since larger builds keep larger
        trees, fitting the whole rest priced the building into every kept node (the tiny demo
        pair, whose steps are mostly such work, then kept 2.3-node trees where 8 paid best).
        A sample is capped at three times its prediction (at least 1 ms) before it enters the
        fit: one garbage-collector pause on a large tree would otherwise tilt the slope for a
        hundred steps."""
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
        fixed = rest - self.node_overhead * x
        self.overhead = fixed if first else self.overhead + EMA * (fixed - self.overhead)

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


def _running(mean: float, value: float) -> float:
    """Exponential running mean (weight ``EMA`` on the newest value); 0 means none yet."""
    return value if mean == 0.0 else mean + EMA * (value - mean)


def _argmax(values: list[float]) -> int:
    """Index of the largest value; ties go to the smaller index (the smaller tree)."""
    return max(range(len(values)), key=lambda j: (values[j], -j))


def _subtree(tree: DraftTree, keep: list[int], parents: list[int]) -> DraftTree:
    """``tree.select(keep)`` for a ``keep`` known on the host to be sorted, rooted and
    ancestor-closed, with its re-indexed ``parents``: a few gathers instead of select's checks
    and index arithmetic (on a tiny model they cost more than the choice itself). A prefix
    (a plain step, a layer-wise tree cut after its best nodes) is a slice of every field."""
    if keep[-1] == len(keep) - 1:
        m = len(keep)
        return replace(tree, tokens=tree.tokens[:m], parents=tree.parents[:m], depths=tree.depths[:m],
                       logp=tree.logp[:m], ranks=tree.ranks[:m], _cache={},
                       draft_probs=None if tree.draft_probs is None else tree.draft_probs[:m],
                       origin=None if tree.origin is None else tree.origin[:m])
    index = torch.tensor(keep, dtype=torch.long, device=tree.device)
    pick = lambda values: torch.index_select(values, 0, index)  # noqa: E731 (cheaper than [index])
    return replace(tree, tokens=pick(tree.tokens), parents=torch.tensor(parents, dtype=torch.long, device=tree.device),
                   depths=pick(tree.depths), logp=pick(tree.logp), ranks=pick(tree.ranks), _cache={},
                   draft_probs=None if tree.draft_probs is None else pick(tree.draft_probs),
                   # A tree never re-indexed is its own origin: the kept indices are the origins.
                   origin=index if tree.origin is None else pick(tree.origin))


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
        count = self.count
        if 0.0 in count:
            self.arm = count.index(0.0)  # every gate is tried once first
        else:
            means = [t / c for t, c in zip(self.total, count)]
            width = self.bonus * (max(means) or 1.0) * math.sqrt(math.log(max(sum(count), 1.0)))
            ucb = [mean + width / math.sqrt(c) for mean, c in zip(means, count)]
            self.arm = ucb.index(max(ucb))  # ties: the first (smallest) gate
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
    """True when ``sizer`` judges that the layer just added (the nodes appended since the last
    call) should be the last: even its best node, at its calibrated path probability, would not
    pay for another layer."""
    if sizer is None or not len(new_nodes):
        return False
    start = len(sizer._host) if sizer._host is not None else 1
    host = sizer.grown(tree)  # the policy's one read per layer
    best = max(range(start, len(host)), key=lambda i: host.cal[i], default=None)
    stop = False
    if best is not None:
        cell = deeper(host.cells[best])
        stop = not sizer.worth_growing(math.exp(host.cal[best]), math.exp(sizer.calibration.log_c()[cell]),
                                       len(tree), getattr(session, "context_len", None), host.depths[best], cell)
    sizer.layer_done(last=stop)  # the layer's read and check are part of its cost
    return stop


def auto_top_k(top_k: int, cap: int) -> int:
    """Width of a first layer under a build cap: a quarter of the cap (at most ``top_k``), so a
    small tree keeps room for depth instead of spending everything on the root's children."""
    return min(top_k, max(1, cap // 4))


AUTO = "auto"


def check_size_option(value: Any, option: str, minimum: int) -> None:
    """``value`` must be an int >= ``minimum`` or ``"auto"``."""
    if isinstance(value, str):
        require(value == AUTO, option, f"must be an int or \"auto\", got {value!r}")
    else:
        require(value >= minimum, option, f"must be >= {minimum}, got {value} (or \"auto\")")


@dataclass
class AutoBudgetOptions(BudgetOptions):
    """:class:`~specframe.options.BudgetOptions` whose budget may also be ``"auto"``.

    Attributes:
        budget: N, the tree size including the root, or ``"auto"``: each step keeps the size
            that maximises modelled tokens per second, up to ``max_budget``.
        max_budget: the largest tree ``budget="auto"`` may build.
    """

    budget: int | str = 60
    max_budget: int = 64

    def __post_init__(self) -> None:
        check_size_option(self.budget, "budget", 2)
        require(self.max_budget >= 2, "max_budget", f"must be >= 2, got {self.max_budget}")


class AutoSizedPolicy(TreePolicy):
    """Base of the policies whose size may be ``"auto"``: holds the optional :class:`AutoSizer`
    (``self.sizer``, None for fixed sizes) and passes the engine's hooks on to it."""

    sizer: AutoSizer | None = None

    @property
    def max_budget(self) -> int:
        """N, or ``max_budget`` under ``budget="auto"`` (options: :class:`AutoBudgetOptions`)."""
        return self.options.max_budget if self.options.budget == AUTO else int(self.options.budget)

    def attach(self, target: Any) -> None:
        """Auto sizes read the target's cost curve (measured and cached on first use)."""
        if self.sizer is not None:
            self.sizer.attach(target)

    def reset(self) -> None:
        """Per-sequence state goes; acceptance statistics persist (same pair)."""
        if self.sizer is not None:
            self.sizer.reset()

    def observe(self, step: StepStats) -> None:
        """Feed the auto sizer."""
        self.observed_rate(step)

    def observed_rate(self, step: StepStats) -> float:
        """Feed the auto sizer; the step's modelled token rate (0 without a sizer)."""
        return 0.0 if self.sizer is None else self.sizer.observe(step)
