"""The data structures of the ``suffix`` drafter: a bounded suffix index standing in for
SuffixDecoding's suffix trees.

:class:`SuffixIndex` maps every context of ``1..max_match`` tokens that occurred in its
documents to the counts of the tokens that followed it (a suffix tree cut at depth
``max_match``, flattened into one dict keyed by token tuples). Only positions with a
continuation inside the same document count, so documents never join across their borders.

Complexity (k = ``max_match``, n = indexed tokens): adding or removing a token touches k keys
(O(k^2) for building the key tuples, k small); memory is at most k keys per indexed token.
:meth:`SuffixIndex.longest` finds the longest matched suffix by binary search over its length,
O(log k) dict probes of O(k) each: if a context of length j occurred with a continuation, so
did its suffix of length j - 1 (same position), so "matched" is monotone in the length.

:class:`OutputCache` holds the outputs of earlier generations in one index, at most
``max_requests`` of them: adding one more evicts the oldest first (its counts are subtracted).
"""

from __future__ import annotations

from collections import deque

Counts = dict[int, int]


class SuffixIndex:
    """Context (1..``max_match`` tokens) -> counts of the next token, over several documents."""

    def __init__(self, max_match: int) -> None:
        self.max_match = max_match
        self.table: dict[tuple[int, ...], Counts] = {}

    def __len__(self) -> int:
        return len(self.table)

    def count(self, doc: list[int], start: int, sign: int) -> None:
        """Add (``sign = 1``) or subtract (``-1``) the continuations at positions ``start..`` of
        ``doc``, each with its contexts inside ``doc``. Keys whose counts reach 0 are dropped,
        which keeps "matched" monotone in the length after an eviction."""
        for j in range(max(start, 1), len(doc)):
            tok = doc[j]
            for k in range(1, min(self.max_match, j) + 1):
                self._bump(tuple(doc[j - k : j]), tok, sign)

    def _bump(self, key: tuple[int, ...], tok: int, sign: int) -> None:
        counts = self.table.setdefault(key, {})
        left = counts.get(tok, 0) + sign
        if left > 0:
            counts[tok] = left
            return
        counts.pop(tok, None)
        if not counts:
            del self.table[key]

    def longest(self, query: list[int], min_match: int) -> tuple[int, Counts]:
        """``(length, counts)`` of the longest suffix of ``query`` (``min_match..max_match``
        tokens) seen with a continuation, or ``(0, {})`` when none is."""
        lo, hi = min_match, min(self.max_match, len(query))
        if hi < lo or tuple(query[len(query) - lo :]) not in self.table:
            return 0, {}
        while lo < hi:  # invariant: the suffix of length lo matches
            mid = (lo + hi + 1) // 2
            if tuple(query[len(query) - mid :]) in self.table:
                lo = mid
            else:
                hi = mid - 1
        return lo, self.table[tuple(query[len(query) - lo :])]


class OutputCache:
    """The outputs of earlier generations, indexed together; the oldest is evicted first once
    more than ``max_requests`` are held."""

    def __init__(self, max_match: int, max_requests: int) -> None:
        self.index = SuffixIndex(max_match)
        self.max_requests = max_requests
        self.outputs: deque[list[int]] = deque()

    def __len__(self) -> int:
        return len(self.outputs)

    def add(self, output: list[int]) -> None:
        """Index ``output`` as one document, evicting the oldest outputs over the bound."""
        if not output:
            return
        self.outputs.append(list(output))
        self.index.count(self.outputs[-1], 1, 1)
        while len(self.outputs) > self.max_requests:
            self.index.count(self.outputs.popleft(), 1, -1)


class RequestIndex:
    """The growing sequence of one generation (prompt + committed tokens), indexed as one
    document, with unigram counts for the fallback token."""

    def __init__(self, max_match: int) -> None:
        self.index = SuffixIndex(max_match)
        self.tokens: list[int] = []
        self.unigram: Counts = {}
        self.most_frequent: int | None = None

    def extend(self, tokens: list[int]) -> None:
        """Append ``tokens`` and index the continuations they complete."""
        start = len(self.tokens)
        self.tokens.extend(int(t) for t in tokens)
        self.index.count(self.tokens, start, 1)
        for tok in self.tokens[start:]:
            self._count_unigram(tok)

    def _count_unigram(self, tok: int) -> None:
        count = self.unigram.get(tok, 0) + 1
        self.unigram[tok] = count
        best = self.most_frequent
        # Ties go to the lower id, as the n-gram drafter's fallback.
        if best is None or count > self.unigram[best] or (count == self.unigram[best] and tok < best):
            self.most_frequent = tok
