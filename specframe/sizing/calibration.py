"""Online calibration of the auto sizer: how often a node of each kind gets accepted.

``c(u)`` = P(node u accepted | its parent accepted) is learned online, binned by the draft's
conditional probability of u, by whether u is its parent's top-ranked child and by the length
of the accepted run u extends (tree depth plus the drafted tokens the last step accepted;
classes 1, 2, 3 or more: a draft that survived two checks is likelier to be right, e.g. a copied
span of the prompt, and a copy does not stop at a step boundary). A node is *tried* when its
parent is on the accepted path; it *succeeds* when it is on the path itself. Each bin is a Beta
posterior mean with an optimistic prior (every bin starts at >= 0.5), so new kinds of nodes get
verified until the data says otherwise.

:class:`RankAcceptance` keeps the same kind of posterior per rank of the root's children: what
the root-width rule reads (docs/auto-sizing.md, "The public route").
"""

from __future__ import annotations

import bisect
import math

import torch

#: Upper edges of the draft-probability bins (the last bin runs to 1). The lowest bin holds
#: drafters' "nothing to offer" guesses (the ngram fallback's 1e-6).
Q_EDGES = (1e-4, 1e-3, 1e-2, 0.03, 0.1, 0.2, 0.35, 0.5, 0.65, 0.8, 0.9, 0.97)
#: Prior pseudo-observations per bin, and the lowest prior mean (optimism).
PRIOR_STRENGTH = 2.0
PRIOR_FLOOR = 0.5
#: Calibrated conditionals stay below 1 so that a child always ranks below its parent.
C_MAX = 0.995
#: Depth classes of the calibration: depth 1, 2, ..., DEPTHS or more.
DEPTHS = 3
#: Root-child ranks tracked by :class:`RankAcceptance`, its prior (one pseudo-try at 0.5) and the
#: discount per verified step that lets an unused rank drift back to the prior and be tried again.
RANKS = 16
RANK_PRIOR = 0.5
RANK_DISCOUNT = 0.998


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


class RankAcceptance:
    """Online P(the root's child of rank r is accepted), r = 0..``RANKS - 1``: a discounted Beta
    posterior per rank (one optimistic pseudo-try at ``RANK_PRIOR``). The root is always on
    the accepted path, so each of its drafted children is tried on every verified step."""

    def __init__(self) -> None:
        self.tried = [0.0] * RANKS
        self.accepted = [0.0] * RANKS

    def record(self, ranks: list[int], accepted_rank: int | None) -> None:
        """One verified step: the root's children had ``ranks``; ``accepted_rank`` was accepted
        (None: none was)."""
        self.tried = [t * RANK_DISCOUNT for t in self.tried]
        self.accepted = [a * RANK_DISCOUNT for a in self.accepted]
        for rank in ranks:
            if rank < RANKS:
                self.tried[rank] += 1.0
                self.accepted[rank] += float(rank == accepted_rank)

    def probability(self, rank: int) -> float:
        """Posterior mean acceptance of the root's child of ``rank`` (0 beyond ``RANKS``)."""
        if rank >= RANKS:
            return 0.0
        return (self.accepted[rank] + RANK_PRIOR) / (self.tried[rank] + 1.0)

    def width(self, most: int, price: float) -> int:
        """Root children worth drafting: rank 0, then each next rank while its acceptance pays
        ``price`` (the expected tokens a row must bring to buy its share of the step), at most
        ``most``."""
        width = 1
        while width < most and self.probability(width) >= price:
            width += 1
        return width
