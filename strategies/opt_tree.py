"""Policy ``opt-tree``: OPT-Tree (arXiv 2406.17276), the n-node tree maximising E[accepted].

E[accepted] is approximated by the sum of the cumulative draft probabilities of the drafted
nodes. Layers of n candidates are drafted greedily (each layer: the n best children of the
previous layer, one forward); drafting stops when the best achievable sum over everything
drafted so far (``Esub``, the sum of the n largest p, ancestor-closed by the paper's Thm 3.1)
improves by no more than ``threshold``, or at ``max_depth``. The tree is the n best nodes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specframe.interfaces import DraftSession, TreePolicy
from specframe.options import require
from specframe.tree import DraftTree

from ._helpers import append_children, child_scores, select_top, top_indices, topk_children


@dataclass
class OptTreeOptions:
    """Options of the ``opt-tree`` policy.

    Attributes:
        budget: N, tree size including the root; n = N - 1 drafted nodes.
        threshold: stop when one more layer raises E[accepted] by no more than this. The paper
            picks it in [c, 1] with c = draft step time / target step time (0.2 for small LMs,
            0.8 for EAGLE heads).
        max_depth: hard cap on the number of drafted layers (= draft forwards).
    """

    budget: int = 60
    threshold: float = 0.5
    max_depth: int = 10

    def __post_init__(self) -> None:
        require(self.budget >= 2, "budget", f"must be >= 2 (the root counts), got {self.budget}")
        require(self.threshold >= 0.0, "threshold", f"must be >= 0, got {self.threshold}")
        require(self.max_depth >= 1, "max_depth", f"must be >= 1, got {self.max_depth}")


def best_sum(scores: torch.Tensor, n: int) -> float:
    """Esub: the sum of the n largest cumulative probabilities among drafted nodes (root excluded)."""
    return float(scores[1:][top_indices(scores[1:], n)].exp().sum())


class OptTreePolicy(TreePolicy):
    """Greedy layer-wise OPT-Tree with the paper's stopping rule."""

    name = "opt-tree"
    Options = OptTreeOptions

    def build(self, session: DraftSession, budget: int) -> DraftTree:
        """Draft layers of n candidates until the gain drops to ``threshold``; keep the n best."""
        n = min(int(budget), self.budget) - 1
        pool = session.new_tree()
        scores = torch.zeros(1, dtype=torch.float64, device=pool.device)
        last = torch.zeros(1, dtype=torch.long, device=pool.device)
        expected, depth = 0.0, 0
        while n >= 1:
            values, tokens, ranks = topk_children(session.expand(pool, last), n)
            cand = child_scores(scores[last], values)
            chosen = top_indices(cand.flatten(), n)
            if not len(chosen):
                break
            pool, scores, last = append_children(pool, scores, last, torch.sort(chosen).values, cand, tokens, ranks)
            depth += 1
            # The paper's rule: Esub includes the layer just drafted (the reference code's
            # version lags one layer behind).
            esub = best_sum(scores, n)
            if depth >= self.options.max_depth or esub - expected <= self.options.threshold:
                break
            expected = esub
        return select_top(pool, scores, n + 1)
