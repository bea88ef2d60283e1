"""Drafter ``sam``: SAM-Decoding (Hu et al., arXiv 2411.10666) by its authors' rules
(hyx1999/SAM-Decoding, and the copy Spec-Bench runs, ``model/samd``), model-free or with any
registered drafter as its auxiliary (SAMD).

Two suffix automata (:mod:`specframe.drafters.sam_automaton`): the request's, grown online over
the prompt and every committed token, and optionally a static one over a corpus (``datastore``:
a folder written by ``specframe datastore build --kind sam``, :mod:`specframe.drafters.sam_store`).
Each keeps the match of the committed text (its longest suffix the automaton's string holds), and
a step looks up that match extended by the root token (the authors' ``start_token``), as the
authors' ``DraftModel.lookup``:

- **with an auxiliary drafter** (``auxiliary = "recycle"``, or ``["eagle3", {...}]``; the authors'
  ``tree_method``): the static match is discounted by ``len_bias``; when the longer of the two
  matches reaches ``len_threshold`` the step drafts the automaton's sequence (the request's on a
  tie): ``n_predicts - 1`` tokens after the match's first occurrence, for the request's automaton
  from the ancestor :func:`~specframe.drafters.sam_automaton.to_anc` picks so that as many follow
  it; otherwise the step's rows are the auxiliary drafter's, whatever policy shapes them.
- **alone** (no ``auxiliary``, Spec-Bench's SAM-only path): the longer match wins, no bias, the
  request's on a tie; the request's automaton drafts the ``min(n_predicts, 1 + int(m * alpha))
  - 1`` tokens after its match of length m (``gen_dyn_draft``), the static one a tree: at each
  node its ``top_k`` most frequent continuations, each at ``count(child) / count(state)``, to the
  same depth.

Rows, for any policy: a sequence's node on the sequence gets its next token at probability 1;
every other row (past the sequence's end, off it, or a static node with no continuation) holds
one fallback token, 0 at ``log(fallback_prob)``, the token the authors pad a short draft with.
The step's source is chosen at its first row and holds for the whole step (the auxiliary drafts a
whole tree or sits the step out, as a part of ``hybrid``'s cascade), so the choice costs no host
read: both matches live on the host. The auxiliary gets every ``begin`` and ``commit``, drafting
or not, with the target outputs it declares.

Replay: ``"exact"`` alone (drafts depend only on committed tokens); with an auxiliary, the
auxiliary's. Cost: ``commit`` adds each token to the request's automaton (amortised O(1) state
changes) and advances both matches; a step's lookup is one transition; a row walks its path.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass
from typing import Any

import torch

from specframe.interfaces import Drafter, wants_prompt_logits
from specframe.options import require
from specframe.search_space import tunable
from specframe.selection import sparse_top
from specframe.tree import DraftTree, drafted_paths

from .hybrid import make_part, part_inputs, split_entry, weakest_replay
from .sam_automaton import Automaton, Cursor, FrozenAutomaton, add_tokens, continuation, to_anc, transfer
from .sam_store import load

Ranked = tuple[list[float], list[int]]
#: The token the authors pad a short draft with, and the fallback row's token here.
PAD = 0


@dataclass
class SamDrafterOptions:
    """Options of the ``sam`` drafter (defaults: the authors' ``SamdConfig`` and ``DynSAM``).

    Attributes:
        n_predicts: tokens of a sequence draft, the root included (``n_predicts``).
        len_threshold: with ``auxiliary``: the shortest match the automata draft from.
        len_bias: with ``auxiliary``: subtracted from the static automaton's match.
        alpha: alone: a match of m tokens drafts ``min(n_predicts, 1 + int(m * alpha)) - 1``.
        auxiliary: the drafter of the steps whose match is short: a registered name or
            ``[name, {options}]``; none: the automata draft every step.
        auxiliary_depth: with ``auxiliary``: the levels the auxiliary drafts on its steps
            (nodes of depth below it); deeper nodes get the fallback row without an auxiliary
            forward. One policy shapes both sources' trees, so a policy deep enough for the
            automata's drafts would otherwise run the auxiliary at every level, where SAMD
            switches to the auxiliary's own tree (EAGLE-2's depth 5). None: every level.
        datastore: a static automaton's folder (``specframe datastore build --kind sam``).
        top_k: alone, from the static automaton: continuations per node (the authors' ``K``).
        fallback_prob: probability of the fallback token (token 0) in a row with no candidate.
    """

    n_predicts: int = tunable(40, low=4, high=64, log=True)
    len_threshold: int = tunable(5, low=1, high=12)
    len_bias: int = tunable(5, low=0, high=10)
    alpha: float = tunable(4.0, low=0.5, high=8.0)
    auxiliary: Any = None
    auxiliary_depth: int | None = None
    datastore: str | None = None
    top_k: int = 8
    fallback_prob: float = 1e-6

    def __post_init__(self) -> None:
        for key in ("n_predicts", "len_threshold", "len_bias", "top_k"):
            value = getattr(self, key)
            low = 1 if key in ("n_predicts", "top_k") else 0
            require(isinstance(value, int) and not isinstance(value, bool) and value >= low, key,
                    f"must be an int >= {low}, got {value!r}")
        require(isinstance(self.alpha, (int, float)) and not isinstance(self.alpha, bool) and self.alpha > 0
                and math.isfinite(self.alpha), "alpha", f"must be a number > 0, got {self.alpha!r}")
        if self.auxiliary is not None:
            split_entry(self.auxiliary, "auxiliary")
        require(self.auxiliary_depth is None or (isinstance(self.auxiliary_depth, int)
                and not isinstance(self.auxiliary_depth, bool) and self.auxiliary_depth >= 1), "auxiliary_depth",
                f"must be an int >= 1 or None (every level), got {self.auxiliary_depth!r}")
        require(self.datastore is None or isinstance(self.datastore, str), "datastore",
                f"must be the path of a SAM datastore folder (specframe datastore build --kind sam), "
                f"got {self.datastore!r}")
        require(isinstance(self.fallback_prob, (int, float)) and 0.0 < self.fallback_prob <= 1.0, "fallback_prob",
                f"must be in (0, 1] (0 would leave rows with nothing to draft), got {self.fallback_prob!r}")


@dataclass(frozen=True)
class SamChoice:
    """A step's lookup: which source drafts, the match that decided, and what it drafts.

    Attributes:
        source: ``"dynamic"`` (the request's automaton), ``"static"`` (the corpus's) or
            ``"auxiliary"``.
        match: the winning match length (the static one less ``len_bias`` with an auxiliary);
            with ``"auxiliary"``, the longer of the two.
        draft: a sequence source's tokens after the root (empty for ``"auxiliary"`` and for the
            static tree of the model-free mode).
        state, depth: the static tree's matched state and its depth cap (model-free mode only).
    """

    source: str
    match: int
    draft: tuple[int, ...] = ()
    state: int = -1
    depth: int = 0


class SamDrafter(Drafter):
    """SAM-Decoding: suffix-automaton drafts from the request and a corpus, and an auxiliary
    drafter's tree where the match is short (module docstring)."""

    name = "sam"
    Options = SamDrafterOptions
    replay = "exact"

    def __init__(self, options: SamDrafterOptions, target: Any) -> None:
        super().__init__(options, target)
        self.static: FrozenAutomaton | None = load(options.datastore, self.vocab_size) if options.datastore else None
        self.auxiliary: Drafter | None = None
        if options.auxiliary is not None:
            self.auxiliary = make_part(options.auxiliary, target, "the auxiliary of 'sam'", "auxiliary")
            aux = self.auxiliary
            self.needs_target_hidden = getattr(aux, "needs_target_hidden", False)
            self.needs_target_logits = getattr(aux, "needs_target_logits", False)
            self.needs_prompt_logits = wants_prompt_logits(aux)
            self.persistent_state = getattr(aux, "persistent_state", False)
            self.learns_from_verdicts = getattr(aux, "learns_from_verdicts", False)
            self.uses_clock = getattr(aux, "uses_clock", False)
            self.replay = weakest_replay(["exact", getattr(aux, "replay", "unsupported")])
        #: Steps each source drafted (``dynamic``, ``static``, ``auxiliary``).
        self.steps_by_source = {"dynamic": 0, "static": 0, "auxiliary": 0}
        self._start([])

    def _start(self, history: list[int]) -> None:
        """A fresh request automaton over ``history`` (all committed tokens but the root)."""
        self.dynamic, self.cursor, self.static_cursor = Automaton(), Cursor(), Cursor()
        self._read(history)
        self._choice: SamChoice | None = None
        self._rows: dict[tuple[int, ...], Ranked] = {}

    def _read(self, tokens: list[int]) -> None:
        add_tokens(self.dynamic, self.cursor, tokens)
        if self.static is not None:
            self.static_cursor.read(self.static, tokens)

    # ------------------------------------------------------------------ life cycle
    def begin(self, prompt_ids: torch.Tensor, target_hidden: Any = None,
              target_logits: torch.Tensor | None = None) -> None:
        """Start a request: the automaton holds the prompt but its last token, the first root."""
        prompt = [int(t) for t in torch.as_tensor(prompt_ids).flatten().tolist()]
        self._start(prompt[:-1])
        self.root = prompt[-1]
        if self.auxiliary is not None:
            logits = target_logits if wants_prompt_logits(self.auxiliary) else None
            self.auxiliary.begin(prompt_ids, **part_inputs(self.auxiliary, target_hidden, logits))

    def commit(self, tokens: torch.Tensor, path: torch.Tensor | None = None, target_hidden: Any = None,
               tree: DraftTree | None = None, target_logits: torch.Tensor | None = None) -> None:
        """Add the old root and the new tokens but the last (the next root) to the automaton,
        as the authors add a step's accepted tokens, its start token first."""
        new = [int(t) for t in torch.as_tensor(tokens).flatten().tolist()]
        if new:
            self._read([self.root, *new[:-1]])
            self.root = new[-1]
        self._choice, self._rows = None, {}
        if self.auxiliary is not None:
            self.auxiliary.commit(tokens, path, tree=tree,
                                  **part_inputs(self.auxiliary, target_hidden, target_logits))

    def set_clock(self, clock: Any) -> None:
        """The auxiliary reads ``clock`` from now on."""
        if self.auxiliary is not None:
            self.auxiliary.set_clock(clock)

    # ------------------------------------------------------------------ the step's lookup
    def choice(self) -> SamChoice:
        """The step's source and draft (the authors' ``DraftModel.lookup``), decided once."""
        if self._choice is None:
            self._choice = self._decide()
            self.steps_by_source[self._choice.source] += 1
        return self._choice

    def _decide(self) -> SamChoice:
        opts, root = self.options, self.root
        dyn_state, dyn_match = transfer(self.dynamic, self.cursor.state, self.cursor.length, root)
        static_state, static_match = 0, 0
        if self.static is not None:
            static_state, static_match = transfer(self.static, self.static_cursor.state, self.static_cursor.length, root)
        if self.auxiliary is None:
            return self._alone(dyn_state, dyn_match, static_state, static_match)
        static_match -= opts.len_bias
        if max(dyn_match, static_match) < opts.len_threshold:
            return SamChoice("auxiliary", max(dyn_match, static_match))
        n = opts.n_predicts - 1
        if dyn_match >= static_match:
            draft = continuation(self.dynamic, to_anc(self.dynamic, dyn_state, opts.n_predicts), n)
            return SamChoice("dynamic", dyn_match, tuple(draft))
        return SamChoice("static", static_match, tuple(_until_separator(continuation(self.static, static_state, n))))

    def _alone(self, dyn_state: int, dyn_match: int, static_state: int, static_match: int) -> SamChoice:
        """Spec-Bench's SAM-only lookup: the longer match, a draft as long as it warrants."""
        opts = self.options
        if dyn_match >= static_match:
            n = min(opts.n_predicts, 1 + int(dyn_match * opts.alpha)) - 1
            return SamChoice("dynamic", dyn_match, tuple(continuation(self.dynamic, dyn_state, n)))
        depth = min(opts.n_predicts, 1 + int(static_match * opts.alpha)) - 1
        return SamChoice("static", static_match, state=static_state, depth=depth)

    # ------------------------------------------------------------------ rows
    def ranked(self, path: tuple[int, ...]) -> Ranked:
        """The row after ``path`` on a step the automata draft: (log-probs, ids), best first."""
        row = self._rows.get(path)
        if row is None:
            row = self._rows[path] = self._candidates(path) or ([math.log(self.options.fallback_prob)], [PAD])
        return row

    def _candidates(self, path: tuple[int, ...]) -> Ranked | None:
        choice = self.choice()
        if choice.state < 0:
            d = len(path)
            return ([0.0], [choice.draft[d]]) if d < len(choice.draft) and path == choice.draft[:d] else None
        if len(path) >= choice.depth:
            return None
        state = choice.state
        for token in path:
            state = self.static.child(state, token)
            if state < 0:
                return None
        total = self.static.count[state]
        kids = [(self.static.count[s], t) for t, s in self.static.children(state) if 0 <= t < self.vocab_size]
        # The authors' K most frequent continuations (ties toward the lower id here).
        kids = sorted(kids, key=lambda ct: (-ct[0], ct[1]))[: self.options.top_k]
        if not kids or not total:
            return None
        return [math.log(c / total) for c, _ in kids], [t for _, t in kids]

    def _own_rows(self, tree: DraftTree, nodes: torch.Tensor) -> list[Ranked]:
        return [self.ranked(path) for path in drafted_paths(tree, nodes)]

    def expand(self, tree: DraftTree, nodes: torch.Tensor) -> torch.Tensor:
        """Log-probs ``[len(nodes), V]``: the auxiliary's on its steps (to ``auxiliary_depth``),
        else the automata's rows."""
        return self._dispatch(tree, nodes, self.auxiliary.expand if self.auxiliary is not None else None,
                              self._own_expand)

    def expand_top(self, tree: DraftTree, nodes: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`expand` then :func:`specframe.topk_per_row`, built from the rows' few candidates."""
        aux = None if self.auxiliary is None else lambda t, n: self.auxiliary.expand_top(t, n, k)
        return self._dispatch(tree, nodes, aux, lambda t, n: self._own_expand_top(t, n, k))

    def _dispatch(self, tree: DraftTree, nodes: torch.Tensor, auxiliary: Any, own: Any) -> Any:
        """``own(tree, nodes)`` on the automata's steps; on the auxiliary's, ``auxiliary`` for
        the nodes above ``auxiliary_depth`` and ``own`` (the fallback row) below, rows in order."""
        if self.choice().source != "auxiliary":
            return own(tree, nodes)
        limit = self.options.auxiliary_depth
        deep = [False] * len(nodes) if limit is None else [d >= limit for d in tree.depths[nodes].tolist()]
        if not any(deep):
            return auxiliary(tree, nodes)
        if all(deep):
            return own(tree, nodes)
        keep = torch.tensor([not d for d in deep], device=nodes.device)
        near, far = auxiliary(tree, nodes[keep]), own(tree, nodes[~keep])
        order = torch.cat([keep.nonzero().flatten(), (~keep).nonzero().flatten()]).argsort()
        if isinstance(near, torch.Tensor):
            return torch.cat([near, far.to(near.device)])[order.to(near.device)]
        return tuple(torch.cat([a, b.to(a.device)])[order.to(a.device)] for a, b in zip(near, far))

    def _own_expand(self, tree: DraftTree, nodes: torch.Tensor) -> torch.Tensor:
        rows = self._own_rows(tree, nodes)
        out = torch.full((len(rows), self.vocab_size), float("-inf"), dtype=torch.float32)
        for r, (vals, toks) in enumerate(rows):
            out[r, torch.tensor(toks)] = torch.tensor(vals, dtype=torch.float32)
        return out.to(tree.device)

    def _own_expand_top(self, tree: DraftTree, nodes: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # float32 as expand's rows, so the two agree to the bit.
        rows = [(array("f", vals).tolist(), toks) for vals, toks in self._own_rows(tree, nodes)]
        return sparse_top(rows, k, self.vocab_size, tree.device)

def _until_separator(tokens: list[int]) -> list[int]:
    """``tokens`` up to the first negative one (a corpus without end-of-sequence token separates
    its documents with -1)."""
    for i, token in enumerate(tokens):
        if token < 0:
            return tokens[:i]
    return tokens
