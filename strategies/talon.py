"""Policy ``talon``: budget-driven, confidence-gated adaptive tree (TALON, arXiv 2601.07353, Alg. 2).

Each layer expands every node of the previous layer in ONE draft forward. The first
``init_layers`` layers keep the Top-K children (robust start); later layers keep every child
whose cumulative probability is at least ``mu`` times the best cumulative probability of the
whole layer (a min-p gate anchored at the layer's argmax). A layer that would overflow the
budget keeps only its best ``N - |T|`` nodes, so the tree always ends with exactly N nodes
(given a drafter with enough finite candidates). Confident drafts give deep, narrow trees;
uncertain ones give shallow, wide trees, and the number of draft forwards adapts with them.

``budget="auto"`` sizes each tree from the measured cost curve and the acceptance history and
``mu="auto"`` picks the gate online (:mod:`._auto`, docs/auto-sizing.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from specframe.interfaces import DraftSession, StepStats
from specframe.options import require
from specframe.tree import DraftTree

from ._auto import AUTO, AutoBudgetOptions, AutoSizedPolicy, AutoSizer, MuBandit, stop_growing
from ._helpers import append_children, child_scores, top_indices


@dataclass
class TalonOptions(AutoBudgetOptions):
    """Options of the ``talon`` policy.

    Attributes:
        budget: N, the tree size including the root (N = 60 means 59 drafted nodes), or
            ``"auto"``: each step keeps the size that maximises modelled tokens per second
            (measured cost curve, running acceptance statistics), up to ``max_budget``.
            (From :class:`AutoBudgetOptions`, with ``max_budget``.)
        mu: relative gate in (0, 1]: a candidate survives when p(u) >= mu * max p over the layer.
            Smaller mu keeps more nodes per layer (wider, shallower trees). ``"auto"``: chosen
            online by a bandit over a grid of gates (reward: tokens per modelled second).
        top_k: K, the number of nodes kept by each of the first ``init_layers`` layers (with
            ``budget="auto"``: at most the step's build cap minus one, on top of the cap; one
            when draft layers are nearly free, as with the n-gram lookup).
        init_layers: how many leading layers use Top-K instead of the gate (paper: 1).
        max_budget: the largest tree ``budget="auto"`` may build.
    """

    mu: float | str = 0.03
    top_k: int = 10
    init_layers: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.mu == AUTO or (isinstance(self.mu, (int, float)) and 0.0 < self.mu <= 1.0), "mu",
                f"must be in (0, 1] or \"auto\", got {self.mu!r}")
        require(self.top_k >= 1, "top_k", f"must be >= 1, got {self.top_k}")
        require(self.init_layers >= 0, "init_layers", f"must be >= 0, got {self.init_layers}")


class TalonPolicy(AutoSizedPolicy):
    """TALON's budget-driven adaptive tree: Top-K start, then a relative confidence gate."""

    name = "talon"
    Options = TalonOptions

    def __init__(self, options: TalonOptions) -> None:
        super().__init__(options)
        self.auto_size = options.budget == AUTO
        self.bandit = MuBandit() if options.mu == AUTO else None
        # The cost model also prices the bandit's rewards, so a fixed budget with mu="auto" has one.
        self.sizer: AutoSizer | None = (
            AutoSizer(options.max_budget) if self.auto_size or self.bandit else None)

    def observe(self, step: StepStats) -> None:
        """Feed the auto sizer and the mu bandit (which persists across sequences, like the
        acceptance statistics)."""
        rate = self.observed_rate(step)
        if self.bandit is not None and rate > 0.0 and step.draft_forwards:
            self.bandit.reward(rate)

    def build(self, session: DraftSession, budget: int) -> DraftTree:
        """Grow layers until the tree holds ``budget`` nodes (auto: the step's cap, then keep
        the best-paying top-n)."""
        if self.auto_size:
            skipped = self.sizer.skip(session)
            if skipped is not None:
                return skipped  # a plain step in a dry spell (no gate was tried: no reward)
        mu = self.bandit.choose() if self.bandit is not None else float(self.options.mu)
        if not self.auto_size:
            tree = self.grow(session, int(budget), mu, self.options.top_k)
            return self.sizer.prune(tree, session, choose=False) if self.sizer is not None else tree
        cap = min(int(budget), self.sizer.cap)
        self.sizer.begin()
        # The root's Top-K come on top of the cap: the chooser drops the children that do not
        # pay, and the layers below keep the cap's room. (A first layer cut to a quarter of the
        # cap could not make the one wide layer that is fastest where a draft layer is dear:
        # N = 4 and 8 on the 2-core CPU, for SmolLM2 + its head and for the tiny pair alike.)
        #
        # A free drafter (an n-gram lookup: cheap_drafts) starts with one child instead. Its layers
        # cost nothing, so a copied span is drafted deep anyway, and the root's other
        # continuations only compete with the span's next tokens for the rows of the target's
        # bucket. SmolLM2 + ngram, 7 chat prompts, one interleaved run: root Top-10 tau 1.373,
        # 1.163x autoregressive; Top-1 tau 1.423, 1.204x (Top-3 as Top-10).
        width = 1 if self.sizer.cheap_drafts else min(self.options.top_k, max(1, cap - 1))
        tree = self.grow(session, min(int(budget), cap + width), mu, width, self.sizer)
        return self.sizer.prune(tree, session)

    def grow(self, session: DraftSession, n_max: int, mu: float, top_k: int,
             sizer: AutoSizer | None = None) -> DraftTree:
        """TALON's layer loop (Alg. 2) up to ``n_max`` nodes; a ``sizer`` may stop it early."""
        log_mu = math.log(mu)
        tree = session.new_tree()
        scores = torch.zeros(1, dtype=torch.float64, device=tree.device)
        frontier = torch.zeros(1, dtype=torch.long, device=tree.device)
        depth = 0
        while len(tree) < n_max and len(frontier):
            room = n_max - len(tree)
            initial = depth < self.options.init_layers
            keep_at_most = min(room, top_k) if initial else room
            # Only a parent's top-`keep_at_most` children can survive the final truncation,
            # so a per-row partial top-k replaces a pass over the whole vocabulary.
            values, tokens, ranks = session.expand_top(tree, frontier, keep_at_most)
            cand = child_scores(scores[frontier], values)
            flat_scores = cand.flatten()
            if not initial:
                gate = flat_scores.max() + log_mu  # anchor: best child of ALL frontier nodes
                flat_scores = torch.where(flat_scores >= gate, flat_scores, -math.inf)
            chosen = top_indices(flat_scores, keep_at_most)
            if not len(chosen):
                break  # the drafter offered no finite candidate
            # Siblings stay together: append in (parent, rank) order.
            chosen = torch.sort(chosen).values
            tree, scores, frontier = append_children(tree, scores, frontier, chosen, cand, tokens, ranks)
            depth += 1
            if len(tree) < n_max and stop_growing(sizer, tree, frontier, session):
                break
        if sizer is not None:
            sizer.grown(tree)  # a full tree's last layer was not read yet: prune reads no more
        return tree
