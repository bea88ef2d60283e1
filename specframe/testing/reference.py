"""Obviously-correct host references for verification, to test fast verifiers against.

The built-in verifiers decide a whole tree at once on the device and return only the deepest
accepted node and the bonus token (:meth:`specframe.Verifier.verify`). That is fast and hard to
read, so each has a literal walk from the root here, in plain Python, and property tests hold
the vectorised version to it (tests/test_greedy.py, tests/test_sampling_verifier.py; a plugin
author does the same for their own verifier):

* :func:`greedy_walk`: follow the target's argmax child by child;
* :func:`sample_accept_reference`: the acceptance table of docs/verifiers.md, sibling by sibling;
* :class:`GreedyReferenceVerifier` / :class:`SamplingReferenceVerifier`: those walks as
  verifier instances the engine can run (``SpecDecoder.build(verifier=Sampling...(options))``),
  for end-to-end comparisons; they read the device at every node, so they are slow on a GPU;
* :class:`Verdict`, :func:`decide` and :func:`read_verdict`: the decision as a host-side
  record (the whole accepted path), and the engine's per-step record rebuilt from it, the
  reference for :func:`specframe.decode.read.read_step`'s one packed read.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specframe.decode.contract import checked_decision
from specframe.interfaces import Verifier
from specframe.decode.read import StepRead
from specframe.tree import DraftTree
from specframe.verifiers.sampling import SamplingVerifier, proposals, sampling_inputs


@dataclass
class Verdict:
    """A verification's outcome on the host: accepted node indices (root first) and the bonus token."""

    accepted_path: torch.Tensor
    bonus_token: int

    @classmethod
    def from_leaf(cls, tree: DraftTree, last: torch.Tensor | int, bonus: torch.Tensor | int) -> "Verdict":
        """The verdict whose path runs from the root to node ``last`` (reads back to the host)."""
        path = torch.nonzero(tree.ancestor_mask()[int(last)]).flatten().cpu()  # topological = root..last
        return cls(accepted_path=path, bonus_token=int(bonus))

    def leaf(self, tree: DraftTree) -> tuple[torch.Tensor, torch.Tensor]:
        """This verdict as :meth:`Verifier.verify` returns it: ``(last, bonus)``, 0-dim long
        tensors on ``tree.device``."""
        last = torch.as_tensor(self.accepted_path)[-1]
        return (last.to(tree.device, torch.long),
                torch.tensor(int(self.bonus_token), dtype=torch.long, device=tree.device))


def decide(verifier: Verifier, tree: DraftTree, target_logits: torch.Tensor,
           generator: torch.Generator | None = None) -> Verdict:
    """Run ``verifier.verify`` and read its decision back as a :class:`Verdict`.

    Checks the return convention on the way, as the strict engine does
    (:func:`specframe.decode.contract.checked_decision`): two 0-dim integer tensors on ``tree.device``,
    a node of the tree and a token of the logits' vocabulary.
    """
    out = checked_decision(verifier.name, tree, verifier.verify(tree, target_logits, generator),
                           target_logits.shape[-1], strict=True)
    return Verdict.from_leaf(tree, *out)


def read_verdict(tree: DraftTree, verdict: Verdict) -> StepRead:
    """:func:`specframe.decode.read.read_step`'s record, built from a host-side verdict with
    plain indexing (several small reads)."""
    path = torch.as_tensor(verdict.accepted_path).to(tree.device)
    nodes = path.tolist()
    return StepRead(ok=True, path=path, tokens=tree.tokens[path[1:]].tolist() + [int(verdict.bonus_token)],
                    ranks=tree.ranks[path[1:]].tolist(), widths=tree.width_per_depth(),
                    contiguous=nodes == list(range(len(nodes))), children=len(tree.children(nodes[-1])))


# ---------------------------------------------------------------------------- greedy
def greedy_walk(tree: DraftTree, logits: torch.Tensor) -> tuple[list[int], int]:
    """Literal greedy verification: accepted node path (root first) and the bonus token."""
    argmax = logits.argmax(dim=-1).tolist()
    tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
    path = [0]
    while True:
        nxt = [i for i in range(len(tokens)) if parents[i] == path[-1] and tokens[i] == argmax[path[-1]]]
        if not nxt:
            return path, argmax[path[-1]]
        path.append(nxt[0])


class GreedyReferenceVerifier(Verifier):
    """:func:`greedy_walk` as a verifier (not registered; pass an instance)."""

    name = "greedy-reference"
    lossless = True
    sampling = False

    def verify(
        self, tree: DraftTree, target_logits: torch.Tensor, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Walk the argmax from the root on the host."""
        path, bonus = greedy_walk(tree, target_logits)
        return Verdict(torch.tensor(path), bonus).leaf(tree)


# ---------------------------------------------------------------------------- sampling
def sample_accept_reference(tree: DraftTree, probs: torch.Tensor, uniforms: torch.Tensor) -> Verdict:
    """Slow, literal walk of the acceptance table in docs/verifiers.md, given warped target
    ``probs`` [n, V] and ``uniforms`` [n] (u[0]: the bonus draw, u[i]: node i's test); the
    reference for ``specframe.verifiers.sampling.sample_accept_batch``."""
    mode = tree.drafting
    q_all = proposals(tree, probs.shape[1])
    tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
    u = [float(x) for x in uniforms.tolist()]
    node, path = 0, [0]
    while True:
        R = [float(x) for x in probs[node].tolist()]  # fresh target distribution at this node
        q = None if q_all is None else [float(x) for x in q_all[node].tolist()]
        next_node = None
        for child in [i for i in range(len(tokens)) if parents[i] == node]:  # tree order
            c = tokens[child]
            if mode == "deterministic":
                accept_probability = R[c]
            elif q[c] > 0:
                accept_probability = min(1.0, R[c] / q[c])
            else:
                accept_probability = 1.0 if R[c] > 0 else 0.0
            if u[child] < accept_probability:
                next_node = child
                break
            if mode == "deterministic":
                new_R = list(R)
                new_R[c] = 0.0
            else:
                new_R = [max(0.0, r - p) for r, p in zip(R, q)]
            if sum(new_R) > 0:
                R = [r / sum(new_R) for r in new_R]
            if mode == "without_replacement":
                new_q = list(q)
                new_q[c] = 0.0
                if sum(new_q) > 0:
                    q = [p / sum(new_q) for p in new_q]
        if next_node is None:
            return Verdict(accepted_path=torch.tensor(path, dtype=torch.long), bonus_token=inverse_cdf_draw(R, u[0]))
        node = next_node
        path.append(node)


def inverse_cdf_draw(dist: list[float], u: float) -> int:
    """Inverse-CDF draw from an unnormalised list (first token whose running mass exceeds u*total)."""
    target = u * sum(dist)
    running = 0.0
    for token, mass in enumerate(dist):
        running += mass
        if running > target:
            return token
    return max(t for t, mass in enumerate(dist) if mass > 0)


class SamplingReferenceVerifier(SamplingVerifier):
    """The ``sampling`` verifier running :func:`sample_accept_reference` (not registered; pass
    an instance). Same options and randomness: from the same generator state it takes the
    same decisions as :class:`~specframe.verifiers.sampling.SamplingVerifier`."""

    name = "sampling-reference"

    def verify(
        self, tree: DraftTree, target_logits: torch.Tensor, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Draw exactly as the fast verifier does, then walk the table on the host."""
        gen = generator if generator is not None else self.generator
        probs, uniforms = sampling_inputs(tree, target_logits, self.options, gen)
        return sample_accept_reference(tree, probs, uniforms).leaf(tree)
