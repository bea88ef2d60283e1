"""Policy ``opt-tree``: OPT-Tree (arXiv 2406.17276), the n-node tree maximising E[accepted].

E[accepted] is approximated by the sum of the cumulative draft probabilities of the drafted
nodes. Layers of n candidates are drafted greedily (each layer: the n best children of the
previous layer, one forward); drafting stops when the best achievable sum over everything
drafted so far (``Esub``, the sum of the n largest p, ancestor-closed by the paper's Thm 3.1)
improves by no more than ``threshold``, or at ``max_depth``. The tree is the n best nodes.

``budget="auto"`` sizes each tree from the measured cost curve and the acceptance history
(:mod:`specframe.sizing`, docs/auto-sizing.md): n follows the step's build cap, layers also stop when
their best node could not pay for itself, and the calibrated top-n is kept.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specframe.building import append_children, child_scores, select_top
from specframe.interfaces import DraftSession
from specframe.options import require
from specframe.search_space import tunable
from specframe.selection import top_indices
from specframe.sizing import AutoBudgetOptions, AutoSizedPolicy, Growth
from specframe.tree import DraftTree


@dataclass
class OptTreeOptions(AutoBudgetOptions):
    """Options of the ``opt-tree`` policy.

    Attributes:
        budget: N, tree size including the root; n = N - 1 drafted nodes; or ``"auto"``: each
            step keeps the size that maximises modelled tokens per second, up to ``max_budget``.
        threshold: stop when one more layer raises E[accepted] by no more than this. The paper
            picks it in [c, 1] with c = draft step time / target step time (0.2 for small LMs,
            0.8 for EAGLE heads).
        max_depth: hard cap on the number of drafted layers (= draft forwards).
        max_budget: the largest tree ``budget="auto"`` may build.
    """

    threshold: float = tunable(0.5, low=0.0, high=1.0)
    max_depth: int = tunable(10, low=1, high=12)

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.threshold >= 0.0, "threshold", f"must be >= 0, got {self.threshold}")
        require(self.max_depth >= 1, "max_depth", f"must be >= 1, got {self.max_depth}")


def best_sum(scores: torch.Tensor, n: int) -> float:
    """Esub: the sum of the n largest cumulative probabilities among drafted nodes (root excluded)."""
    return float(scores[1:][top_indices(scores[1:], n)].exp().sum())


class OptTreePolicy(AutoSizedPolicy):
    """Greedy layer-wise OPT-Tree with the paper's stopping rule."""

    name = "opt-tree"
    Options = OptTreeOptions

    def grow(self, session: DraftSession, growth: Growth) -> DraftTree:
        """OPT-Tree's greedy layers of n = ``growth.nodes - 1`` candidates until the gain drops
        to ``threshold``; keep the n best."""
        n = growth.nodes - 1
        pool = session.new_tree()
        scores = torch.zeros(1, dtype=torch.float64, device=pool.device)
        last = torch.zeros(1, dtype=torch.long, device=pool.device)
        expected, depth = 0.0, 0
        while n >= 1:
            values, tokens, ranks = session.expand_top(pool, last, n)
            cand = child_scores(scores[last], values)
            chosen = top_indices(cand.flatten(), n)
            if not len(chosen):
                break
            pool, scores, last = append_children(pool, scores, last, torch.sort(chosen).values, cand, tokens, ranks)
            depth += 1
            # The paper's rule: Esub includes the layer just drafted (the reference code's
            # version lags one layer behind).
            esub = best_sum(scores, n)
            done = depth >= self.options.max_depth or esub - expected <= self.options.threshold
            if growth.stop(pool, last, last=done):
                break
            expected = esub
        return select_top(pool, scores, n + 1)
