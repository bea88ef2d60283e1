"""Verifier ``traversal``: Traversal Verification (Weng et al., NeurIPS 2025, arXiv 2505.12398).

Lossless like ``sampling`` (the emitted tokens are distributed as the warped target's samples),
but it verifies the tree leaf to root with sequence-level acceptance rates instead of root to
leaf token by token, so it accepts at least as many tokens on a chain (where it is Block
Verification, Sun et al., arXiv 2403.10444, the optimal valid chain verifier: the paper's
Theorem 3.4) and, in the paper's experiments, 2-6% more on trees.

The paper's Algorithm 3 (Section 3.1), with M_b the warped target and M_s the draft rows:

1. Every node X gets an acceptance rate: p(root) = 1 and, for a child X of A with token x,
   ``p(X) = min(1, p(A) * M_b(x|A) / M_s(x|A))`` (line 1).
2. Repeat (lines 3-15): take the first leaf of what is left of the tree (post-order DFS:
   children in tree order, a node only after all its children are gone) and accept it, and so
   the whole root path to it, iff ``eta < p(leaf)``. Else delete it and update its parent A by
   the paper's (1)-(3) (lines 10-12):

   - (1) ``M_b(.|A) <- norm([p(A) M_b(.|A) - M_s(.|A)]_+)``;
   - (2) ``M_s(.|A) <- norm(M_s(.|A) with x zeroed)`` for children drawn without replacement
     (recursive rejection sampling without replacement, the paper's setting); children drawn
     i.i.d. leave it unchanged, as Algorithm 2 (with replacement) does. On a chain, the only
     i.i.d. tree the built-in policies make, both read the same: a node's draft row is never
     used again once its only child is gone;
   - (3) ``p(A) <- S / (S + 1 - p(A))`` with ``S = sum_x [p(A) M_b(x|A) - M_s(x|A)]_+``;

   and recompute p of A's remaining descendants by step 1 (line 13).
3. The bonus token is drawn from M_b(.|last accepted node) as updated by then (line 16).

The root's rate stays exactly 1 (``S / (S + 0)``), so a step accepts the root (no drafted
token) only when every other node was rejected, and then draws the bonus from the usual
token-level residual.

Modes: the proof (Theorem 3.3, Definition 3.1) covers trees whose children were sampled from
the draft, i.i.d. or without replacement: ``tree.drafting`` ``iid`` and
``without_replacement``. ``deterministic`` (top-k / gated) trees are refused with a
``ValueError`` that points to the ``sampling`` verifier. As with ``sampling``, i.i.d. children
are meant one per node (a chain): a DraftTree cannot hold the duplicate siblings that i.i.d.
draws produce, and ``sampled-tree`` with ``replacement=True`` declares ``without_replacement``.

Vectorised form. A node's state (p, M_b, M_s) changes only when one of its children is
deleted, and the update reads only that state and the deleted child's token; a child's entry
rate reads only its parent's state after its earlier siblings were deleted. So, assuming every
node before it in post-order was rejected (the only way the walk can reach its test), the
rate every node is tested with comes out of ONE pass over the children in index order (a
parent precedes its children, siblings are in tree order): n - 1 steps, each vectorised over
draws and the vocabulary, a trip count the host knows without reading the device. The step
accepts the first node in post-order whose draw passes (the root always does); post-order
positions come from the ancestor mask in closed form. No host read happens inside ``verify``.

Randomness is drawn up front as in ``sampling``: ``u[i]`` (i >= 1) is node i's test (each
node is tested at most once) and ``u[0]`` draws the bonus token by inverse CDF, so the literal
walk :func:`specframe.testing.traversal_reference.traversal_reference` can be fed the same
numbers and must take the same decisions (tests/test_traversal_verifier.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import torch

from specframe.interfaces import Verifier
from specframe.tree import DRAFTING_MODES, DraftTree
from specframe.verifiers.sampling import SamplingOptions, inverse_cdf, proposals, sampling_inputs

#: Drafting modes Traversal Verification's losslessness proof covers (children sampled from
#: the draft, with or without replacement).
COVERED_MODES: tuple[str, ...] = ("iid", "without_replacement")


@dataclass
class TraversalOptions(SamplingOptions):
    """Options of the ``traversal`` verifier: the ``sampling`` verifier's, checked the same way.

    Attributes:
        temperature: target logits are divided by it; must be > 0 (greedy decoding:
            ``generate(temperature=0)``).
        top_k: keep the k most likely tokens (ties at the k-th logit kept); 0 = off.
        top_p: nucleus sampling (transformers' ``TopPLogitsWarper``); 1.0 = off.
        seed: when set, the verifier owns a ``torch.Generator`` seeded with it (one stream for
            the decoder's lifetime); a generator passed by the engine takes precedence.
    """


def check_drafting(tree: DraftTree) -> None:
    """Refuse a tree whose drafting mode Traversal Verification's proof does not cover.

    Unknown modes are left to :func:`~specframe.verifiers.sampling.proposals`, which names the
    valid ones.
    """
    if tree.drafting in DRAFTING_MODES and tree.drafting not in COVERED_MODES:
        raise ValueError(
            f"verifier 'traversal' is lossless only for children sampled from the draft (tree.drafting "
            f"'iid' or 'without_replacement'), but this tree's drafting is {tree.drafting!r}: verify it with "
            "verifier 'sampling', or draft with a sampling policy (chain with sample=True, sampled-tree)"
        )


# ---------------------------------------------------------------------------- one node's state
def entry_rate(p_parent: torch.Tensor, target_mass: torch.Tensor, draft_mass: torch.Tensor) -> torch.Tensor:
    """Algorithm 3, line 1 / 13: ``min(1, p(A) M_b(x|A) / M_s(x|A))`` for a child with token x.

    A token the draft gave no mass is accepted iff the target gives it some (the limit of the
    ratio), as in the ``sampling`` verifier; 0/0 is 0.
    """
    num = p_parent * target_mass
    ratio = num / torch.where(draft_mass > 0, draft_mass, 1.0)
    return torch.where(num >= draft_mass, (num > 0).to(num.dtype), ratio)


def delete_child(
    p: torch.Tensor, target: torch.Tensor, draft: torch.Tensor, token: torch.Tensor, without_replacement: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Algorithm 3, lines 11-12: a node's ``(p, M_b, M_s)`` after deleting its child ``token``.

    ``p`` is ``[S]``, ``target`` and ``draft`` are ``[S, V]``, ``token`` is ``[S, 1]``. Guards for
    float rounding only: a residual with no mass keeps the old row (its rate is then 0, or 1 at
    a node whose target equals its draft, where the exact algorithm never rejects a child), and
    ``S + 1 - p = 0`` keeps ``p`` (= 1).
    """
    residual = (p[:, None] * target - draft).clamp(min=0.0)  # (1), unnormalised
    mass = residual.sum(dim=-1)
    denominator = mass + (1.0 - p)
    new_p = torch.where(denominator > 0, mass / torch.where(denominator > 0, denominator, 1.0), p)  # (3)
    new_target = torch.where((mass > 0)[:, None], residual / torch.where(mass > 0, mass, 1.0)[:, None], target)
    if not without_replacement:
        return new_p, new_target, draft
    zeroed = draft.scatter(1, token, 0.0)  # (2)
    left = zeroed.sum(dim=-1, keepdim=True)
    return new_p, new_target, torch.where(left > 0, zeroed / torch.where(left > 0, left, 1.0), draft)


# ---------------------------------------------------------------------------- whole tree
def traversal_rates(
    tree: DraftTree, probs: torch.Tensor, tokens: torch.Tensor, draft_probs: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every node's acceptance rate at its test and its target row then, for S trees of one
    topology: ``(rates [S, n], targets [S, n, V])``, float64.

    "At its test" assumes every node before it in post-order was rejected, the only way the
    walk reaches it: all its descendants and its earlier siblings' subtrees (and those of its
    ancestors) are deleted. ``probs`` (warped target), ``draft_probs`` are ``[S, n, V]`` and
    ``tokens`` ``[S, n]``. The root's rate is 1. P(the step ends at node a) =
    ``rates[a] * prod(1 - rates[b] for b before a in post-order)``: the exact-expectation tests
    use that.
    """
    samples, n = tokens.shape
    without_replacement = tree.drafting == "without_replacement"
    rates = torch.zeros(samples, n, dtype=torch.float64, device=probs.device)
    rates[:, 0] = 1.0
    targets = probs.to(torch.float64).clone()
    drafts = draft_probs.to(torch.float64)
    drafts = drafts.clone() if without_replacement else drafts  # i.i.d.: rows never change
    parents = tree.parents.to(probs.device)
    tokens = tokens.to(probs.device)
    for child in range(1, n):  # index order: parents first, siblings in tree order
        parent = parents[child:child + 1]  # a 1-element index: no host read
        token = tokens[:, child:child + 1]
        p = rates.index_select(1, parent)[:, 0]
        target = targets.index_select(1, parent)[:, 0]
        draft = drafts.index_select(1, parent)[:, 0]
        rates[:, child] = entry_rate(p, target.gather(1, token)[:, 0], draft.gather(1, token)[:, 0])
        # The child's subtree never reads the parent again, so its deletion can be applied now:
        # later siblings (higher indices) and the parent's own test see it.
        p, target, draft = delete_child(p, target, draft, token, without_replacement)
        rates.index_copy_(1, parent, p[:, None])
        targets.index_copy_(1, parent, target[:, None])
        if without_replacement:
            drafts.index_copy_(1, parent, draft[:, None])
    return rates, targets


def post_order(tree: DraftTree) -> torch.Tensor:
    """``[n]`` long: each node's position in post-order DFS (children in tree order), the order
    Traversal Verification tests nodes in (the paper's Appendix E); the root is last (n - 1).

    Closed form: the nodes before i are its descendants (subtree size - 1) and the subtrees of
    the earlier siblings of i and of each of its ancestors.
    """
    n = len(tree)
    anc = tree.ancestor_mask().to(torch.float64)  # anc[i, a]: a is i or an ancestor of i
    size = anc.sum(dim=0)
    ids = torch.arange(n, device=tree.device)
    parents = tree.parents
    earlier_sibling = (parents[:, None] == parents[None, :]) & (ids[None, :] < ids[:, None])
    left_of = earlier_sibling.to(torch.float64) @ size  # nodes in earlier siblings' subtrees
    return (anc @ left_of + size - 1).round().to(torch.long)


def traversal_accept_batch(
    tree: DraftTree, probs: torch.Tensor, uniforms: torch.Tensor,
    tokens: torch.Tensor | None = None, draft_probs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decide S independent verifications at once; ``uniforms`` is ``[S, n]``.

    Same convention as :func:`~specframe.verifiers.sampling.sample_accept_batch`: the S trees
    share ``tree``'s topology and drafting mode; by default they are all ``tree``, or each has
    its own ``tokens`` [S, n], target ``probs`` [S, n, V] (else [n, V], shared) and
    ``draft_probs`` [S, n, V]. Returns ``(last, bonus)``, each ``[S]``.
    """
    check_drafting(tree)
    samples, n = uniforms.shape
    vocab = probs.shape[-1]
    device = probs.device
    # Per-draw draft rows get the same checks as a single tree's (mode known, shape [n, V]).
    q = proposals(tree if draft_probs is None else replace(tree, draft_probs=draft_probs[0]), vocab)
    assert q is not None  # check_drafting refused deterministic trees
    q = (q if draft_probs is None else draft_probs).to(device, torch.float64).expand(samples, n, vocab)
    probs = probs.to(torch.float64).expand(samples, n, vocab)
    tokens = (tree.tokens if tokens is None else tokens).to(device).expand(samples, n)
    uniforms = uniforms.to(device, torch.float64)
    rates, targets = traversal_rates(tree, probs, tokens, q)
    passes = uniforms < rates
    passes[:, 0] = True  # the root's rate is exactly 1: it needs no draw
    order = post_order(tree).to(device)
    last = torch.where(passes, order, n).argmin(dim=1)  # first passing node in post-order
    draw = torch.arange(samples, device=device)
    return last, inverse_cdf(targets[draw, last], uniforms[:, 0])


# ---------------------------------------------------------------------------- plugin
class TraversalVerifier(Verifier):
    """Lossless in distribution, leaf-to-root with sequence-level acceptance (module doc)."""

    name = "traversal"
    Options = TraversalOptions
    lossless = True
    sampling = True
    #: The ``tree.drafting`` modes it verifies; any other raises ``ValueError``.
    drafting_modes: ClassVar[tuple[str, ...]] = COVERED_MODES

    def __init__(self, options: TraversalOptions) -> None:
        super().__init__(options)
        self.generator = None if options.seed is None else torch.Generator().manual_seed(int(options.seed))

    def verify(
        self, tree: DraftTree, target_logits: torch.Tensor, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Warp the target logits, draw ``len(tree)`` uniforms and decide on the device
        (:func:`traversal_accept_batch` with one draw).

        Randomness: ``generator`` if given, else the verifier's own (``seed`` option), else
        torch's global generator. Raises ``ValueError`` for a ``deterministic`` tree.
        """
        check_drafting(tree)  # before any draw, so a refused tree consumes no randomness
        gen = generator if generator is not None else self.generator
        probs, uniforms = sampling_inputs(tree, target_logits, self.options, gen)
        last, bonus = traversal_accept_batch(tree, probs, uniforms.reshape(1, -1))
        return last[0], bonus[0]
