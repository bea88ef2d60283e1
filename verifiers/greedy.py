"""Verifier ``greedy``: accept the drafted path that follows the target's argmax."""

from __future__ import annotations

import torch

from specframe.interfaces import Verifier
from specframe.models.row_argmax import row_argmax
from specframe.tree import DraftTree, HostLists


def greedy_leaf(tree: DraftTree, target_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Vectorised greedy verification, on the device: (deepest accepted node, bonus token).

    A node is on the accepted path iff every node on its root path (root excluded) carries
    the target's argmax at its parent. Siblings have distinct tokens, so accepted nodes form
    one path; its deepest node's argmax is the bonus token. The slow, literal reference is
    ``specframe.testing.reference.greedy_walk`` (property-tested against this in tests/test_greedy.py).
    """
    # row_argmax keeps argmax's tie rule (the first maximal index); float32 rows on the CPU
    # take specframe's native scan, a fraction of torch's index reduction.
    argmax = row_argmax(target_logits, fresh=True).to(tree.device)
    match = tree.tokens == argmax[tree.parents.clamp(min=0)]
    match[0] = True
    # Accepted: every ancestor-or-self matches (the mask implies the match, row by row).
    accepted = (tree.ancestor_mask() <= match).all(dim=1)
    # The accepted nodes have distinct depths; the others count as depth 0, so the argmax is the
    # deepest accepted node, or the root (index 0, the first of equal maxima) when none is.
    last = (tree.depths * accepted).argmax()
    return last, argmax[last]


def greedy_leaf_host(parents: list[int], tokens: list[int], argmax: list[int]) -> tuple[int, int]:
    """:func:`greedy_leaf` over host lists: a node is accepted iff its parent is and it carries
    the target's argmax at its parent (topological order: the parent is decided first); the
    accepted nodes form one path, whose deepest node is the last one accepted."""
    accepted = [True] + [False] * (len(parents) - 1)
    last = 0
    for i in range(1, len(parents)):
        parent = parents[i]
        if accepted[parent] and tokens[i] == argmax[parent]:
            accepted[i] = True
            last = i
    return last, argmax[last]


class GreedyVerifier(Verifier):
    """Lossless with respect to greedy decoding of the target."""

    name = "greedy"
    lossless = True
    sampling = False

    def verify(
        self, tree: DraftTree, target_logits: torch.Tensor, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Follow the target's argmax down the tree without leaving the device."""
        return greedy_leaf(tree, target_logits)

    def verdict_rows(self, tree: DraftTree, target_logits: torch.Tensor) -> torch.Tensor:
        """The target's argmax at every node, for :meth:`verify_host`."""
        return row_argmax(target_logits, fresh=True)

    def verify_host(self, tree: HostLists, rows: list[int]) -> tuple[int, int]:
        """:func:`greedy_leaf` on the host, from the argmax at every node."""
        return greedy_leaf_host(tree.parents, tree.tokens, rows)

    def root_tokens(self, root_logits: torch.Tensor,
                    generators: list[torch.Generator | None]) -> torch.Tensor:
        """Every root's argmax in one call (the tie rule of :func:`greedy_leaf`)."""
        return row_argmax(root_logits, fresh=True)
