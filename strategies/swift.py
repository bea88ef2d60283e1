"""Policy ``swift``: SWIFT's draft tree (hemingkx/SWIFT, ``swift_draft`` and ``get_choices_list``).

A confidence-stopped chain: the drafter's top-1 child is drafted and expanded until its top-1
probability falls below ``stop_threshold`` (that row is still used) or ``max_step_draft`` rows
were drafted. Then each row ``idx`` of the chain (the node at depth ``idx``) keeps its top
``k`` children, where ``k`` follows the row's top-1 probability ``p``: 3 / 5 / 8 / 10 for
``p > 0.95 / 0.8 / 0.5 / else`` (1 / 3 / 5 / 10 with ``sampling``, as SWIFT under a logits
processor). The tree is the rank paths ``[0] * idx + [i]``, ``i < k``: SWIFT's ``swift_choices``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specframe.interfaces import DraftSession, TreePolicy
from specframe.options import BudgetOptions, require
from specframe.search_space import tunable
from specframe.tree import DraftTree

#: SWIFT's ``TOPK``: the most children a row keeps.
TOPK = 10


def choices_list(probs: list[float], sampling: bool = False) -> list[list[int]]:
    """SWIFT's ``get_choices_list``: the rank paths of the tree over a chain whose rows had top-1
    probabilities ``probs``."""
    candidates = (1, 3, 5, 10) if sampling else (3, 5, 8, 10)
    out: list[list[int]] = []
    for idx, p in enumerate(probs):
        k = candidates[0] if p > 0.95 else candidates[1] if p > 0.8 else candidates[2] if p > 0.5 else candidates[3]
        out.extend([0] * idx + [i] for i in range(k))
    return out


@dataclass
class SwiftTreeOptions(BudgetOptions):
    """Options of the ``swift`` policy.

    Attributes:
        budget: the largest tree, root included (SWIFT's own bound, ``1 + 10 * max_step_draft``,
            by default); a larger SWIFT tree keeps its first ``budget - 1`` rank paths.
        stop_threshold: the chain stops after a row whose top-1 probability is below it (0.8).
        max_step_draft: the most chain rows (25).
        sampling: SWIFT's candidate counts under sampling (1/3/5/10) instead of greedy (3/5/8/10).
    """

    budget: int = 1 + TOPK * 25
    stop_threshold: float = tunable(0.8, low=0.3, high=0.95)
    max_step_draft: int = tunable(25, low=2, high=32)
    sampling: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        require(0.0 <= self.stop_threshold <= 1.0, "stop_threshold", f"must be in [0, 1], got {self.stop_threshold!r}")
        require(isinstance(self.max_step_draft, int) and self.max_step_draft >= 1, "max_step_draft",
                f"must be an int >= 1, got {self.max_step_draft!r}")


class SwiftTreePolicy(TreePolicy):
    """SWIFT's confidence-stopped chain with top-k siblings (k by confidence)."""

    name = "swift"
    Options = SwiftTreeOptions

    @property
    def max_budget(self) -> int:
        """``budget``, at most the root plus ``TOPK`` children of each chain row."""
        return min(self.options.budget, 1 + TOPK * self.options.max_step_draft)

    def build(self, session: DraftSession, budget: int) -> DraftTree:
        """Draft the chain, then keep each row's top-k children; the first ``budget - 1`` rank
        paths in SWIFT's order (by length, then value) when the tree would be larger."""
        tree, node, rows = session.new_tree(), 0, []
        for step in range(self.options.max_step_draft):
            if len(tree) >= budget:
                break
            values, tokens, ranks = session.expand_top(tree, [node], TOPK)
            rows.append((node, values[0], tokens[0], ranks[0]))
            top1 = float(values[0, 0].exp())
            if top1 < self.options.stop_threshold or not bool(torch.isfinite(values[0, 0])):
                break
            tree = tree.add_nodes(torch.tensor([node]), tokens[0, :1], tree.logp[node] + values[0, :1], ranks[0, :1])
            node = len(tree) - 1
        probs = [float(row[1][0].exp()) for row in rows]
        # Children the drafter gives no probability are no candidates (a row with few finite entries).
        possible = [path for path in choices_list(probs, self.options.sampling)
                    if path[-1] < len(rows[len(path) - 1][1]) and bool(torch.isfinite(rows[len(path) - 1][1][path[-1]]))]
        kept = sorted(possible, key=lambda x: (len(x), x))[: budget - 1]
        return _siblings(tree, rows, kept)


def _siblings(tree: DraftTree, rows: list, kept: list[list[int]]) -> DraftTree:
    """``tree`` (the chain) cut to the kept chain nodes, plus the kept siblings of each row."""
    depth = max((len(path) for path in kept), default=0)
    chain = tree.select(torch.arange(depth + 1)) if len(tree) > depth + 1 else tree
    chain_len = len(chain)  # nodes 0 .. chain_len - 1 are the chain (node i at depth i)
    for idx, (parent, values, tokens, ranks) in enumerate(rows):
        if parent >= chain_len:
            break
        has_top1 = chain_len > idx + 1  # the chain went on through this row's top-1 child
        extra = [path[-1] for path in kept if len(path) == idx + 1 and (path[-1] > 0 or not has_top1)]
        if not extra:
            continue
        pick = torch.tensor(extra)
        chain = chain.add_nodes(torch.full((len(extra),), parent), tokens[pick], chain.logp[parent] + values[pick], ranks[pick])
    return chain
