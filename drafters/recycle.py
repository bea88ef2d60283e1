"""Drafter ``recycle``: Token Recycling (Luo et al., arXiv 2408.08696), training-free and model-free.

The drafter keeps an adjacency table ``[V, k]`` on the target's device: for every token, the
target's top-k next tokens (ids and log-probs) from the last verification in which that token
was a tree node. At a draft node the row is simply its token's table row: drafting is a gather.

Updates read the verifier's own logits (``needs_target_logits``), so they cost no extra target
work: after each step every tree node writes its token's row from the target's logits at that
node (its top-k, normalised over the whole vocabulary), the accepted path last, so that when
several nodes carry the same token the accepted one wins (then the deeper path node, then the
later node). After the prefill the prompt positions write their rows (the later one wins).

Hot start (default): the table outlives ``begin``, so what the target did on earlier prompts
keeps drafting for later ones, as in the paper; the drafter declares ``persistent_state``.
``cold_start = true`` empties it at every ``begin``.

A token whose row was never written drafts a single fallback candidate, the token itself, at
``log(fallback_prob)`` (like the n-gram drafter's fallback: TALON's argmax layer always has a
node to add, and the tiny probability tells confidence-aware policies it is a guess);
``fallback_prob = 0`` leaves such rows all ``-inf`` and policies stop there.

Rows are kept in the project's selection order (log-prob descending, lower id first on ties;
the ``-inf`` places hold the lowest ids the row leaves out), so ``expand_top`` is a slice of
the table and equals :func:`specframe.topk_per_row` over ``expand``'s dense rows, ties included.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from specframe.interfaces import Drafter
from specframe.options import require
from specframe.search_space import tunable
from specframe.tree import DraftTree


@dataclass
class RecycleDrafterOptions:
    """Options of the ``recycle`` drafter.

    Attributes:
        k: candidates kept per token (the paper's top-8).
        cold_start: empty the table at every ``begin`` instead of keeping it across prompts.
        fallback_prob: probability of the single fallback candidate (the token itself) of a
            token with no row yet; 0 leaves those rows all ``-inf``.
        prompt_rows: the prompt's positions write their rows after the prefill; False skips
            that (and the prefill's lm_head over every prompt position: ~30 ms for a few hundred
            tokens of SmolLM2 on a 2-core CPU), keeping only what verification writes.
    """

    k: int = tunable(8, low=2, high=16)
    cold_start: bool = tunable(False, choices=(False, True))
    fallback_prob: float = 1e-6
    prompt_rows: bool = tunable(True, choices=(True, False))

    def __post_init__(self) -> None:
        require(isinstance(self.k, int) and self.k >= 1, "k", f"must be an int >= 1, got {self.k!r}")
        require(0.0 <= self.fallback_prob <= 1.0, "fallback_prob", f"must be in [0, 1], got {self.fallback_prob}")


def canonical_rows(ids: torch.Tensor, logp: torch.Tensor, width: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``(ids, logp)`` in selection order, ``width`` places each: finite entries by
    log-prob descending (lower id first on ties), then the lowest ids not among them at ``-inf``
    (what :func:`specframe.topk_per_row` returns for a row that is ``-inf`` elsewhere)."""
    finite = torch.isfinite(logp)
    # Finite entries first (value descending, then id ascending): two stable sorts.
    by_id = torch.argsort(torch.where(finite, ids, vocab), dim=-1, stable=True)
    ids, logp, finite = ids.gather(-1, by_id), logp.gather(-1, by_id), finite.gather(-1, by_id)
    by_value = torch.sort(torch.where(finite, logp, -math.inf), dim=-1, descending=True, stable=True).indices
    ids, logp, finite = ids.gather(-1, by_value), logp.gather(-1, by_value), finite.gather(-1, by_value)
    count = finite.sum(dim=-1, keepdim=True)
    # Filler: the lowest ids outside the finite entries (found among the first width + k ids).
    span = min(vocab, width + ids.shape[-1])
    cand = torch.arange(span, device=ids.device)
    taken = ((cand[None, :, None] == ids[:, None, :]) & finite[:, None, :]).any(-1)
    free = torch.sort(torch.where(taken, cand + vocab, cand), dim=-1).values
    place = torch.arange(width, device=ids.device).expand(len(ids), width)
    filler = free.gather(-1, (place - count).clamp(0, span - 1))
    head = min(width, ids.shape[-1])
    pad = width - head
    top_ids = torch.nn.functional.pad(ids[:, :head], (0, pad))
    top_logp = torch.nn.functional.pad(logp[:, :head], (0, pad), value=-math.inf)
    keep = place < count
    return torch.where(keep, top_ids, filler), torch.where(keep, top_logp, -math.inf)


#: Columns per block of :func:`top_k`'s first pass (the vocabularies of common models divide by it).
BLOCK = 128


def top_k(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.topk(logits, k, dim=-1)`` (values descending; which of tied values is taken may
    differ) in two cheap passes: each block of ``BLOCK`` columns gives its max, and the k best
    entries lie in the k blocks with the best maxima (an entry outside them is beaten by each
    of those k maxima), so the selection runs over k blocks instead of the whole row: at
    V = 49152, 0.3 instead of 1.4 ms for 12 rows on one CPU thread. Falls back to
    ``torch.topk`` when the vocabulary does not split into enough whole blocks."""
    rows, vocab = logits.shape
    blocks = vocab // BLOCK
    if vocab % BLOCK or blocks < 4 * k:
        return torch.topk(logits, k, dim=-1)
    grid = logits.reshape(rows, blocks, BLOCK)
    best = torch.topk(grid.amax(dim=-1), k, dim=-1).indices                    # [rows, k]
    picked = grid.gather(1, best[:, :, None].expand(rows, k, BLOCK)).reshape(rows, k * BLOCK)
    values, at = torch.topk(picked, k, dim=-1)
    return values, best.gather(1, at // BLOCK) * BLOCK + at % BLOCK


def last_writers(tokens: torch.Tensor, priority: torch.Tensor, vocab: int) -> torch.Tensor:
    """Bool ``[n]``: whether each entry is the highest-priority one among those with its token
    (priorities are distinct). No host read and no data-dependent shape."""
    best = torch.full((vocab,), -1, dtype=priority.dtype, device=tokens.device)
    best = best.scatter_reduce(0, tokens, priority, reduce="amax")
    return best[tokens] == priority


def tree_priority(n: int, path: torch.Tensor | None, device: torch.device) -> torch.Tensor:
    """Write order of a verified tree's nodes: off-path nodes by index, then the accepted path
    (root first), so the path wins a token shared with a rejected node."""
    priority = torch.arange(n, device=device)
    if path is not None and path.numel():
        path = path.to(device, torch.long)
        priority = priority.index_put((path,), n + torch.arange(len(path), device=device))
    return priority


#: Places stored per row: past the ``k`` candidates, the ``-inf`` filler a policy's Top-K reads
#: (TALON's and EAGLE's default K is 10), so ``expand_top`` up to this width is a slice.
STORED_WIDTH = 16


class RecycleDrafter(Drafter):
    """Token Recycling: draft each node's children from its token's row of an adjacency table
    of the target's own top-k predictions."""

    name = "recycle"
    Options = RecycleDrafterOptions
    needs_target_logits: ClassVar[bool] = True
    #: The table keeps what the target did on earlier prompts (hot start); cold start sets False.
    persistent_state: ClassVar[bool] = True
    #: Rows come from the target's logits at every tree node, off-path ones included, which a
    #: recorded greedy trace does not hold.
    replay: ClassVar[str] = "unsupported"

    def __init__(self, options: RecycleDrafterOptions, target: Any) -> None:
        super().__init__(options, target)
        self.persistent_state = not options.cold_start
        self.needs_prompt_logits = bool(options.prompt_rows)
        # Never wider than the vocabulary: past it there are no ids left to fill a row with.
        self.width = min(max(options.k, STORED_WIDTH), self.vocab_size)
        self.ids: torch.Tensor | None = None
        self.logp: torch.Tensor | None = None

    # ------------------------------------------------------------------ table
    def reset_table(self) -> None:
        """An empty table: every token's row is its fallback (row V is a scratch row that
        duplicate writers write to, so every real row has one writer)."""
        vocab, device = self.vocab_size, self.target.device
        # One candidate per row, the token itself (the scratch row's is any valid id).
        ids = torch.arange(vocab + 1, device=device).clamp(max=vocab - 1)[:, None]
        logp = torch.full((vocab + 1, 1), math.log(self.options.fallback_prob) if self.options.fallback_prob > 0
                          else -math.inf, device=device)
        self.ids, self.logp = canonical_rows(ids, logp, self.width, vocab)

    def update(self, tokens: torch.Tensor, logits: torch.Tensor, priority: torch.Tensor) -> None:
        """Write each token's row from the target's ``logits`` at it (``[n, V]``); among
        entries of one token the highest ``priority`` wins. All on the device."""
        vocab, k = self.vocab_size, self.options.k
        tokens = tokens.to(self.ids.device, torch.long)
        logits = logits.to(self.ids.device)
        values, ids = top_k(logits, min(k, vocab))
        # log-softmax of the kept entries; the top value doubles as logsumexp's shift (one
        # pass over the [n, V] block fewer: at V = 49152 each pass is 30-40 us a row on a CPU).
        top = values[:, :1]
        logp = (values - top - (logits - top).exp_().sum(dim=-1, keepdim=True).log_()).float()
        ids, logp = canonical_rows(ids, logp, self.width, vocab)
        rows = torch.where(last_writers(tokens, priority, vocab), tokens, vocab)
        self.ids[rows] = ids
        self.logp[rows] = logp

    # ------------------------------------------------------------------ life cycle
    def begin(self, prompt_ids: torch.Tensor, target_hidden: Any = None,
              target_logits: torch.Tensor | None = None) -> None:
        """Keep the table (hot start) or empty it (cold start); then let the prompt's
        positions write their rows from the prefill's logits."""
        if self.ids is None or self.options.cold_start:
            self.reset_table()
        if target_logits is not None and len(target_logits):
            tokens = torch.as_tensor(prompt_ids).flatten()[: len(target_logits)]
            self.update(tokens, target_logits, torch.arange(len(target_logits), device=self.ids.device))

    def commit(self, tokens: torch.Tensor, path: torch.Tensor | None = None, target_hidden: Any = None,
               tree: DraftTree | None = None, target_logits: torch.Tensor | None = None) -> None:
        """Every node of the verified ``tree`` writes its token's row from ``target_logits``,
        the accepted ``path`` last. Without the logits (or the tree) there is nothing to learn."""
        if self.ids is None:
            self.reset_table()
        if target_logits is None or tree is None:
            return
        self.update(tree.tokens, target_logits, tree_priority(len(tree), path, self.ids.device))

    # ------------------------------------------------------------------ drafting
    def _rows(self, tree: DraftTree, nodes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.ids is None:
            self.reset_table()
        tokens = tree.tokens[torch.as_tensor(nodes, dtype=torch.long, device=tree.device)].to(self.ids.device)
        return self.ids[tokens], self.logp[tokens]

    def expand(self, tree: DraftTree, nodes: torch.Tensor) -> torch.Tensor:
        """Each node's row: its token's table entries, ``-inf`` elsewhere (one gather)."""
        ids, logp = self._rows(tree, nodes)
        out = torch.full((len(ids), self.vocab_size), -math.inf, device=ids.device)
        return out.scatter_(1, ids, logp).to(tree.device)

    def expand_top(self, tree: DraftTree, nodes: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The top ``k`` of each node's row straight from the table (already in selection
        order, ``-inf`` filler included), recomputed only past the stored width."""
        ids, logp = self._rows(tree, nodes)
        k = min(int(k), self.vocab_size)
        if k <= ids.shape[-1]:
            ids, logp = ids[:, :k], logp[:, :k]
        else:
            ids, logp = canonical_rows(ids, logp, k, self.vocab_size)
        ranks = torch.arange(k, device=tree.device).expand(len(ids), k)
        return logp.to(tree.device), ids.to(tree.device), ranks


def reference_table(steps: list[tuple[list[int], torch.Tensor, list[int] | None]], k: int) -> dict[int, dict[int, float]]:
    """Slow, literal reference of the table: ``{token: {next token: log-prob}}`` after the
    given writes, each ``(tokens, logits [n, V], path)`` with ``path`` None for a prefill
    (positions in order) or the accepted nodes of a verified tree (written last)."""
    table: dict[int, dict[int, float]] = {}
    for tokens, logits, path in steps:
        order = list(range(len(tokens)))
        if path is not None:
            order = [i for i in order if i not in path] + list(path)
        for i in order:
            logp = torch.log_softmax(logits[i].double(), dim=-1)
            ranked = sorted(range(len(logp)), key=lambda t: (-float(logits[i][t]), t))[:k]
            table[tokens[i]] = {t: float(logp[t]) for t in ranked}
    return table
