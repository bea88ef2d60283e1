"""Verifier ``sampling``: lossless tree speculative sampling (temperature, top-k, top-p).

The emitted tokens are distributed exactly as sampling from the target with the same warping
(``generate(do_sample=True, temperature=..., top_k=..., top_p=...)``), whatever the tree, as long
as the tree says how its children were drafted (``tree.drafting``) and, for sampled children,
carries the draft distributions they were drawn from (``tree.draft_probs``).

One rule covers the three drafting modes (speculative sampling: Leviathan et al., arXiv 2211.17192;
i.i.d. children: SpecInfer, arXiv 2305.09781; children drawn without replacement: recursive
speculative decoding, arXiv 2402.14160; deterministic top-k / gated children: EAGLE-2,
arXiv 2406.16858, and Sequoia, arXiv 2402.12374; docs/verifiers.md has the table). At an accepted node
with residual R, the i-th child c_i was proposed from a distribution q_i and is accepted iff
``u_i * q_i(c_i) < R(c_i)`` (probability min(1, R/q)); on rejection ``R = norm(max(0, R - q_i))``:

- ``iid``: q_i = q, the node's draft distribution;
- ``without_replacement``: q_1 = q, q_(i+1) = q_i with c_i zeroed and renormalised;
- ``deterministic``: q_i = one-hot(c_i), so the test is ``u_i < R(c_i)`` and the update zeroes
  c_i (R(c_i) <= 1) -- exactly the top-k / gated rule of the table.

Randomness is drawn up front as ``len(tree)`` uniforms: ``u[i]`` (i >= 1) is node i's
acceptance draw and ``u[0]`` (the root needs no test) picks the bonus token by inverse CDF.
Each node is tested at most once, so the draws are independent where they are used, and the
vectorised verifier here and the literal walk ``specframe.testing.reference.sample_accept_reference``
can be fed the same numbers and must then take the same decisions (tests/test_sampling_verifier.py).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from specframe import rng
from specframe.interfaces import Verifier
from specframe.options import require
from specframe.tree import DRAFTING_MODES, DraftTree


@dataclass
class SamplingOptions:
    """Options of the ``sampling`` verifier (transformers' generate semantics).

    Attributes:
        temperature: target logits are divided by it; must be > 0 (for greedy use the
            ``greedy`` verifier or ``generate(temperature=0)``).
        top_k: keep the k most likely tokens (ties at the k-th logit kept); 0 = off.
        top_p: nucleus sampling: keep the smallest set of most likely tokens whose mass
            reaches top_p; 1.0 = off.
        seed: when set, the verifier owns a ``torch.Generator`` seeded with it (one stream for
            the decoder's lifetime); a generator passed by the engine takes precedence.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        require(
            math.isfinite(self.temperature) and self.temperature > 0, "temperature",
            f"must be a finite number > 0, got {self.temperature} (for greedy decoding use "
            "verifier 'greedy' or generate(temperature=0))",
        )
        require(self.top_k >= 0, "top_k", f"must be >= 0 (0 = off), got {self.top_k}")
        require(0.0 <= self.top_p <= 1.0, "top_p", f"must be in [0, 1] (1.0 = off), got {self.top_p}")


class MissingDraftProbsError(ValueError):
    """A tree with sampled children carries no (or mis-shaped) draft distributions."""


# ---------------------------------------------------------------------------- warping
def warp_logits(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Apply temperature, then top-k, then top-p to ``[..., V]`` logits, as transformers does.

    Same order and tie rules as ``TemperatureLogitsWarper``, ``TopKLogitsWarper`` and
    ``TopPLogitsWarper`` with ``min_tokens_to_keep=1``; removed tokens get ``-inf``.
    """
    scores = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if temperature != 1.0:
        scores = scores / temperature
    if top_k > 0:
        kth = torch.topk(scores, min(int(top_k), scores.shape[-1]), dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, -math.inf)
    if top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=False)
        cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        remove_sorted = cumulative <= (1 - top_p)
        remove_sorted[..., -1:] = False  # the most likely token always stays
        remove = remove_sorted.scatter(-1, order, remove_sorted)
        scores = scores.masked_fill(remove, -math.inf)
    return scores


def target_probs(logits: torch.Tensor, options: SamplingOptions) -> torch.Tensor:
    """Warped target distribution ``[n, V]`` in float64 (decisions are made in float64)."""
    warped = warp_logits(logits, options.temperature, options.top_k, options.top_p)
    return torch.softmax(warped.to(torch.float64), dim=-1)


# ---------------------------------------------------------------------------- shared pieces
def proposals(tree: DraftTree, vocab_size: int) -> torch.Tensor | None:
    """The tree's draft distributions as float64 ``[n, V]``, or None for deterministic trees.

    Raises :class:`MissingDraftProbsError` when a sampled tree lacks them or they mis-shape.
    """
    if tree.drafting not in DRAFTING_MODES:
        raise ValueError(f"tree.drafting is {tree.drafting!r}; valid modes: {', '.join(DRAFTING_MODES)}")
    if tree.drafting == "deterministic":
        return None
    q = tree.draft_probs
    if q is None:
        raise MissingDraftProbsError(
            f"tree.drafting is {tree.drafting!r} but tree.draft_probs is None: a policy that samples "
            "children must record, for every expanded node u, the draft distribution q its children "
            "were drawn from (row u of tree.draft_probs)"
        )
    if tuple(q.shape) != (len(tree), vocab_size):
        raise MissingDraftProbsError(
            f"tree.draft_probs has shape {tuple(q.shape)}, expected ({len(tree)}, {vocab_size}) = "
            "(tree nodes, target vocabulary)"
        )
    return q.to(torch.float64)


def inverse_cdf(dist: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Tokens ``[S]`` drawn from the rows of ``dist`` [S, V] (unnormalised) with uniforms ``u`` [S].

    Each is the first token whose cumulative mass exceeds ``u * total``; never a zero-mass token.
    """
    cdf = dist.cumsum(dim=-1)
    token = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)[:, 0]
    ids = torch.arange(dist.shape[-1], device=dist.device)
    last_positive = torch.where(dist > 0, ids, -1).max(dim=-1).values
    return torch.minimum(token, last_positive)


def sibling_ranks(parents: torch.Tensor) -> torch.Tensor:
    """Order of each node among its siblings (0 = first child in tree order); -1 at the root."""
    n = parents.shape[0]
    ranks = torch.full((n,), -1, dtype=torch.long, device=parents.device)
    if n > 1:
        child_parents = parents[1:]
        order = torch.argsort(child_parents, stable=True)  # grouped by parent, tree order inside
        grouped = child_parents[order]
        first = torch.searchsorted(grouped, grouped)  # start of each node's sibling group
        ranks[1 + order] = torch.arange(n - 1, device=parents.device) - first
    return ranks


def _renormalise(rows: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """Rows scaled to sum 1; a row with no mass left keeps ``fallback`` (a float-rounding guard:
    after a rejection the exact residual always has positive mass)."""
    total = rows.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, rows / total.clamp(min=torch.finfo(rows.dtype).tiny), fallback)


# ---------------------------------------------------------------------------- decision
def sampling_inputs(
    tree: DraftTree, target_logits: torch.Tensor, options: SamplingOptions, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """What one verification decides from: the warped target distribution ``[n, V]`` (float64)
    and ``len(tree)`` uniforms from ``generator`` (None: torch's global one), u[0] for the
    bonus token and u[i] for node i. Reference verifiers draw through this too, so that with
    the same generator state they see the same numbers as :class:`SamplingVerifier`."""
    probs = target_probs(target_logits, options)
    return probs, rng.uniforms(len(tree), generator, probs.device)


def sample_accept_batch(
    tree: DraftTree, probs: torch.Tensor, uniforms: torch.Tensor,
    tokens: torch.Tensor | None = None, draft_probs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decide S independent verifications at once; ``uniforms`` is ``[S, n]``.

    The S trees share ``tree``'s topology (parents) and drafting mode; by default they are all
    ``tree`` itself, or each has its own ``tokens`` [S, n], target ``probs`` [S, n, V] (else
    [n, V], shared) and ``draft_probs`` [S, n, V]. Returns ``(last, bonus)``, each ``[S]``: the
    deepest accepted node and the bonus token. The engine uses S = 1; larger S gives Monte-Carlo
    acceptance estimates (and the distribution tests) without a Python loop per draw.

    A node's decision (which child it accepts, or its final residual) depends only on its own
    target row, draft row, children and their draws -- never on how the walk reached it, since
    R restarts from the fresh target distribution at every accepted node. So every node is
    decided at once; the walk then follows accepted-child pointers from the root.
    """
    samples, n = uniforms.shape
    vocab = probs.shape[-1]
    probs = probs.to(torch.float64).expand(samples, n, vocab)
    device = probs.device
    uniforms = uniforms.to(device, torch.float64)
    tokens = (tree.tokens if tokens is None else tokens).to(device).expand(samples, n)
    # Per-draw draft rows get the same checks as a single tree's (mode known, shape [n, V]).
    q = proposals(tree if draft_probs is None else dataclasses.replace(tree, draft_probs=draft_probs[0]), vocab)
    if q is not None and draft_probs is not None:
        q = draft_probs.to(torch.float64)
    parents = tree.parents.to(device)
    if q is None:
        accepted_child = _decide_deterministic(parents, tokens, probs, uniforms)
    else:
        q = q.to(device).expand(samples, n, vocab)
        accepted_child, residual = _decide_sampled(parents, tokens, probs, q, uniforms, tree.drafting)
    last = _deepest_accepted(tree, parents, accepted_child)
    draw = torch.arange(samples, device=device)
    if q is None:
        # Every child of the last node was rejected: R = its target row with those tokens zeroed.
        is_child = torch.zeros(samples, n, vocab, dtype=torch.bool, device=device)
        is_child[draw[:, None], parents[None, 1:], tokens[:, 1:]] = True
        final = _renormalise(probs[draw, last].masked_fill(is_child[draw, last], 0.0), probs[draw, last])
    else:
        final = residual[draw, last]
    return last, inverse_cdf(final, uniforms[:, 0])


def _deepest_accepted(tree: DraftTree, parents: torch.Tensor, accepted_child: torch.Tensor) -> torch.Tensor:
    """``[S]`` end of the walk: a node is on the accepted path iff it and each of its non-root
    ancestors is its parent's accepted child (counted with one matmul against the ancestor mask)."""
    samples, n = accepted_child.shape
    ids = torch.arange(n, device=parents.device)
    chosen = accepted_child.gather(1, parents.clamp(min=0).expand(samples, n)) == ids
    chosen[:, 0] = True
    anc = tree.ancestor_mask().to(parents.device, torch.float32)
    off_path = (~chosen).to(torch.float32) @ anc.T  # number of unchosen nodes on each root path
    depths = tree.depths.to(parents.device)
    return torch.where(off_path == 0, depths, -1).argmax(dim=-1)


def _decide_deterministic(parents: torch.Tensor, tokens: torch.Tensor, probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Accepted child ``[S, n]`` of every node (-1: none) for deterministic children, in closed form.

    After rejecting the earlier siblings, R(c_i) = P(c_i) / (1 - mass of earlier siblings), so
    ``u_i < R(c_i)`` becomes ``u_i * (1 - before_i) < P(c_i)``: no loop over siblings.
    """
    samples, n = uniforms.shape
    if n == 1:
        return torch.full((samples, 1), -1, dtype=torch.long, device=probs.device)
    child_parents = parents[1:]
    mass = probs[:, child_parents].gather(2, tokens[:, 1:, None])[..., 0]  # [S, n-1]: P_parent(child)
    order = torch.argsort(child_parents, stable=True)  # sibling groups, tree order inside
    grouped_parents, grouped_mass = child_parents[order], mass[:, order]
    inclusive = grouped_mass.cumsum(dim=1)
    group_start = torch.searchsorted(grouped_parents, grouped_parents)
    before_group = torch.where(group_start > 0, inclusive[:, (group_start - 1).clamp(min=0)], 0.0)
    before = torch.empty_like(mass)
    before[:, order] = inclusive - grouped_mass - before_group
    accept = uniforms[:, 1:] * (1.0 - before) < mass
    node_ids = torch.arange(1, n, device=probs.device).expand(samples, n - 1)
    first = torch.full((samples, n), n, dtype=torch.long, device=probs.device)
    first.scatter_reduce_(1, child_parents.expand(samples, n - 1), torch.where(accept, node_ids, n), reduce="amin")
    return torch.where(first < n, first, -1)


def _decide_sampled(
    parents: torch.Tensor, tokens: torch.Tensor, probs: torch.Tensor, q: torch.Tensor,
    uniforms: torch.Tensor, mode: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Accepted child ``[S, n]`` and final residual ``[S, n, V]`` of every node for i.i.d. /
    without-replacement children.

    The residual update is sequential over siblings, so this loops over sibling rank (the
    widest node's child count), vectorised over draws, nodes and the vocabulary.
    """
    samples, n = uniforms.shape
    draw = torch.arange(samples, device=probs.device)[:, None]
    residual = probs.clone()
    # i.i.d. proposals never change; without replacement each draw zeroes its own copy.
    proposal = q.clone() if mode == "without_replacement" else q
    accepted_child = torch.full((samples, n), -1, dtype=torch.long, device=probs.device)
    # One read of the sibling ranks; parents that already accepted a child stay masked by
    # ``live``, so looping over every rank (no early exit) decides the same without more reads.
    by_rank: list[list[int]] = []
    for node, rank in enumerate(sibling_ranks(parents).tolist()):
        if rank >= 0:
            by_rank.extend([] for _ in range(rank + 1 - len(by_rank)))
            by_rank[rank].append(node)
    for group in by_rank:
        kids = torch.tensor(group, dtype=torch.long).to(probs.device)
        par, tok = parents[kids], tokens[:, kids]  # each parent has at most one child per rank
        live = accepted_child[:, par] < 0  # [S, m]: parents still testing children
        accept = live & (uniforms[:, kids] * proposal[draw, par, tok] < residual[draw, par, tok])
        accepted_child[:, par] = torch.where(accept, kids, accepted_child[:, par])
        reject = (live & ~accept)[..., None]
        old = residual[:, par]
        residual[:, par] = torch.where(reject, _renormalise((old - proposal[:, par]).clamp(min=0.0), old), old)
        if mode == "without_replacement":
            old_q = proposal[:, par]
            zeroed = old_q.clone()
            zeroed[draw, torch.arange(len(par), device=probs.device)[None, :], tok] = 0.0
            proposal[:, par] = torch.where(reject, _renormalise(zeroed, old_q), old_q)
    return accepted_child, residual


# ---------------------------------------------------------------------------- plugin
class SamplingVerifier(Verifier):
    """Lossless in distribution: emits tokens distributed as the warped target's samples."""

    name = "sampling"
    Options = SamplingOptions
    lossless = True
    sampling = True

    def __init__(self, options: SamplingOptions) -> None:
        super().__init__(options)
        self.generator = None if options.seed is None else torch.Generator().manual_seed(int(options.seed))

    def verify(
        self, tree: DraftTree, target_logits: torch.Tensor, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Warp the target logits, draw ``len(tree)`` uniforms and decide every node at once on
        the device (:func:`sample_accept_batch` with one draw).

        Randomness: ``generator`` if given, else the verifier's own (``seed`` option), else
        torch's global generator.
        """
        gen = generator if generator is not None else self.generator
        probs, uniforms = sampling_inputs(tree, target_logits, self.options, gen)
        last, bonus = sample_accept_batch(tree, probs, uniforms.reshape(1, -1))
        return last[0], bonus[0]
