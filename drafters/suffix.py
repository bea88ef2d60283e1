"""Drafter ``suffix``: SuffixDecoding (Oliaro et al., arXiv 2411.04975; vLLM's ``suffix``
method via Arctic Inference), model-free.

Two structures (:mod:`specframe.drafters.suffix_tree`): a per-request index over prompt +
committed tokens, and (``global_tree``) a global one over the outputs of this instance's
earlier ``generate`` calls; with ``datastore``, a third, read-only one: a corpus and its
suffix array (:mod:`specframe.drafters.datastore`, REST's retrieval). Each generation's
output joins the global one at :meth:`SuffixDrafter.finish`, exactly as emitted (cut at
``max_new_tokens`` and EOS). At most ``max_cached_requests``
outputs are kept; the oldest is evicted first.

At a node u the query is the committed sequence followed by the path root -> u. Each structure
gives the counts of the tokens that followed the longest suffix of the query it holds
(``min_match..max_match`` tokens). Combination: with match lengths ``m_r`` (request) and
``m_g`` (global), each 0 when unmatched, and normalised frequencies ``p_r``, ``p_g``::

    p(t) = (m_r * p_r(t) + m_g * p_g(t)) / (m_r + m_g)

(a datastore adds its own term ``m_d * p_d(t)`` the same way)

so the longer match weighs more and one structure alone gives its own frequencies.

Tree shape as SuffixDecoding: with ``m`` the longer match at the root, a node at depth d gets
children only if ``d < max_spec_factor * m`` and ``d <= max_depth``; a child t of u is kept only
if its cumulative probability ``P(u) * p(t | u)`` (P = product of the drafter's ``p`` along the
path) is at least ``min_token_prob``. Any policy then shapes the tree from these rows.
Where no child is left (no match, a limit, pruning) the row holds one fallback token, the most
frequent token of the request (ties to the lower id), at ``log(fallback_prob)`` (the n-gram
drafter's rule; ``fallback_prob = 0`` leaves the row all ``-inf``). Rows are sub-probabilities.

Replay: ``"exact"``. Drafts depend only on the committed tokens and on earlier outputs fed in
a fixed order; an experiment runs its questions in data-file order, from a fresh drafter per
repeat after the warm-up, in live and replayed runs alike, and the global index stores each
generation's emitted output, which replay reproduces token for token (docs/replay.md).

Cost: ``commit`` indexes O(max_match) keys per token; a row costs O(log max_match) dict probes
per structure, memoised per step by path, plus the sort of its few candidates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from specframe.interfaces import Drafter
from specframe.options import require
from specframe.search_space import tunable
from specframe.selection import pad_top
from specframe.tree import DraftTree

from .datastore import load
from .suffix_tree import Counts, OutputCache, RequestIndex

Ranked = tuple[list[float], list[int]]


@dataclass
class SuffixDrafterOptions:
    """Options of the ``suffix`` drafter.

    Attributes:
        max_depth: deepest node (root = depth 0) that gets children.
        max_match: longest suffix matched (the depth of the suffix index).
        min_match: shortest suffix that counts as a match.
        max_spec_factor: no children past depth ``max_spec_factor * m`` (m: the root's match).
        min_token_prob: no child below this cumulative probability.
        global_tree: also match the outputs of earlier generations of this instance.
        max_cached_requests: earlier outputs kept in the global index (oldest evicted first).
        fallback_prob: probability of the single fallback token of a row with no child.
        datastore: a REST datastore folder (``specframe datastore build``): its corpus is a
            third structure, matched and weighed like the other two (REST's retrieval).
    """

    # Disjoint ranges keep every drawn pair valid (max_match >= min_match).
    max_depth: int = tunable(24, low=4, high=32)
    max_match: int = tunable(16, low=4, high=32)
    min_match: int = tunable(1, low=1, high=4)
    max_spec_factor: float = tunable(1.0, low=0.25, high=4.0, log=True)
    min_token_prob: float = tunable(0.1, low=0.0, high=0.5)
    global_tree: bool = tunable(True, choices=(True, False))
    max_cached_requests: int = tunable(64, low=4, high=256, log=True, when={"global_tree": True})
    fallback_prob: float = 1e-6
    datastore: str | None = None

    def __post_init__(self) -> None:
        require(_is_int(self.max_depth) and self.max_depth >= 0, "max_depth", f"must be an int >= 0, got {self.max_depth!r}")
        require(_is_int(self.min_match) and self.min_match >= 1, "min_match", f"must be an int >= 1, got {self.min_match!r}")
        require(_is_int(self.max_match) and self.max_match >= self.min_match, "max_match",
                f"must be an int >= min_match ({self.min_match}), got {self.max_match!r}")
        require(self.max_spec_factor > 0, "max_spec_factor", f"must be > 0, got {self.max_spec_factor}")
        require(0.0 <= self.min_token_prob <= 1.0, "min_token_prob", f"must be in [0, 1], got {self.min_token_prob}")
        require(isinstance(self.global_tree, bool), "global_tree", f"must be true or false, got {self.global_tree!r}")
        require(_is_int(self.max_cached_requests) and self.max_cached_requests >= 1, "max_cached_requests",
                f"must be an int >= 1, got {self.max_cached_requests!r}")
        require(0.0 <= self.fallback_prob <= 1.0, "fallback_prob", f"must be in [0, 1], got {self.fallback_prob}")
        require(self.datastore is None or isinstance(self.datastore, str), "datastore",
                f"must be the path of a datastore folder (specframe datastore build), got {self.datastore!r}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def combine(matches: list[tuple[int, Counts]]) -> dict[int, float]:
    """Match-length weighted mixture of the structures' normalised frequencies (module docstring)."""
    total = sum(m for m, _ in matches)
    out: dict[int, float] = {}
    for m, counts in matches:
        if not m:
            continue
        norm = sum(counts.values())
        for tok, c in counts.items():
            out[tok] = out.get(tok, 0.0) + (m / total) * (c / norm)
    return out


class SuffixDrafter(Drafter):
    """SuffixDecoding: frequency-scored continuations of the longest matched suffix, over this
    request and the outputs of earlier requests."""

    name = "suffix"
    Options = SuffixDrafterOptions
    needs_target_logits = False
    # Drafts depend only on committed tokens and earlier outputs, in a fixed order (docstring).
    replay = "exact"

    def __init__(self, options: SuffixDrafterOptions, target: Any) -> None:
        super().__init__(options, target)
        # The global index is state across generations on purpose; without it, none is kept.
        self.persistent_state = bool(options.global_tree)
        self.cache = OutputCache(options.max_match, options.max_cached_requests)
        self.request = RequestIndex(options.max_match)
        self.datastore = load(options.datastore, self.vocab_size) if options.datastore else None
        self._reset_step()

    def _reset_step(self) -> None:
        """Forget the per-step memos (the committed sequence changed)."""
        self._dists: dict[tuple[int, ...], tuple[int, dict[int, float]]] = {}
        self._cums: dict[tuple[int, ...], float] = {(): 1.0}
        self._rows: dict[tuple[int, ...], Ranked] = {}

    def begin(self, prompt_ids: torch.Tensor, target_hidden: Any = None) -> None:
        """Index the new prompt (a fresh per-request index; the global one keeps what
        :meth:`finish` gave it)."""
        prompt = torch.as_tensor(prompt_ids).flatten().tolist()
        self.request = RequestIndex(self.options.max_match)
        self.request.extend(prompt)
        self._reset_step()

    def commit(self, tokens: torch.Tensor, path: torch.Tensor | None = None, target_hidden: Any = None,
               tree: DraftTree | None = None) -> None:
        """Index the newly committed tokens (accepted drafts + bonus)."""
        self.request.extend(torch.as_tensor(tokens).flatten().tolist())
        self._reset_step()

    def finish(self, output_ids: torch.Tensor) -> None:
        """The generation's output, exactly as emitted (cut at max_new_tokens and EOS), joins
        the global index."""
        if self.options.global_tree:
            self.cache.add(torch.as_tensor(output_ids).flatten().tolist())

    # ------------------------------------------------------------------ rows
    def distribution(self, path: tuple[int, ...]) -> tuple[int, dict[int, float]]:
        """``(match length, {token: p})`` after committed + ``path``: the longer of the two
        matches and the combined frequencies (memoised per step)."""
        found = self._dists.get(path)
        if found is None:
            query = (self.request.tokens + list(path))[-self.options.max_match :]
            matches = [self.request.index.longest(query, self.options.min_match)]
            if self.options.global_tree:
                matches.append(self.cache.index.longest(query, self.options.min_match))
            if self.datastore is not None:
                matches.append(self.datastore.longest(query, self.options.min_match))
            found = self._dists[path] = (max(m for m, _ in matches), combine(matches))
        return found

    def cumulative(self, path: tuple[int, ...]) -> float:
        """Product of the drafter's probabilities along ``path`` (0 off its candidates)."""
        known = self._cums.get(path)
        if known is not None:
            return known
        i = len(path) - 1
        while path[:i] not in self._cums:  # walk up to the deepest known ancestor
            i -= 1
        value = self._cums[path[:i]]
        for j in range(i, len(path)):
            value *= self.distribution(path[:j])[1].get(path[j], 0.0)
            self._cums[path[: j + 1]] = value
        return value

    def ranked(self, path: tuple[int, ...]) -> Ranked:
        """The row after ``path`` as its finite entries: (float32 log-probs, ids), best first,
        ties toward the lower id; the fallback where no child is allowed (memoised per step)."""
        row = self._rows.get(path)
        if row is None:
            row = self._rows[path] = self._children(path) or self.fallback()
        return row

    def _children(self, path: tuple[int, ...]) -> Ranked | None:
        depth, opts = len(path), self.options
        if depth > opts.max_depth or depth >= opts.max_spec_factor * self.distribution(())[0]:
            return None
        cum = self.cumulative(path) if opts.min_token_prob > 0 else 1.0
        kept = [(p, t) for t, p in self.distribution(path)[1].items()
                if t < self.vocab_size and cum * p >= opts.min_token_prob]
        if not kept:
            return None
        logp = torch.tensor([p for p, _ in kept], dtype=torch.float64).log().float().tolist()
        pairs = sorted((-v, t) for v, (_, t) in zip(logp, kept))
        return [-v for v, _ in pairs], [t for _, t in pairs]

    def fallback(self) -> Ranked:
        """The single fallback entry (none with ``fallback_prob = 0``)."""
        if self.options.fallback_prob == 0.0:
            return [], []
        tok = self.request.most_frequent or 0
        tok = tok if tok < self.vocab_size else 0
        return torch.tensor([math.log(self.options.fallback_prob)]).tolist(), [tok]

    # ------------------------------------------------------------------ drafting
    def path_of(self, tree: DraftTree, node: int, parents: list[int], tokens: list[int]) -> tuple[int, ...]:
        """Drafted tokens root -> ``node`` (the root, the last committed token, excluded)."""
        out: list[int] = []
        while node > 0:
            out.append(tokens[node])
            node = parents[node]
        return tuple(reversed(out))

    def _rows_for(self, tree: DraftTree, nodes: torch.Tensor) -> list[Ranked]:
        parents, tokens = tree.parents.tolist(), tree.tokens.tolist()
        return [self.ranked(self.path_of(tree, int(n), parents, tokens)) for n in torch.as_tensor(nodes).flatten().tolist()]

    def expand(self, tree: DraftTree, nodes: torch.Tensor) -> torch.Tensor:
        """Log-probs ``[len(nodes), V]``, ``-inf`` outside each row's candidates."""
        rows = self._rows_for(tree, nodes)
        out = torch.full((len(rows), self.vocab_size), float("-inf"), dtype=torch.float32)
        for r, (vals, toks) in enumerate(rows):
            if toks:
                out[r, torch.tensor(toks)] = torch.tensor(vals, dtype=torch.float32)
        return out.to(tree.device)

    def expand_top(self, tree: DraftTree, nodes: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`expand` then :func:`specframe.topk_per_row`, built from the few candidates:
        the ``-inf`` places hold the lowest ids a row leaves out (the tie rule's pick)."""
        k = min(int(k), self.vocab_size)
        values, ids = [], []
        for vals, toks in self._rows_for(tree, nodes):
            vals, toks = pad_top(vals, toks, k, self.vocab_size)
            values.append(vals)
            ids.append(toks)
        n, device = len(values), tree.device
        return (torch.tensor(values, dtype=torch.float32, device=device).view(n, k),
                torch.tensor(ids, dtype=torch.long, device=device).view(n, k),
                torch.arange(k, device=device).expand(n, k))
