"""Sampled children for tree policies that draw instead of taking the top-k (``chain`` with
sample=True and ``sampled-tree`` use it).

Policies that sample children must record, for every expanded node, the exact distribution q
they drew from (``tree.draft_probs``), so q is computed once here in float64 and both the draw
and the record use the same numbers.
"""

from __future__ import annotations

import torch

from specframe.interfaces import DraftSession
from specframe.rng import on_generator, uniforms


def session_generator(session: DraftSession, own: torch.Generator | None) -> torch.Generator | None:
    """Randomness for this build: the engine's per-call generator, else the policy's own, else
    None (torch's global generator)."""
    given = getattr(session, "generator", None)
    return given if given is not None else own


def draft_distribution(logp: torch.Tensor) -> torch.Tensor:
    """The raw draft softmax q (no draft temperature) as float64 rows summing to 1."""
    q = logp.to(torch.float64).exp()
    return q / q.sum(dim=-1, keepdim=True)


def sample_iid(q: torch.Tensor, k: int, generator: torch.Generator | None) -> torch.Tensor:
    """``[rows, k]`` tokens drawn i.i.d. from each row of ``q`` (inverse CDF, never a zero-mass token)."""
    rows, vocab = q.shape
    cdf = q.cumsum(dim=-1)
    u = uniforms((rows, k), generator, q.device) * cdf[:, -1:]
    tokens = torch.searchsorted(cdf, u, right=True)
    positive = torch.arange(vocab, device=q.device).expand(rows, vocab).masked_fill(q <= 0, -1)
    return torch.minimum(tokens, positive.max(dim=-1, keepdim=True).values)


def sample_without_replacement(
    q: torch.Tensor, k: int, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``k`` distinct tokens per row of ``q`` in sequential draw order (exponential race).

    With E_t ~ Exp(1) i.i.d., sorting tokens by E_t / q_t ascending is distributed exactly as
    drawing from q, zeroing the draw, renormalising, and drawing again (the Gumbel-top-k trick
    with one random op and no logarithms, which dominate the cost at large vocabularies).
    Returns ``(tokens, valid)`` of shape ``[rows, min(k, V)]``; ``valid`` is False where a row
    has fewer than k tokens of positive mass.
    """
    k = min(int(k), q.shape[-1])
    race = on_generator(tuple(q.shape), generator).exponential_(generator=generator)
    keys = q / race.to(q.device).clamp(min=torch.finfo(torch.float64).tiny)  # larger = earlier
    top = torch.topk(keys, k, dim=-1, sorted=True)
    return top.indices, top.values > 0


def dedup_first_occurrence(tokens: torch.Tensor) -> torch.Tensor:
    """``[rows, k]`` bool: True at the first occurrence of each token in its row."""
    same = tokens[:, :, None] == tokens[:, None, :]
    earlier = torch.ones(tokens.shape[1], tokens.shape[1], dtype=torch.bool, device=tokens.device).tril(-1)
    return ~(same & earlier).any(dim=-1)


def rank_in_row(logp: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Rank of each chosen token among its row's candidates (0 = most likely; ties: lower id first)."""
    chosen = torch.gather(logp, -1, tokens)[:, :, None]
    ids = torch.arange(logp.shape[-1], device=logp.device)
    ahead = (logp[:, None, :] > chosen) | ((logp[:, None, :] == chosen) & (ids < tokens[:, :, None]))
    return ahead.sum(dim=-1)
