"""An obviously-correct host reference for the ``traversal`` verifier (Traversal Verification).

:func:`traversal_reference` is the paper's Algorithm 3 (Weng et al., NeurIPS 2025, arXiv
2505.12398, Section 3.1) written out literally, in plain Python on one tree: delete rejected
leaves one at a time, update the parent by the paper's (1)-(3) and recompute the acceptance
rates below it. It is slow and exists so that the vectorised
:func:`specframe.verifiers.traversal.traversal_accept_batch` can be held to it on the same
random numbers (tests/test_traversal_verifier.py). :class:`TraversalReferenceVerifier` runs it
inside the engine (pass an instance as ``verifier=``).
"""

from __future__ import annotations

import torch

from specframe.testing.reference import Verdict, inverse_cdf_draw
from specframe.tree import DraftTree
from specframe.verifiers.sampling import proposals, sampling_inputs
from specframe.verifiers.traversal import TraversalVerifier, check_drafting


def traversal_reference(tree: DraftTree, probs: torch.Tensor, uniforms: torch.Tensor) -> Verdict:
    """Algorithm 3 on ``tree`` given the warped target ``probs`` [n, V] and ``uniforms`` [n]:
    ``u[i]`` is node i's test (eta of line 5; each node is tested at most once) and ``u[0]``
    draws the bonus token by inverse CDF (line 16)."""
    check_drafting(tree)
    without_replacement = tree.drafting == "without_replacement"
    tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
    n = len(tokens)
    u = [float(x) for x in uniforms.tolist()]
    target = [[float(x) for x in row] for row in probs.tolist()]  # M_b(.|X_i), updated in place
    q = proposals(tree, probs.shape[1])
    draft = [[float(x) for x in row] for row in q.tolist()]  # M_s(.|X_i), updated in place
    children = [[j for j in range(n) if parents[j] == i] for i in range(n)]  # tree order
    deleted = [False] * n

    # Lines 1-2: acceptance rates from the root down (index order is topological).
    rate = [1.0] + [0.0] * (n - 1)
    for node in range(1, n):
        rate[node] = _entry_rate(rate[parents[node]], target[parents[node]], draft[parents[node]], tokens[node])

    while True:  # line 3
        # Line 4: the first chain runs from the root to the first leaf of what is left.
        leaf = 0
        while any(not deleted[c] for c in children[leaf]):
            leaf = next(c for c in children[leaf] if not deleted[c])
        if leaf == 0:
            # Only the root is left. Its rate starts at 1 and (3) keeps it there (S / (S + 0)),
            # so its test always passes: accept it without spending a draw.
            assert rate[0] == 1.0, rate[0]
            return Verdict(torch.tensor([0]), inverse_cdf_draw(target[0], u[0]))
        if u[leaf] < rate[leaf]:  # lines 5-8: accept the whole chain, draw the bonus (line 16)
            return Verdict(torch.tensor(tree.path_to(leaf)), inverse_cdf_draw(target[leaf], u[0]))
        # Lines 10-12: delete the leaf; residual (1), draft (2) and rate (3) of its parent.
        deleted[leaf] = True
        parent = parents[leaf]
        p = rate[parent]
        residual = [max(p * b - s, 0.0) for b, s in zip(target[parent], draft[parent])]
        mass = sum(residual)
        denominator = mass + (1.0 - p)
        rate[parent] = mass / denominator if denominator > 0 else p
        if mass > 0:  # else the rate is 0 (or 1 with target == draft) and the row is never used
            target[parent] = [r / mass for r in residual]
        if without_replacement:
            zeroed = list(draft[parent])
            zeroed[tokens[leaf]] = 0.0
            if sum(zeroed) > 0:
                draft[parent] = [s / sum(zeroed) for s in zeroed]
        # Line 13: the rates of every chain below the parent that is left, from the top down.
        stack = [c for c in children[parent] if not deleted[c]]
        while stack:
            node = stack.pop()
            up = parents[node]
            rate[node] = _entry_rate(rate[up], target[up], draft[up], tokens[node])
            stack.extend(c for c in children[node] if not deleted[c])


def _entry_rate(p_parent: float, target: list[float], draft: list[float], token: int) -> float:
    """``min(1, p(A) M_b(x|A) / M_s(x|A))``; a token without draft mass is accepted iff the
    target gives it some (0/0 = 0)."""
    num, den = p_parent * target[token], draft[token]
    if num >= den:
        return 1.0 if num > 0 else 0.0
    return num / den


class TraversalReferenceVerifier(TraversalVerifier):
    """The ``traversal`` verifier running :func:`traversal_reference` (not registered; pass an
    instance). Same options and randomness: from the same generator state it takes the same
    decisions as :class:`~specframe.verifiers.traversal.TraversalVerifier`."""

    name = "traversal-reference"

    def verify(
        self, tree: DraftTree, target_logits: torch.Tensor, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Draw exactly as the fast verifier does, then run Algorithm 3 on the host."""
        check_drafting(tree)
        gen = generator if generator is not None else self.generator
        probs, uniforms = sampling_inputs(tree, target_logits, self.options, gen)
        return traversal_reference(tree, probs, uniforms).leaf(tree)
