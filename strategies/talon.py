"""Policy ``talon``: budget-driven, confidence-gated adaptive tree (TALON, arXiv 2601.07353, Alg. 2).

Each layer expands every node of the previous layer in ONE draft forward. The first
``init_layers`` layers keep the Top-K children (robust start); later layers keep every child
whose cumulative probability is at least ``mu`` times the best cumulative probability of the
whole layer (a min-p gate anchored at the layer's argmax). A layer that would overflow the
budget keeps only its best ``N - |T|`` nodes, so the tree always ends with exactly N nodes
(given a drafter with enough finite candidates). Confident drafts give deep, narrow trees;
uncertain ones give shallow, wide trees, and the number of draft forwards adapts with them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from specframe.interfaces import DraftSession, TreePolicy
from specframe.options import require
from specframe.tree import DraftTree

from ._helpers import append_children, child_scores, top_indices, topk_children


@dataclass
class TalonOptions:
    """Options of the ``talon`` policy.

    Attributes:
        budget: N, the tree size including the root (N = 60 means 59 drafted nodes).
        mu: relative gate in (0, 1]: a candidate survives when p(u) >= mu * max p over the layer.
            Smaller mu keeps more nodes per layer (wider, shallower trees).
        top_k: K, the number of nodes kept by each of the first ``init_layers`` layers.
        init_layers: how many leading layers use Top-K instead of the gate (paper: 1).
    """

    budget: int = 60
    mu: float = 0.03
    top_k: int = 10
    init_layers: int = 1

    def __post_init__(self) -> None:
        require(self.budget >= 2, "budget", f"must be >= 2 (the root counts), got {self.budget}")
        require(0.0 < self.mu <= 1.0, "mu", f"must be in (0, 1], got {self.mu}")
        require(self.top_k >= 1, "top_k", f"must be >= 1, got {self.top_k}")
        require(self.init_layers >= 0, "init_layers", f"must be >= 0, got {self.init_layers}")


class TalonPolicy(TreePolicy):
    """TALON's budget-driven adaptive tree: Top-K start, then a relative confidence gate."""

    name = "talon"
    Options = TalonOptions

    def build(self, session: DraftSession, budget: int) -> DraftTree:
        """Grow layers until the tree holds ``min(budget, self.budget)`` nodes."""
        n_max = min(int(budget), self.budget)
        log_mu = math.log(self.options.mu)
        tree = session.new_tree()
        scores = torch.zeros(1, dtype=torch.float64, device=tree.device)
        frontier = torch.zeros(1, dtype=torch.long, device=tree.device)
        depth = 0
        while len(tree) < n_max and len(frontier):
            room = n_max - len(tree)
            initial = depth < self.options.init_layers
            keep_at_most = min(room, self.options.top_k) if initial else room
            # Only a parent's top-`keep_at_most` children can survive the final truncation,
            # so a per-row partial top-k replaces a pass over the whole vocabulary.
            values, tokens, ranks = topk_children(session.expand(tree, frontier), keep_at_most)
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
        return tree
