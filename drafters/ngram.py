"""Drafter ``ngram``: model-free prompt lookup (suffix matching over everything committed so far).

At a tree node u the query is the committed sequence (prompt + generated tokens, ending in the
root) followed by the path root -> u. The drafter finds the longest suffix of that query, between
``min_ngram`` and ``max_ngram`` tokens, that occurred earlier in the committed sequence, and
returns the distribution of the tokens that followed its earlier occurrences, weighted by
frequency and optionally by recency. Several distinct continuations give several candidates, so a
tree policy can branch.

Only committed tokens are indexed: tokens inside the draft tree are speculative, so they may form
the query (the path to u is context) but never count as occurrences.

When no suffix matches, the row is ``-inf`` everywhere except a single fallback token (the most
frequent token committed so far; ties go to the lower id) with log-probability
``log(fallback_prob)`` (default 1e-6). Why this shape:

* Top-K policies (TALON's first layer, EAGLE, OPT-Tree, static trees) take the top children of
  every row; a flat row would hand them K junk nodes. With one finite entry, masking ``-inf``
  candidates leaves exactly one cheap guess.
* Every row keeps at least one finite entry, so a policy whose layer must add >= 1 node (TALON's
  argmax always passes its gate) can never stall on an all ``-inf`` layer.
* The tiny probability tells confidence-aware policies (TALON's relative gate, OPT-Tree's
  expected-gain stop, the chain's confidence stop) that the drafter is guessing.

Such a fallback row is a sub-probability (its mass is ``fallback_prob``); matched rows are
normalised. Deterministic (top-k / gated) drafting never reads draft probabilities in
verification, so this is lossless under every built-in verifier; a policy that SAMPLES children
from a row must normalise it first (``log_softmax``).

Cost: the index maps each n-gram (``1 <= n <= max_ngram``) to its continuations and is updated
incrementally on ``begin``/``commit`` (O(max_ngram) per committed token); a lookup is
O(max_ngram) dictionary probes per node plus the size of the winning continuation set. One
``expand`` counts as one draft forward.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass
from typing import Any

import torch

from specframe.interfaces import Drafter
from specframe.options import require
from specframe.search_space import tunable
from specframe.selection import pad_top, sparse_top
from specframe.tree import DraftTree


@dataclass
class NgramDrafterOptions:
    """Options of the ``ngram`` drafter.

    Attributes:
        max_ngram: longest suffix tried (tried first: the longest match wins).
        min_ngram: shortest suffix accepted as a match; below it the fallback row is returned.
        decay: recency weighting per token of age. An earlier occurrence whose continuation sits
            ``a`` tokens before the end of the committed sequence weighs ``decay ** a``;
            1.0 (default) = pure frequency counts.
        fallback_prob: probability given to the single fallback token when nothing matches
            (every other entry of that row is ``-inf``).
    """

    # Disjoint ranges keep every drawn pair valid (max_ngram >= min_ngram).
    max_ngram: int = tunable(3, low=2, high=6)
    min_ngram: int = tunable(1, low=1, high=2)
    decay: float = tunable(1.0, low=0.5, high=1.0)
    fallback_prob: float = 1e-6

    def __post_init__(self) -> None:
        require(self.min_ngram >= 1, "min_ngram", f"must be >= 1, got {self.min_ngram}")
        require(
            self.max_ngram >= self.min_ngram, "max_ngram",
            f"must be >= min_ngram ({self.min_ngram}), got {self.max_ngram}",
        )
        require(0.0 < self.decay <= 1.0, "decay", f"must be in (0, 1], got {self.decay}")
        require(
            0.0 < self.fallback_prob <= 1.0, "fallback_prob",
            f"must be in (0, 1] (0 would give policies -inf nodes), got {self.fallback_prob}",
        )


def _logaddexp1(a: float) -> float:
    """``log(exp(a) + 1)`` without overflow (scalar; the index updates one entry at a time)."""
    return max(a, 0.0) + math.log1p(math.exp(-abs(a)))


class NgramIndex:
    """Incremental n-gram -> continuation index over a growing token sequence.

    For each key (a tuple of 1..max_n tokens) and each token w that followed it, the index keeps
    the decayed count as ``(log_weight, last_pos)``: the weight at ``last_pos`` (the position of
    the latest such w), so the weight now is ``log_weight + (len - 1 - last_pos) * log(decay)``.
    Log space keeps long contexts with strong decay from underflowing.
    """

    def __init__(self, max_n: int, decay: float = 1.0) -> None:
        self.max_n = max_n
        self.log_decay = math.log(decay)
        self.tokens: list[int] = []
        self.table: dict[tuple[int, ...], dict[int, list[float]]] = {}
        self.unigram: dict[int, int] = {}
        self.most_frequent: int | None = None

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: list[int]) -> None:
        """Append tokens, indexing every n-gram that now has a continuation."""
        for tok in tokens:
            self._append(int(tok))

    def _append(self, tok: int) -> None:
        j = len(self.tokens)
        seq = self.tokens
        for n in range(1, min(self.max_n, j) + 1):
            conts = self.table.setdefault(tuple(seq[j - n : j]), {})
            entry = conts.get(tok)
            if entry is None:
                conts[tok] = [0.0, float(j)]
            else:
                # Decay the stored weight up to position j, then add this occurrence (weight 1).
                aged = entry[0] + (j - entry[1]) * self.log_decay
                entry[0] = _logaddexp1(aged)
                entry[1] = float(j)
        seq.append(tok)
        count = self.unigram.get(tok, 0) + 1
        self.unigram[tok] = count
        best = self.most_frequent
        if best is None or count > self.unigram[best] or (count == self.unigram[best] and tok < best):
            self.most_frequent = tok

    def continuations(self, key: tuple[int, ...]) -> tuple[list[int], list[float]] | None:
        """Tokens seen after ``key`` and their current log-weights (unnormalised), or None."""
        conts = self.table.get(key)
        if not conts:
            return None
        end = len(self.tokens) - 1
        toks = list(conts)
        logw = [w + (end - pos) * self.log_decay for w, pos in conts.values()]
        return toks, logw


class NgramDrafter(Drafter):
    """Prompt-lookup drafter: longest-suffix match over the committed text, no model."""

    name = "ngram"
    # Drafts depend only on the committed tokens: replaying a greedy trace is exact.
    replay = "exact"
    Options = NgramDrafterOptions

    def __init__(self, options: NgramDrafterOptions, target: Any) -> None:
        super().__init__(options, target)
        self.index = NgramIndex(options.max_ngram, options.decay)
        self._ranked: dict[tuple[int, ...], tuple[list[float], list[int]]] = {}

    def begin(self, prompt_ids: torch.Tensor, target_hidden: Any = None) -> None:
        """Index the prompt; forget earlier generations."""
        self.index = NgramIndex(self.options.max_ngram, self.options.decay)
        self.index.extend(torch.as_tensor(prompt_ids).flatten().tolist())
        self._ranked = {}

    def commit(self, tokens: torch.Tensor, path: torch.Tensor | None = None, target_hidden: Any = None,
               tree: DraftTree | None = None) -> None:
        """Index the newly committed tokens (accepted drafts + bonus)."""
        self.index.extend(tokens.tolist() if isinstance(tokens, torch.Tensor) and tokens.dim() == 1
                          else torch.as_tensor(tokens).flatten().tolist())
        self._ranked = {}  # weights (recency) and counts changed

    # ------------------------------------------------------------------ lookup
    def query_suffix(self, tree: DraftTree, node: int) -> list[int]:
        """Last ``max_ngram`` tokens of committed sequence + path root -> ``node`` (root not doubled)."""
        if tree.has_host():  # a tree grown on the host: its lists, no read
            parents, tokens = tree.host().parents, tree.host().tokens
        else:
            parents, tokens = tree.parents.tolist(), tree.tokens.tolist()
        path: list[int] = []
        u = node
        # The root is the last committed token, so only the drafted part of the path is added.
        while u > 0 and len(path) < self.options.max_ngram:
            path.append(tokens[u])
            u = parents[u]
        path.reverse()
        need = self.options.max_ngram - len(path)
        committed = self.index.tokens[max(0, len(self.index.tokens) - need) :] if need > 0 else []
        return committed + path

    def ranked(self, suffix: list[int]) -> tuple[list[float], list[int]]:
        """The row after ``suffix`` as its finite entries only: (float32 log-probs, token ids),
        best first, ties toward the lower id, ids beyond the target vocabulary dropped. The
        longest match between ``min_ngram`` and ``max_ngram`` tokens wins (memoised per step);
        without one, the single fallback entry. Both :meth:`expand` and :meth:`expand_top`
        are built from this, so they cannot disagree on what a row holds."""
        for n in range(min(self.options.max_ngram, len(suffix)), self.options.min_ngram - 1, -1):
            key = tuple(suffix[len(suffix) - n :])
            entry = self._ranked.get(key)
            if entry is None:
                found = self.index.continuations(key)
                if found is None:
                    continue
                entry = self._ranked[key] = self._rank(*found)
            return entry
        return self.fallback()

    def _rank(self, toks: list[int], logw: list[float]) -> tuple[list[float], list[int]]:
        """Continuations and their log-weights -> normalised float32 log-probs, ranked.

        Plain floats, not tensors: a handful of continuations took four torch calls (about
        0.1 ms a lookup on the CPU) for what the host does in microseconds. The float64
        log-sum-exp is rounded once to float32, as a tensor's ``.float()`` rounds it."""
        top = max(logw)
        total = top + math.log(math.fsum(math.exp(w - top) for w in logw))
        logp = array("f", [w - total for w in logw]).tolist()  # float32 values, exactly
        pairs = sorted((-v, t) for v, t in zip(logp, toks) if t < self.vocab_size)
        return [-v for v, _ in pairs], [t for _, t in pairs]

    def fallback(self) -> tuple[list[float], list[int]]:
        """The single fallback entry used when nothing matches (as :meth:`ranked` gives it)."""
        tok = self.index.most_frequent if self.index.most_frequent is not None else 0
        tok = tok if tok < self.vocab_size else 0
        return array("f", [math.log(self.options.fallback_prob)]).tolist(), [tok]

    def expand_top(self, tree: DraftTree, nodes: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`expand` followed by :func:`specframe.topk_per_row`, without the dense rows:
        each row's ranked entries, padded with the lowest ids it leaves ``-inf`` (what the tie
        rule picks). A 49152-token vocabulary made the dense path cost about 0.5 ms a row,
        several times the lookup."""
        nodes = torch.as_tensor(nodes)
        node_list = (nodes if nodes.dim() == 1 else nodes.flatten()).tolist()
        rows = [self.ranked(self.query_suffix(tree, int(node))) for node in node_list]
        return sparse_top(rows, k, self.vocab_size, tree.device)

    def top_lists(self, tree: DraftTree, nodes: list[int], k: int) -> list[tuple[list[float], list[int]]]:
        """:meth:`expand_top`'s rows as host lists (``DraftSession.expand_top_lists``): the same
        ranked, padded entries without the tensors."""
        k = min(int(k), self.vocab_size)
        return [pad_top(*self.ranked(self.query_suffix(tree, int(node))), k, self.vocab_size) for node in nodes]

    def expand(self, tree: DraftTree, nodes: torch.Tensor) -> torch.Tensor:
        """One lookup over all requested nodes: log-probs ``[len(nodes), V]``, ``-inf`` where unseen."""
        node_list = torch.as_tensor(nodes).flatten().tolist()
        rows: list[int] = []
        cols: list[int] = []
        vals: list[float] = []
        for r, node in enumerate(node_list):
            logp, toks = self.ranked(self.query_suffix(tree, int(node)))
            rows += [r] * len(toks)
            cols += toks
            vals += logp
        out = torch.full((len(node_list), self.vocab_size), float("-inf"), dtype=torch.float32)
        if rows:
            out[torch.tensor(rows), torch.tensor(cols)] = torch.tensor(vals, dtype=torch.float32)
        return out.to(tree.device)


def reference_distribution(
    committed: list[int], path: list[int], max_ngram: int, min_ngram: int, decay: float = 1.0
) -> tuple[int, dict[int, float]] | None:
    """Slow, literal reference: scan ``committed`` for the longest suffix of ``committed + path``.

    Returns ``(n, {token: probability})`` of the longest matching suffix length n in
    ``[min_ngram, max_ngram]``, or None. An occurrence whose continuation is at position j weighs
    ``decay ** (len(committed) - 1 - j)``.
    """
    query = committed + path
    for n in range(min(max_ngram, len(query)), min_ngram - 1, -1):
        suffix = query[len(query) - n :]
        weights: dict[int, float] = {}
        for j in range(n, len(committed)):
            if committed[j - n : j] == suffix:
                w = decay ** (len(committed) - 1 - j)
                weights[committed[j]] = weights.get(committed[j], 0.0) + w
        if weights:
            total = sum(weights.values())
            return n, {t: w / total for t, w in weights.items()}
    return None
