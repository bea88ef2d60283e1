"""Tie-correct selection helpers for tree policies (public: ``specframe.topk_per_row``).

The rule every built-in policy follows, and a third-party one should: higher score first,
then lower index (lower token id inside a row, lower flat / pool index across rows). With it,
identical drafter outputs always give identical trees, and because a child's cumulative score
never exceeds its parent's, any top-n of a pool in tree order is ancestor-closed. ``-inf`` and
NaN scores are never selectable.
"""

from __future__ import annotations

import math

import torch

__all__ = ["pad_top", "sparse_top", "top_indices", "topk_per_row"]


def topk_per_row(logp: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row top-k of draft log-probs ``[rows, V]`` that follows the documented tie rule.

    Use this rather than ``torch.topk``: ``torch.topk`` breaks ties in an unspecified order,
    so once ``ranks`` go into a tree (``DraftTree.add_nodes(..., ranks=)``) two equal drafter
    outputs could give different trees and rank histograms.

    Returns ``(values, token_ids, ranks)``, each ``[rows, k']`` with ``k' = min(k, V)``, sorted
    by descending probability; ranks are 0..k'-1. Ties break toward the lower token id so that
    identical drafter outputs always give identical trees. Entries may be ``-inf`` when a row
    has fewer than ``k'`` finite log-probs; callers mask those out.

    Cost is one ``torch.topk`` over the rows (a partial selection, not a sort of the whole
    vocabulary); only rows with a tie straddling the k-th place take a slower exact path.
    """
    rows, vocab = logp.shape
    k = min(int(k), vocab)
    ranks = torch.arange(k, device=logp.device).expand(rows, k)
    if k == 0 or rows == 0:
        empty = logp.new_empty(rows, k)
        return empty, empty.long(), ranks
    if k == vocab:
        values, tokens = torch.sort(logp, dim=-1, descending=True, stable=True)
        return values, tokens, ranks
    # One extra place tells whether the k-th value ties with something left outside.
    top = torch.topk(logp, k + 1, dim=-1, sorted=True)
    boundary_tie = top.values[:, k - 1] == top.values[:, k]
    values, tokens = _order_by_value_then_token(top.values[:, :k], top.indices[:, :k])
    # Rows with fewer than k finite entries (n-gram tables, fallback rows) tie at -inf; they
    # need only the lowest-id -inf entries, found among the first 2k ids, not a pass over the
    # whole vocabulary (which cost 0.85 ms a row at V = 49152, more than the n-gram lookup).
    if 2 * k <= vocab:
        short = boundary_tie & torch.isneginf(top.values[:, k - 1]) & ~torch.isnan(top.values).any(dim=-1)
    else:
        short = torch.zeros_like(boundary_tie)
    other = boundary_tie & ~short
    any_short, any_other = torch.stack([short.any(), other.any()]).tolist()  # one read
    if any_short or any_other:
        values, tokens = values.clone(), tokens.clone()
    if any_short:
        rows_short = torch.nonzero(short).flatten()
        values[rows_short], tokens[rows_short] = _fill_with_lowest_neginf(
            logp[rows_short, : 2 * k], values[rows_short], tokens[rows_short])
    if any_other:
        rows_tied = torch.nonzero(other).flatten()
        values[rows_tied], tokens[rows_tied] = _exact_topk_with_ties(logp[rows_tied], top.values[rows_tied, k - 1], k)
    return values, tokens, ranks


def _fill_with_lowest_neginf(head: torch.Tensor, values: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows whose top k hold every finite entry (ordered first) and some ``-inf`` ones: put
    the lowest-id ``-inf`` entries after the finite ones. ``head`` is each row's first 2k
    log-probs, which hold at least k ``-inf`` ids (fewer than k ids are finite)."""
    k = values.shape[1]
    finite = torch.isfinite(values).sum(dim=-1, keepdim=True)
    ids = torch.arange(head.shape[1], device=head.device)
    neg_ids = torch.where(torch.isneginf(head), ids, head.shape[1] + ids).sort(dim=-1).values[:, :k]
    place = torch.arange(k, device=head.device).expand_as(values)
    filler = torch.gather(neg_ids, -1, (place - finite).clamp(min=0))
    keep = place < finite
    return torch.where(keep, values, float("-inf")), torch.where(keep, tokens, filler)


def _order_by_value_then_token(values: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Reorder each row's (value, token) pairs: value descending, token ascending on ties."""
    by_token = torch.argsort(tokens, dim=-1)
    tokens = torch.gather(tokens, -1, by_token)
    values = torch.gather(values, -1, by_token)
    by_value = torch.sort(values, dim=-1, descending=True, stable=True).indices
    return torch.gather(values, -1, by_value), torch.gather(tokens, -1, by_value)


def _exact_topk_with_ties(logp: torch.Tensor, kth: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k of rows whose k-th value ties with values outside the top-k (lowest ids win)."""
    cand = logp >= kth[:, None]
    short = torch.isneginf(kth)
    if bool(short.any()):
        # Fewer than k finite entries (sparse drafters such as n-gram tables): the row is
        # filled with its lowest-id -inf entries, all among ids < 2k (fewer than k ids are
        # finite), so the rest of the vocabulary need not be sorted.
        low_ids = torch.arange(logp.shape[1], device=logp.device) < 2 * k
        cand[short] = ~torch.isneginf(logp[short]) | low_ids
    row, col = torch.nonzero(cand, as_tuple=True)  # row-major: columns ascending within a row
    counts = torch.bincount(row, minlength=len(logp))
    val = logp[row, col]
    order = torch.sort(val, descending=True, stable=True).indices
    order = order[torch.sort(row[order], stable=True).indices]
    row, col, val = row[order], col[order], val[order]
    start = torch.cumsum(counts, 0) - counts
    keep = torch.arange(len(row), device=logp.device) - start[row] < k
    return val[keep].view(-1, k), col[keep].view(-1, k)


def top_indices(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the ``k`` largest finite ``scores`` (1-D), best first; ties -> lower index.

    ``-inf`` (and NaN) entries are never returned, so the result may be shorter than ``k``.
    """
    order = torch.sort(scores, descending=True, stable=True).indices
    order = order[torch.isfinite(scores[order])]
    return order[: max(0, int(k))]


def top_host_indices(scores: list[float], k: int) -> list[int]:
    """:func:`top_indices` over a host list (a policy growing its tree on the host): indices of
    the ``k`` largest finite ``scores``, best first, ties to the lower index."""
    finite = [i for i, score in enumerate(scores) if math.isfinite(score)]
    return sorted(finite, key=lambda i: -scores[i])[: max(0, int(k))]


def pad_top(values: list[float], tokens: list[int], k: int, vocab: int) -> tuple[list[float], list[int]]:
    """The first ``k`` of a sparse row's ranked candidates (``values`` descending, ties to the
    lower id), padded as :func:`topk_per_row` pads a row with fewer than ``k`` finite entries:
    ``-inf`` at the lowest ids the row leaves out. What a sparse ``expand_top`` returns per row."""
    values, tokens = list(values[:k]), list(tokens[:k])
    if len(tokens) < k:
        taken = set(tokens)
        filler = (i for i in range(vocab) if i not in taken)
        tokens += [next(filler) for _ in range(k - len(tokens))]
        values += [float("-inf")] * (k - len(values))
    return values, tokens


def sparse_top(rows: list[tuple[list[float], list[int]]], k: int, vocab: int,
               device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`topk_per_row`'s ``(values, token_ids, ranks)`` for sparse rows, each its finite
    ``(values, tokens)`` ranked as :func:`pad_top` takes them: what a drafter with a handful
    of candidates per row returns from ``expand_top`` without building ``[rows, V]``."""
    k = min(int(k), vocab)
    values, tokens = [], []
    for vals, toks in rows:
        vals, toks = pad_top(vals, toks, k, vocab)
        values.append(vals)
        tokens.append(toks)
    n = len(values)
    return (torch.tensor(values, dtype=torch.float32, device=device).view(n, k),
            torch.tensor(tokens, dtype=torch.long, device=device).view(n, k),
            torch.arange(k, device=device).expand(n, k))
