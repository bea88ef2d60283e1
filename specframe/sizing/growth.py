"""Growth control of the auto sizer: how large a tree to build, when to stop adding layers, when
to skip drafting, and how wide the root's first layer should be.

* Build size. Drafting a larger tree than the chooser keeps is waste, so a tree is built with a
  cap of twice the size that paid in steady state over the last ``WINDOW`` steps.
* Growth. A policy asks :meth:`Growth.stop` after each layer; the layer is the last when even
  its best node, at its calibrated path probability, could not pay for another layer.
* Dry spells. When no size paid for its drafting for a while, the drafter is asked on one step
  in ``PROBE_EVERY``.
* Root width. The root's children of rank 0, 1, ... are drafted while the calibrated acceptance
  of each rank pays for its row (:class:`~specframe.sizing.calibration.RankAcceptance`).

A drafter whose layers cost next to nothing (:attr:`CostModel.cheap_drafts`) is exempt from the
cap, the dry-spell skips and the growth factor: its waste is nil.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any, Callable

import torch

from specframe.interfaces import DraftSession
from specframe.tree import DraftTree

from specframe.sizing.calibration import deeper

WINDOW = 4  # steps over which the largest kept size sets the next build cap
PROBE_EVERY = 4  # in a dry spell (plain steps only), draft on one step in this many
GROWTH_PRIOR = 2.0  # pseudo-guesses that fared as guessed (growth_factor starts at 1)
GROWTH_DISCOUNT = 0.99  # per verified step: the factor follows a change of text


class GrowthControl:
    """Build cap, growth check, dry spells and root width: the growth half of
    :class:`~specframe.sizing.AutoSizer` (which inherits it and supplies the cost model, the
    calibration and the tree being grown)."""

    # Supplied by the sizer that inherits this half (AutoSizer and its CostModel): the size
    # limit, the tree being grown and its scoring, the layer timing and the growth test.
    max_size: int
    _host: Any
    calibration: Any
    grown: Callable[[DraftTree], Any]
    worth_growing: Callable[..., bool]
    layer_done: Callable[..., None]

    def __init__(self, start_cap: int) -> None:
        self.start_cap = min(int(start_cap), self.max_size)
        self._guesses: list[tuple[int, float, int | None]] = []  # this step's (depth, guess, cell)
        # Discounted sums over the guesses checked, per calibration cell the guess priced.
        self._guessed: dict[int | None, float] = {}
        self._realised: dict[int | None, float] = {}
        self.kept: deque[int] = deque(maxlen=WINDOW)
        self.dry = 0  # consecutive steps where no size paid for its drafting in steady state

    def layer_stops(self, tree: DraftTree, new_nodes: torch.Tensor, session: DraftSession, last: bool = False) -> bool:
        """True when the layer just added should be the last: even its best node, at its
        calibrated path probability, would not pay for another layer. ``last``: the policy stops
        here anyway (its tree is full): the layer is read and timed, and no guess is made.

        Reads what the sizer supplies (see the annotations at the top of the class)."""
        start = len(self._host) if self._host is not None else 1
        host = self.grown(tree)  # the policy's one read per layer
        stop = last
        best = max(range(start, len(host)), key=lambda i: host.cal[i], default=None)
        if best is not None and not last:
            cell = deeper(host.cells[best])
            stop = not self.worth_growing(math.exp(host.cal[best]), math.exp(self.calibration.log_c()[cell]),
                                          len(tree), getattr(session, "context_len", None), host.depths[best], cell)
        self.layer_done(last=stop)  # the layer's read and check are part of its cost
        return stop

    @property
    def cap(self) -> int:
        """Build budget of the next tree: twice the size that paid lately, within limits (the
        largest size when drafting is free: growth then stops only where a layer cannot pay)."""
        if self.cheap_drafts:
            return self.max_size
        if not self.kept:
            return self.start_cap
        return max(2, min(self.max_size, 2 * max(self.kept)))

    def root_width(self, most: int, context: int | None = None) -> int:
        """How many of the root's top children to draft, at most ``most``: rank 0, then each
        next rank while its calibrated acceptance pays for its row at the running token rate
        (all of them until a rate is measured)."""
        if self.rate <= 0.0:
            return most
        price = self.rate * self.node_seconds(2, context)
        return self.ranks.width(most, price)

    def worth_growing(self, best_new: float, c_best: float, size: int, context: int | None,
                      depth: int | None = None, cell: int | None = None) -> bool:
        """Whether drafting another layer can pay. The next layer's best node is expected to be
        accepted with probability ``best_new * c_best``: the best calibrated path probability of
        the layer just added times the calibrated conditional of a node like it one level
        deeper, times :meth:`growth_factor` of that ``cell`` (how such guesses have fared). That
        must buy the node's marginal time (:meth:`node_seconds`) plus one draft layer at the
        running rate. ``depth``: of the layer just added, so that the guess can be checked."""
        if self.rate <= 0.0:
            return True  # nothing measured yet: stay optimistic
        guess = best_new * c_best
        # A free layer needs no second-guessing: the chooser keeps only what pays, and a factor
        # learned on fallback guesses must not stop a copied span from being drafted in full.
        factor = 1.0 if self.cheap_drafts else self.growth_factor(cell)
        grow = guess * factor >= self.rate * (self.node_seconds(size, context) + self.next_layer_cost)
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
        factor that stopped growth (and with it its own evidence) drifts back to 1."""
        for cell in self._guessed:
            self._guessed[cell] *= GROWTH_DISCOUNT
            self._realised[cell] *= GROWTH_DISCOUNT
        for depth, guess, cell in self._guesses:
            for key in {cell, None}:
                self._guessed[key] = self._guessed.get(key, 0.0) + guess
                self._realised[key] = self._realised.get(key, 0.0) + float(accepted > depth)
        self._guesses = []

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


