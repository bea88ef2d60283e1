"""The suffix automaton of SAM-Decoding (Hu et al., arXiv 2411.10666): the data structure, then the
algorithms as functions over it.

A suffix automaton over a token string ``x_1 .. x_L`` has one state per class of substrings that
end at the same set of positions. Each state keeps

- ``next``: its transitions, token -> state;
- ``link``: its suffix link (the state of its longest suffix in another class; -1 at the root);
- ``length``: the length of the longest substring in its class;
- ``min_endpos``: the first position (1-based) where its substrings end;
- ``count``: how many positions they end at (kept only by a :class:`FrozenAutomaton`, where the
  static automaton's rows weigh continuations by it).

``tokens`` holds the string with a sentinel at index 0 (``tokens[i] = x_i``), as the authors'
``input_ids``, so the continuation after a match whose first occurrence ends at ``e`` is
``tokens[e + 1 :]``.

Two stores answer the same questions: :class:`Automaton` grows online (the request's prompt and
output, dicts of transitions) and :class:`FrozenAutomaton` is read-only (a corpus, built once by
``specframe datastore build --kind sam`` and loaded from arrays: transitions in CSR form).

The functions are the authors' ``DynSAM`` (``samd/sam/dyn_sam.py``), one for one: :func:`extend`
is ``add_state``, :func:`transfer` is ``transfer_state``, :func:`to_anc` and :func:`continuation`
make ``gen_draft``. ``tests/test_parity_sam.py`` holds them to that file on random streams.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

#: ``tokens[0]``: the authors' sentinel before the first token.
SENTINEL = -1


@dataclass
class Automaton:
    """An online suffix automaton over a growing token string (root: state 0).

    Attributes:
        next, link, length, min_endpos: per state (module docstring).
        tokens: the string, ``tokens[0]`` the sentinel.
        last: the state of the whole string.
    """

    next: list[dict[int, int]] = field(default_factory=lambda: [{}])
    link: list[int] = field(default_factory=lambda: [-1])
    length: list[int] = field(default_factory=lambda: [0])
    min_endpos: list[int] = field(default_factory=lambda: [0])
    tokens: list[int] = field(default_factory=lambda: [SENTINEL])
    last: int = 0

    @property
    def size(self) -> int:
        """Tokens in the string."""
        return len(self.tokens) - 1

    def child(self, state: int, token: int) -> int:
        """The transition of ``state`` on ``token``, -1 if none."""
        return self.next[state].get(token, -1)

    def _new_state(self, next_: dict[int, int], link: int, length: int, min_endpos: int) -> int:
        self.next.append(next_)
        self.link.append(link)
        self.length.append(length)
        self.min_endpos.append(min_endpos)
        return len(self.next) - 1


def extend(sam: Automaton, token: int) -> None:
    """Append ``token`` to the string (the standard online construction, the authors' ``add_state``)."""
    sam.tokens.append(token)
    end = sam.size
    cur = sam._new_state({}, -1, end, end)
    p = sam.last
    while p != -1 and token not in sam.next[p]:
        sam.next[p][token] = cur
        p = sam.link[p]
    if p == -1:
        sam.link[cur] = 0
    else:
        q = sam.next[p][token]
        if sam.length[p] + 1 == sam.length[q]:
            sam.link[cur] = q
        else:
            # The clone keeps q's first end position: its substrings first ended where q's did.
            clone = sam._new_state(dict(sam.next[q]), sam.link[q], sam.length[p] + 1, sam.min_endpos[q])
            while p != -1 and sam.next[p].get(token) == q:
                sam.next[p][token] = clone
                p = sam.link[p]
            sam.link[q] = sam.link[cur] = clone
    sam.last = cur


@dataclass
class FrozenAutomaton:
    """A read-only suffix automaton: per-state arrays, transitions in CSR form (``offsets[s] ..
    offsets[s + 1]`` index ``edge_tokens`` sorted ascending and their ``edge_targets``)."""

    link: list[int]
    length: list[int]
    min_endpos: list[int]
    count: list[int]
    offsets: list[int]
    edge_tokens: list[int]
    edge_targets: list[int]
    tokens: list[int]

    @property
    def size(self) -> int:
        """Tokens in the string."""
        return len(self.tokens) - 1

    def child(self, state: int, token: int) -> int:
        """The transition of ``state`` on ``token``, -1 if none (a binary search of its edges)."""
        lo, hi = self.offsets[state], self.offsets[state + 1]
        i = bisect_left(self.edge_tokens, token, lo, hi)
        return self.edge_targets[i] if i < hi and self.edge_tokens[i] == token else -1

    def children(self, state: int) -> list[tuple[int, int]]:
        """``(token, state)`` of every transition of ``state``, tokens ascending."""
        lo, hi = self.offsets[state], self.offsets[state + 1]
        return list(zip(self.edge_tokens[lo:hi], self.edge_targets[lo:hi]))


def freeze(sam: Automaton) -> FrozenAutomaton:
    """The read-only form of ``sam``, with each state's end-position count (1 for every state
    that ends a prefix, summed up the suffix links, longest states first; the authors' StaticSAM
    counts the same by walking the links at each token)."""
    n = len(sam.next)
    count = [0] * n
    for state in range(1, n):
        # A state that ends a prefix was created by extend (its length is its first end); a clone
        # is shorter than its first end.
        count[state] = int(sam.length[state] == sam.min_endpos[state])
    for state in sorted(range(1, n), key=lambda s: -sam.length[s]):
        count[sam.link[state]] += count[state]
    count[0] = 0  # the root's (the empty string's) is never read; 0, as the authors keep it
    offsets, edge_tokens, edge_targets = [0], [], []
    for edges in sam.next:
        for token in sorted(edges):
            edge_tokens.append(token)
            edge_targets.append(edges[token])
        offsets.append(len(edge_tokens))
    return FrozenAutomaton(list(sam.link), list(sam.length), list(sam.min_endpos), count, offsets,
                           edge_tokens, edge_targets, list(sam.tokens))


AnyAutomaton = Automaton | FrozenAutomaton


def transfer(sam: AnyAutomaton, state: int, length: int, token: int) -> tuple[int, int]:
    """The match after reading ``token``: from the match ``(state, length)`` (the longest suffix of
    the text read so far that ``sam``'s string holds, and its state), the longest suffix of the
    text plus ``token``: follow suffix links until a transition on ``token`` exists (the
    authors' ``transfer_state``, which sets the length to the linked state's longest)."""
    while state != 0 and sam.child(state, token) < 0:
        state = sam.link[state]
        length = sam.length[state]
    nxt = sam.child(state, token)
    return (nxt, length + 1) if nxt >= 0 else (0, 0)


def to_anc(sam: AnyAutomaton, state: int, n_predicts: int) -> int:
    """The authors' ``to_anc``: up the suffix links (shorter matches, earlier first occurrences)
    until the first occurrence leaves ``n_predicts`` tokens after it, or the next link is the root."""
    if state != 0:
        while sam.link[state] != 0 and n_predicts > sam.size - sam.min_endpos[state]:
            state = sam.link[state]
    return state


def continuation(sam: AnyAutomaton, state: int, n: int) -> list[int]:
    """The ``n`` tokens (fewer at the string's end) after the first occurrence of ``state``'s
    substrings: the authors' ``input_ids[endpos + 1 : endpos + 1 + n]``."""
    end = sam.min_endpos[state]
    return list(sam.tokens[end + 1 : end + 1 + max(n, 0)])


@dataclass
class Cursor:
    """A match kept while text is read: the state and length of the longest suffix of the text
    read that the automaton's string holds (the authors' ``cur_index``, ``cur_length``)."""

    state: int = 0
    length: int = 0

    def read(self, sam: AnyAutomaton, tokens: list[int]) -> None:
        """Advance over ``tokens`` (the authors' ``transfer_tokens``)."""
        for token in tokens:
            self.state, self.length = transfer(sam, self.state, self.length, token)


def add_tokens(sam: Automaton, cursor: Cursor, tokens: list[int]) -> None:
    """Read each token with ``cursor`` (against the string before it), then append it: the
    authors' ``add_tokens``, whose cursor is the match of the text against its own past."""
    for token in tokens:
        cursor.state, cursor.length = transfer(sam, cursor.state, cursor.length, token)
        extend(sam, token)
