"""Verifier ``greedy``: accept the drafted path that follows the target's argmax."""

from __future__ import annotations

import torch

from specframe.interfaces import Verdict, Verifier
from specframe.tree import DraftTree


def greedy_accept(tree: DraftTree, target_logits: torch.Tensor) -> Verdict:
    """Vectorised greedy verification.

    A node is on the accepted path iff every node on its root path (root excluded) carries
    the target's argmax at its parent. Siblings have distinct tokens, so accepted nodes form
    one path; its deepest node's argmax is the bonus token.
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


def greedy_accept_reference(tree: DraftTree, target_logits: torch.Tensor) -> Verdict:
    """Slow, literal walk from the root (the reference the vectorised version is tested against)."""
    argmax = target_logits.argmax(dim=-1).tolist()
    tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
    path = [0]
    while True:
        nxt = [i for i in range(len(tokens)) if parents[i] == path[-1] and tokens[i] == argmax[path[-1]]]
        if not nxt:
            break
        path.append(nxt[0])
    return Verdict(accepted_path=torch.tensor(path), bonus_token=argmax[path[-1]])


class GreedyVerifier(Verifier):
    """Lossless with respect to greedy decoding of the target."""

    name = "greedy"
    lossless = True
    sampling = False

    def verify(self, tree: DraftTree, target_logits: torch.Tensor, generator=None) -> Verdict:
        """Follow the target's argmax down the tree."""
        return greedy_accept(tree, target_logits)
