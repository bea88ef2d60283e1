"""Policy ``sampled-tree``: k sampled children per node, layer by layer, up to depth d.

Children are drawn from the raw draft softmax q without replacement (SpecInfer-style stochastic
trees with distinct siblings); every layer is one batched draft forward over the whole frontier.
The tree records q at every expanded node and ``drafting="without_replacement"``, which the
``sampling`` verifier needs to stay lossless.

``replacement=True`` draws k children i.i.d. and merges duplicates into their first occurrence.
A DraftTree cannot hold two siblings with the same token, and the i.i.d. rule is only lossless
over the full sequence of draws (a rejected duplicate still shifts the residual), so the merged
tree is declared ``without_replacement`` instead: the first occurrences of i.i.d. draws, in
order, are distributed exactly as draws without replacement. (i.i.d. verification proper is
exercised by ``chain`` with ``sample=True``: one child per node never has duplicates.)
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from specframe.sampled_children import (
    dedup_first_occurrence, draft_distribution, rank_in_row, sample_iid, sample_without_replacement,
    session_generator,
)
from specframe.interfaces import DraftSession, TreePolicy
from specframe.options import BudgetOptions, require
from specframe.search_space import tunable
from specframe.tree import DraftTree


@dataclass
class SampledTreeOptions(BudgetOptions):
    """Options of the ``sampled-tree`` policy.

    Attributes:
        budget: largest tree, root included (a layer that would overflow keeps a prefix of
            each parent's draws, which is still a sample without replacement).
        k: children drawn per expanded node.
        depth: number of drafted layers (= draft forwards per step).
        replacement: draw the k children i.i.d. and merge duplicates (see the module doc).
        seed: seed of the policy's own ``torch.Generator`` (one stream for its lifetime); a
            generator the engine passes per call takes precedence; None uses torch's global one.
    """

    k: int = tunable(2, low=1, high=6)
    depth: int = tunable(4, low=1, high=8)
    replacement: bool = tunable(False, choices=(False, True))
    seed: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.k >= 1, "k", f"must be >= 1, got {self.k}")
        require(self.depth >= 1, "depth", f"must be >= 1, got {self.depth}")


class SampledTreePolicy(TreePolicy):
    """A stochastic tree: each frontier node gets k children sampled from the draft."""

    name = "sampled-tree"
    Options = SampledTreeOptions

    def __init__(self, options: SampledTreeOptions) -> None:
        super().__init__(options)
        self.generator = None if options.seed is None else torch.Generator().manual_seed(int(options.seed))

    def build(self, session: DraftSession, budget: int) -> DraftTree:
        """Grow ``depth`` sampled layers within ``budget`` nodes."""
        n_max = int(budget)
        generator = session_generator(session, self.generator)
        tree = session.new_tree()
        frontier = torch.zeros(1, dtype=torch.long, device=tree.device)
        expanded, drawn_from = [], []
        for _ in range(self.options.depth):
            room = n_max - len(tree)
            if room <= 0 or frontier.numel() == 0:
                break
            logp = session.expand(tree, frontier)
            q = draft_distribution(logp)
            tokens, keep = self._draw(q, generator)
            expanded.append(frontier)
            drawn_from.append(q)
            parents = frontier[:, None].expand_as(tokens)
            # Parent-major, draw order inside a parent: a cut keeps a prefix of each parent's draws.
            keep_at = torch.nonzero(keep.flatten()).flatten()[:room]
            if keep_at.numel() == 0:
                break
            ranks = rank_in_row(logp, tokens)
            cumulative = tree.logp[parents].to(logp.dtype) + torch.gather(logp, -1, tokens)
            first_new = len(tree)
            tree = tree.add_nodes(
                parents.flatten()[keep_at], tokens.flatten()[keep_at],
                cumulative.flatten()[keep_at], ranks.flatten()[keep_at],
            )
            frontier = torch.arange(first_new, len(tree), device=tree.device)
        probs = torch.zeros(len(tree), session.vocab_size, dtype=torch.float64, device=tree.device)
        if expanded:
            probs[torch.cat(expanded)] = torch.cat(drawn_from).to(tree.device)
        return replace(tree, draft_probs=probs, drafting="without_replacement")

    def _draw(self, q: torch.Tensor, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(tokens, keep)`` ``[rows, k']``: the children of each row in draw order."""
        if self.options.replacement:
            tokens = sample_iid(q, self.options.k, generator)
            return tokens, dedup_first_occurrence(tokens)
        return sample_without_replacement(q, self.options.k, generator)
