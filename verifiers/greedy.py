"""Verifier ``greedy``: accept the drafted path that follows the target's argmax."""

from __future__ import annotations

import torch

from specframe.interfaces import Verdict, Verifier
from specframe.tree import DraftTree


def greedy_accept(tree: DraftTree, target_logits: torch.Tensor) -> Verdict:
    """Vectorised greedy verification.

    A node is on the accepted path iff every node on its root path (root excluded) carries
    the target's argmax at its parent. Siblings have distinct tokens, so accepted nodes form
    one path; its deepest node's argmax is the bonus token. The slow, literal reference is
    ``specframe.testing.harness.greedy_walk`` (property-tested against this in tests/test_greedy.py).
    """
    argmax = target_logits.argmax(dim=-1).to(tree.device)
    match = tree.tokens == argmax[tree.parents.clamp(min=0)]
    match[0] = True
    anc = tree.ancestor_mask()
    accepted = (anc & ~match[None, :]).sum(dim=1) == 0
    depth = torch.where(accepted, tree.depths, torch.full_like(tree.depths, -1))
    last = int(depth.argmax())
    path = torch.nonzero(anc[last]).flatten()  # ancestors in topological order = root..last
    return Verdict(accepted_path=path, bonus_token=int(argmax[last]))


class GreedyVerifier(Verifier):
    """Lossless with respect to greedy decoding of the target."""

    name = "greedy"
    lossless = True
    sampling = False

    def verify(self, tree: DraftTree, target_logits: torch.Tensor, generator=None) -> Verdict:
        """Follow the target's argmax down the tree."""
        return greedy_accept(tree, target_logits)
