"""Vectorised building blocks shared by the built-in tree policies."""

from __future__ import annotations

import torch


def topk_children(logp: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row top-k of draft log-probs ``[rows, V]``.

    Returns ``(values, token_ids, ranks)``, each ``[rows, k']`` with ``k' = min(k, V)``, sorted
    by descending probability; ranks are 0..k'-1. Ties break toward the lower token id so that
    identical drafter outputs always give identical trees.
    """
    k = min(int(k), logp.shape[-1])
    # torch.topk's tie order is unspecified; a stable descending sort is deterministic.
    values, tokens = torch.sort(logp, dim=-1, descending=True, stable=True)
    values, tokens = values[:, :k], tokens[:, :k]
    ranks = torch.arange(k, device=logp.device).expand_as(tokens)
    return values, tokens, ranks
