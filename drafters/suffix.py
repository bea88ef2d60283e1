"""Drafter ``suffix``: SuffixDecoding (Oliaro et al., arXiv 2411.04975) by its reference's rules
(arctic-inference 0.3.0, the code vLLM's ``suffix`` method runs), model-free.

Two suffix trees (:mod:`specframe.drafters.suffix_cache`): the request's (prompt and response
so far) and, with ``global_tree``, a global one (the responses of the last
``max_cached_requests`` requests of this instance, the active one included, each committed
token joining it at once). Optionally a third, read-only source: a REST datastore
(:mod:`specframe.drafters.datastore`).

Each step drafts as the reference's path mode (``use_tree_spec = False``, vLLM's): over the last
``max_depth`` committed tokens, each tree tries every match length from 1 up to (not including)
that context's length, follows the most frequent child from the matched node while the product
of ``child.count / node.count`` stays at least ``min_token_prob``, for at most
``min(max_spec_tokens, match_len * max_spec_factor + max_spec_offset)`` tokens, and keeps the
draft with the highest score (the sum of its tokens' probabilities; the longer match on a tie).
Of the trees' drafts the higher score wins; on a tie the request's. A datastore drafts the same
way from its longest match (REST's lookup, re-matched at each drafted token) and wins only with a
strictly higher score. (:mod:`specframe.drafters.suffix_tree` states the arithmetic.)

Rows, for any policy: the winning source's candidates below its matched context. A node at depth
d < the winner's token cap whose path is in that source gets the children there, each at its
conditional probability ``child.count / node.count``, those whose cumulative probability (the
reference's float32 product along the path) falls below ``min_token_prob`` left out. So the top
path is the reference's draft, up to the order of equally likely candidates (specframe's rows
break ties toward the lower id, the reference follows its own sibling order), and a tree policy
gets the reference's other candidates of the same match where it wants more than one path (the
reference's tree mode would choose the match by the whole tree's score instead). Every other
row is empty (with ``fallback_prob > 0``, one fallback token, the request's most frequent token
at ``log(fallback_prob)``, as the n-gram drafter's rows; the reference has none).

Replay: ``"exact"``. Drafts depend only on the committed tokens and on earlier outputs fed in a
fixed order; an experiment runs its questions in data-file order, from a fresh drafter per
repeat after the warm-up, in live and replayed runs alike, and the global tree holds each
generation's emitted output, which replay reproduces token for token (docs/replay.md).

Cost: ``commit`` touches ``max_depth`` tree nodes per token; a step's draft tries up to
``max_depth`` match lengths per tree; a row is one walk down from the matched node, memoised per
step.
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
from specframe.tree import DraftTree, drafted_paths

from .datastore import Datastore, load
from .suffix_cache import SuffixCache
from .suffix_tree import Draft, SuffixTree, cap, f32

Ranked = tuple[list[float], list[int]]
#: A source's candidates after a path: (token, count) pairs and the count they divide by.
Children = tuple[list[tuple[int, int]], int]


@dataclass
class SuffixDrafterOptions:
    """Options of the ``suffix`` drafter (defaults: vLLM's ``suffix`` method).

    Attributes:
        max_depth: depth of the suffix trees and the context matched
            (``suffix_decoding_max_tree_depth``).
        max_spec_tokens: most tokens a draft holds (vLLM's ``num_speculative_tokens``, which
            defaults to the tree depth for this method); None: ``max_depth``.
        max_spec_factor: a draft after a match of m tokens holds at most
            ``m * max_spec_factor + max_spec_offset`` tokens.
        max_spec_offset: see ``max_spec_factor``.
        min_token_prob: no drafted token below this cumulative probability.
        global_tree: also draft from the responses of earlier requests (and the active one).
        max_cached_requests: responses the global tree holds, the active one included (oldest
            evicted first).
        fallback_prob: probability of one fallback token in a row with no candidate (0: none,
            as the reference).
        datastore: a REST datastore folder (``specframe datastore build``): a third source,
            drafting from its longest match.
        max_match: longest match asked of the datastore.
        min_match: shortest datastore match that counts.
    """

    max_depth: int = tunable(24, low=4, high=32)
    max_spec_tokens: int | None = None
    max_spec_factor: float = tunable(1.0, low=0.25, high=4.0, log=True)
    max_spec_offset: float = tunable(0.0, low=0.0, high=4.0)
    min_token_prob: float = tunable(0.1, low=0.0, high=0.5)
    global_tree: bool = tunable(True, choices=(True, False))
    max_cached_requests: int = tunable(10000, low=4, high=10000, log=True, when={"global_tree": True})
    fallback_prob: float = 0.0
    datastore: str | None = None
    max_match: int = 16
    min_match: int = 1

    def __post_init__(self) -> None:
        require(_is_int(self.max_depth) and self.max_depth >= 1, "max_depth", f"must be an int >= 1, got {self.max_depth!r}")
        require(self.max_spec_tokens is None or (_is_int(self.max_spec_tokens) and self.max_spec_tokens >= 0),
                "max_spec_tokens", f"must be an int >= 0 or None, got {self.max_spec_tokens!r}")
        require(_is_number(self.max_spec_factor) and self.max_spec_factor > 0, "max_spec_factor",
                f"must be > 0, got {self.max_spec_factor!r}")
        require(_is_number(self.max_spec_offset), "max_spec_offset", f"must be a number, got {self.max_spec_offset!r}")
        require(_is_number(self.min_token_prob) and 0.0 <= self.min_token_prob <= 1.0, "min_token_prob",
                f"must be in [0, 1], got {self.min_token_prob!r}")
        require(isinstance(self.global_tree, bool), "global_tree", f"must be true or false, got {self.global_tree!r}")
        require(_is_int(self.max_cached_requests) and self.max_cached_requests >= 1, "max_cached_requests",
                f"must be an int >= 1, got {self.max_cached_requests!r}")
        require(_is_number(self.fallback_prob) and 0.0 <= self.fallback_prob <= 1.0, "fallback_prob",
                f"must be in [0, 1], got {self.fallback_prob!r}")
        require(self.datastore is None or isinstance(self.datastore, str), "datastore",
                f"must be the path of a datastore folder (specframe datastore build), got {self.datastore!r}")
        require(_is_int(self.min_match) and self.min_match >= 1, "min_match", f"must be an int >= 1, got {self.min_match!r}")
        require(_is_int(self.max_match) and self.max_match >= self.min_match, "max_match",
                f"must be an int >= min_match ({self.min_match}), got {self.max_match!r}")

    @property
    def spec_tokens(self) -> int:
        """``max_spec_tokens``, None read as ``max_depth``."""
        return self.max_depth if self.max_spec_tokens is None else self.max_spec_tokens


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class SuffixDrafter(Drafter):
    """SuffixDecoding: the reference's frequency-scored path over the request's and the global
    suffix tree, with the same match's other candidates for wider trees."""

    name = "suffix"
    Options = SuffixDrafterOptions
    needs_target_logits = False
    # Drafts depend only on committed tokens and earlier outputs, in a fixed order (docstring).
    replay = "exact"

    def __init__(self, options: SuffixDrafterOptions, target: Any) -> None:
        super().__init__(options, target)
        # The global tree is state across generations on purpose; without it, none is kept.
        self.persistent_state = bool(options.global_tree)
        self.cache = SuffixCache(options.max_depth, options.max_cached_requests if options.global_tree else 0)
        self.datastore: Datastore | None = load(options.datastore, self.vocab_size) if options.datastore else None
        self.tokens: list[int] = []
        self.unigram: dict[int, int] = {}
        self._reset_step()

    def _reset_step(self) -> None:
        """Forget the step's draft and memos (the committed sequence changed)."""
        # (tree the draft came from, or None for the datastore; matched node; token cap)
        self._choice: tuple[SuffixTree | None, int, int] | None = None
        self._cums: dict[tuple[int, ...], float] = {(): 1.0}
        self._rows: dict[tuple[int, ...], Ranked] = {}

    def begin(self, prompt_ids: torch.Tensor, target_hidden: Any = None) -> None:
        """Start a request on ``prompt_ids``: a fresh request tree, and its response's slot in
        the global tree."""
        prompt = [int(t) for t in torch.as_tensor(prompt_ids).flatten().tolist()]
        self.cache.start(prompt)
        self.tokens, self.unigram = [], {}
        self._count(prompt)
        self._reset_step()

    def commit(self, tokens: torch.Tensor, path: torch.Tensor | None = None, target_hidden: Any = None,
               tree: DraftTree | None = None) -> None:
        """Add the newly committed tokens (accepted drafts + bonus) to both trees."""
        new = [int(t) for t in torch.as_tensor(tokens).flatten().tolist()]
        self.cache.add(new)
        self._count(new)
        self._reset_step()

    def finish(self, output_ids: torch.Tensor) -> None:
        """The response in the global tree becomes the output exactly as emitted (cut at
        max_new_tokens and EOS, where the last commit may have run past the cut)."""
        self.cache.replace_response([int(t) for t in torch.as_tensor(output_ids).flatten().tolist()])

    def _count(self, tokens: list[int]) -> None:
        self.tokens.extend(tokens)
        for tok in tokens:
            self.unigram[tok] = self.unigram.get(tok, 0) + 1

    # ------------------------------------------------------------------ the step's draft
    def draft(self) -> Draft:
        """The step's draft as the reference computes it (module docstring); it fixes the
        source and match the rows come from."""
        return self._best()[0]

    def _best(self) -> tuple[Draft, SuffixTree | None]:
        opts = self.options
        args = (opts.spec_tokens, opts.max_spec_factor, opts.max_spec_offset, opts.min_token_prob)
        best, tree = self.cache.speculate(self.tokens, *args)
        if self.datastore is not None:
            other = self._datastore_draft()
            if other.score > best.score:
                return other, None
        return best, tree

    def _chosen(self) -> tuple[SuffixTree | None, int, int]:
        if self._choice is None:
            best, tree = self._best()
            limit = 0 if not best.match_len else cap(best.match_len, *self._cap_args())
            self._choice = (tree, best.node, limit)
        return self._choice

    def _cap_args(self) -> tuple[int, float, float]:
        opts = self.options
        return opts.spec_tokens, opts.max_spec_factor, opts.max_spec_offset

    def _datastore_draft(self) -> Draft:
        """The datastore's path: the most frequent continuation of its longest match (ties to
        the lower id), re-matched after each drafted token, scored as a tree's draft."""
        m = self.datastore.longest(self.tokens[-self.options.max_match :], self.options.min_match)[0]
        if not m:
            return Draft()
        draft, floor = Draft(match_len=m), f32(self.options.min_token_prob)
        prob, limit = 1.0, cap(m, *self._cap_args())
        while len(draft.tokens) < limit:
            found = self._datastore_children(tuple(draft.tokens))
            if found is None:
                break
            pairs, total = found
            tok, count = min(pairs, key=lambda p: (-p[1], p[0]))
            prob = f32(prob * f32(count / total))
            if prob < floor:
                break
            draft.tokens.append(tok)
            draft.probs.append(prob)
            draft.score = f32(draft.score + prob)
        return draft

    def _datastore_children(self, path: tuple[int, ...]) -> Children | None:
        query = (self.tokens + list(path))[-self.options.max_match :]
        m, counts = self.datastore.longest(query, self.options.min_match)
        return (list(counts.items()), sum(counts.values())) if m else None

    def children(self, path: tuple[int, ...]) -> Children | None:
        """The winning source's candidates after ``path`` (None: the path leaves it)."""
        tree, node, limit = self._chosen()
        if tree is None:
            return self._datastore_children(path) if limit else None
        for tok in path:
            node = tree.child(node, tok)
            if node < 0:
                return None
        return [(tree.token[c], tree.count[c]) for c in tree.children(node)], tree.count[node]

    # ------------------------------------------------------------------ rows
    def cumulative(self, path: tuple[int, ...]) -> float:
        """The reference's float32 probability of ``path`` (0 off the source's candidates)."""
        known = self._cums.get(path)
        if known is not None:
            return known
        parent = self.cumulative(path[:-1])
        found = self.children(path[:-1]) if parent else None
        count = dict(found[0]).get(path[-1], 0) if found else 0
        value = f32(parent * f32(count / found[1])) if count else 0.0
        self._cums[path] = value
        return value

    def ranked(self, path: tuple[int, ...]) -> Ranked:
        """The row after ``path`` as its finite entries: (float32 log-probs, ids), best first,
        ties toward the lower id (memoised per step)."""
        row = self._rows.get(path)
        if row is None:
            row = self._rows[path] = self._candidates(path) or self.fallback()
        return row

    def _candidates(self, path: tuple[int, ...]) -> Ranked | None:
        limit = self._chosen()[2]
        if len(path) >= limit:
            return None
        cum = self.cumulative(path)
        found = self.children(path) if cum else None
        if not found:
            return None
        pairs, total = found
        floor = f32(self.options.min_token_prob)
        kept = [(c, t) for t, c in pairs if t < self.vocab_size and f32(cum * f32(c / total)) >= floor]
        if not kept:
            return None
        logp = torch.tensor([c / total for c, _ in kept], dtype=torch.float64).log().float().tolist()
        ordered = sorted((-v, t) for v, (_, t) in zip(logp, kept))
        return [-v for v, _ in ordered], [t for _, t in ordered]

    def fallback(self) -> Ranked:
        """The single fallback entry (none with ``fallback_prob = 0``, the default)."""
        if self.options.fallback_prob == 0.0 or not self.unigram:
            return [], []
        # The most frequent token of the request, ties to the lower id (the n-gram drafter's).
        tok = min(self.unigram, key=lambda t: (-self.unigram[t], t))
        tok = tok if tok < self.vocab_size else 0
        return torch.tensor([math.log(self.options.fallback_prob)]).tolist(), [tok]

    # ------------------------------------------------------------------ drafting
    def _rows_for(self, tree: DraftTree, nodes: torch.Tensor) -> list[Ranked]:
        return [self.ranked(path) for path in drafted_paths(tree, nodes)]

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
