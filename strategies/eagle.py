"""Policy ``eagle``: EAGLE-2/3 dynamic tree with fixed width and depth (SafeAILab/EAGLE ``topK_genrate``).

Expand the root, keep its top-K children; then ``depth`` times: expand the K frontier nodes
in one forward, add their top-K children each (K*K candidates) to the pool and keep the K best
by cumulative log-prob as the next frontier. Finally re-rank the whole pool and keep the best
N-1 nodes in pool (layer-major) order. Width and depth are fixed, so every step spends
``depth + 1`` draft forwards whatever the context.

``budget="auto"`` sizes each tree from the measured cost curve and the acceptance history
(:mod:`specframe.sizing`, docs/auto-sizing.md); the frontier width is then at most a quarter of the
step's build cap, and layers stop when their best node could not pay for itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specframe.building import append_children, child_scores, select_top
from specframe.interfaces import DraftSession
from specframe.options import require
from specframe.search_space import tunable
from specframe.selection import top_indices
from specframe.sizing import AutoBudgetOptions, AutoSizedPolicy, Growth, auto_top_k
from specframe.tree import DraftTree


@dataclass
class EagleOptions(AutoBudgetOptions):
    """Options of the ``eagle`` policy.

    Attributes:
        budget: N = EAGLE's ``total_token``, the tree size including the root, or ``"auto"``
            (EAGLE's ``total_token=-1`` in spirit): each step keeps the size that maximises
            modelled tokens per second, up to ``max_budget``.
        top_k: K, children kept per expanded node and frontier width.
        depth: D, expansion rounds after the root (D + 1 draft forwards, tree depth <= D + 1).
            EAGLE's default is 7; its evaluation scripts use 5.
        max_budget: the largest tree ``budget="auto"`` may build.
    """

    top_k: int = tunable(10, low=1, high=16)
    depth: int = tunable(7, low=1, high=10)

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.top_k >= 1, "top_k", f"must be >= 1, got {self.top_k}")
        require(self.depth >= 0, "depth", f"must be >= 0, got {self.depth}")


class EaglePolicy(AutoSizedPolicy):
    """EAGLE-2/3's static-width, static-depth dynamic tree with a final global re-rank."""

    name = "eagle"
    Options = EagleOptions

    def grow(self, session: DraftSession, growth: Growth) -> DraftTree:
        """EAGLE's ``topK_genrate``: draft the K-wide pool for D + 1 layers, then keep the best
        ``growth.nodes - 1`` nodes (under ``budget="auto"`` K is at most a quarter of the cap)."""
        n_max = growth.nodes
        k = auto_top_k(self.options.top_k, n_max) if growth.auto else self.options.top_k
        pool = session.new_tree()
        scores = torch.zeros(1, dtype=torch.float64, device=pool.device)
        frontier = torch.zeros(1, dtype=torch.long, device=pool.device)
        # A selected node at depth d needs its d-1 ancestors selected too, so layers deeper
        # than N-1 can never be kept: skip drafting them (identical tree, fewer forwards).
        layers = min(self.options.depth + 1, n_max - 1)
        for layer in range(layers):
            values, tokens, ranks = session.expand_top(pool, frontier, k)
            cand = child_scores(scores[frontier], values)
            flat = cand.flatten()
            finite = torch.nonzero(torch.isfinite(flat)).flatten()
            if not len(finite):
                break
            pool, scores, new_nodes = append_children(pool, scores, frontier, finite, cand, tokens, ranks)
            # Next frontier: top-K of this layer's candidates, best first as in EAGLE.
            frontier = new_nodes[top_indices(scores[new_nodes], k)]
            if growth.stop(pool, new_nodes, last=layer + 1 == layers):
                break
        return select_top(pool, scores, n_max)