def stop_growing(sizer: GrowthControl | None, tree: DraftTree, new_nodes: torch.Tensor, session: DraftSession,
                 last: bool = False) -> bool:
    """True when ``sizer`` judges that the layer just added (the nodes appended since the last
    call) should be the last (:meth:`GrowthControl.layer_stops`); ``last`` alone without a sizer."""
    if sizer is None or not len(new_nodes):
        return last
    return sizer.layer_stops(tree, new_nodes, session, last)


class Growth:
    """What a policy's ``grow`` is handed by :class:`~specframe.sizing.AutoSizedPolicy`: the
    nodes it may build and the check to call after each layer.

    Attributes:
        nodes: tree size to build, root included (a fixed budget: N; ``"auto"``: the step's
            build cap, at most N).
        budget: the engine's budget N for this step (``nodes`` never exceeds it).
        auto: whether a sizer chooses the size (the policy's tree is then pruned after ``grow``).
    """

    def __init__(self, nodes: int, budget: int, sizer: GrowthControl | None = None,
                 session: DraftSession | None = None) -> None:
        self.nodes, self.budget = int(nodes), int(budget)
        self.sizer, self.session = sizer, session
        self.auto = sizer is not None

    def root_width(self, top_k: int) -> int:
        """Width of the root's first layer for a policy that asks ``top_k``: ``top_k`` for a fixed
        size; under ``"auto"`` at most ``nodes - 1``, narrowed to the ranks whose calibrated
        acceptance pays for their row (:meth:`GrowthControl.root_width`)."""
        if self.sizer is None:
            return top_k
        most = min(top_k, max(1, self.nodes - 1))
        return self.sizer.root_width(most, getattr(self.session, "context_len", None))

    def stop(self, tree: DraftTree, new_nodes: torch.Tensor, last: bool = False) -> bool:
        """Call after each layer appended (``new_nodes``: its node indices). True: draft no more
        layers. Pass ``last=True`` when the policy stops anyway (tree full), so the layer is
        still read and timed. Always False (or ``last``) for a fixed size."""
        return stop_growing(self.sizer, tree, new_nodes, self.session, last)
