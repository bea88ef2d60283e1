"""The suffix tree of the ``suffix`` drafter, as SuffixDecoding's reference keeps it
(arctic-inference 0.3.0, ``csrc/suffix_decoding/suffix_tree.cc``).

A :class:`SuffixTree` holds several sequences. Every substring of at most ``max_depth`` tokens
of a sequence is a node; a node's ``count`` is how many times its substring occurs in the held
sequences (an occurrence at a sequence's end counts too, so a node's children may count less
than it does). The root's count is the number of tokens held.

Each node keeps its children in the reference's order: decreasing count, and among equal counts
the order the reference's linked lists leave them in. A new child goes last; a child whose count
rises moves just before the run of equal counts its previous sibling belongs to; one whose count
falls moves just after the run it leaves. The reference's path draft follows the first child,
so this order decides its drafts where counts tie. (The reference compresses single-child chains
into one node; which child comes first is the same, since only nodes with siblings are ordered.)

:meth:`SuffixTree.speculate` is the reference's path draft: for every match length 1 up to (not
including) the context's length, the draft that follows the first child from the matched node,
multiplying ``child.count / node.count``, stopping below ``min_token_prob`` and at
``min(max_spec_tokens, match_len * max_spec_factor + max_spec_offset)`` tokens; the one with the
highest score (the sum of its tokens' probabilities) wins, the longer match on a tie. The
arithmetic is float32, as the reference's, so that thresholds and ties fall the same way.

Cost (d = ``max_depth``): appending a token touches d nodes; removing a sequence of n tokens
touches n * d; a draft tries up to d match lengths of up to d dict probes each, plus its tokens.
Memory: up to d nodes per held token, each a few list slots and one dict entry.
"""

from __future__ import annotations

import struct
from bisect import bisect_left, bisect_right
from collections import deque
from dataclasses import dataclass, field
from functools import lru_cache

_FLOAT32 = struct.Struct("f")


def f32(value: float) -> float:
    """``value`` rounded to float32 (a C double-to-float cast). One float32 operation on float32
    operands is exactly the float64 result rounded once (53 >= 2 * 24 + 2 bits), so this
    reproduces C++ float math."""
    return _FLOAT32.unpack(_FLOAT32.pack(value))[0]


@dataclass
class Draft:
    """A path draft: its tokens, each token's probability, their float32 sum, and the length of
    the context suffix it continues (0: nothing drafted)."""

    tokens: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    score: float = 0.0
    match_len: int = 0
    #: The matched node (the draft's first token is one of its children); -1 for no match.
    node: int = -1


@lru_cache(maxsize=4096)
def cap(match_len: int, max_spec_tokens: int, max_spec_factor: float, max_spec_offset: float) -> int:
    """Most tokens drafted after a match of ``match_len`` tokens, as the reference computes it
    (float32 product and sum, then a double epsilon, truncated)."""
    scaled = f32(f32(match_len * f32(max_spec_factor)) + f32(max_spec_offset))
    return max(0, min(max_spec_tokens, int(scaled + 1e-6)))


ROOT = 0


class SuffixTree:
    """Substrings of up to ``max_depth`` tokens of several sequences, with occurrence counts.

    Nodes are integer ids into flat lists, not objects: a tree holds up to ``max_depth`` nodes
    per token, and as objects they made Python's cyclic garbage collector rescan the whole tree
    again and again (5x the cost of building it)."""

    def __init__(self, max_depth: int) -> None:
        self.max_depth = max_depth
        self.count: list[int] = [0]
        self.token: list[int] = [-1]
        self.parent: list[int] = [-1]
        #: The first child in the reference's order (-1: none).
        self.first: list[int] = [-1]
        self.kids: dict[tuple[int, int], int] = {}  # (node, token) -> child
        # The children in the reference's order, for nodes that ever had two or more (a
        # single child is `first`): most nodes have one child, and a list each would cost.
        self.order: dict[int, list[int]] = {}
        self._free: list[int] = []
        self.seqs: dict[int, list[int]] = {}
        # Per sequence, the nodes of its last max_depth suffixes: the next token extends each.
        self._active: dict[int, deque[int]] = {}
        # The latest undoable extend: its sequence and, per token, the active nodes before it
        # and each node it created (places -1) or moved (from, to).
        self._undo: tuple[int, list] | None = None

    # ------------------------------------------------------------------ nodes
    def children(self, node: int) -> list[int]:
        """The children of ``node`` in the reference's order."""
        listed = self.order.get(node)
        if listed is not None:
            return listed
        return [self.first[node]] if self.first[node] >= 0 else []

    def child(self, node: int, token: int) -> int:
        """The child of ``node`` for ``token`` (-1: none)."""
        return self.kids.get((node, token), -1)

    def _add_child(self, node: int, token: int) -> int:
        if self._free:
            new = self._free.pop()
            self.count[new], self.token[new], self.parent[new], self.first[new] = 1, token, node, -1
        else:
            new = len(self.count)
            self.count.append(1)
            self.token.append(token)
            self.parent.append(node)
            self.first.append(-1)
        self.kids[(node, token)] = new
        listed = self.order.get(node)
        if listed is not None:
            listed.append(new)
            self.first[node] = listed[0]
        elif self.first[node] < 0:
            self.first[node] = new
        else:  # a second child: from now on the order is a list
            self.order[node] = [self.first[node], new]
        return new

    def _drop_child(self, node: int, child: int) -> None:
        """Remove ``child`` of ``node`` and its whole subtree."""
        del self.kids[(node, self.token[child])]
        listed = self.order.get(node)
        if listed is not None:
            listed.remove(child)
            self.first[node] = listed[0] if listed else -1
        else:
            self.first[node] = -1
        stack = [child]
        while stack:
            n = stack.pop()
            for c in self.children(n):
                del self.kids[(n, self.token[c])]
                stack.append(c)
            self.order.pop(n, None)
            self._free.append(n)

    # ------------------------------------------------------------------ sequences
    def extend(self, seq_id: int, tokens: list[int], undoable: bool = False) -> None:
        """Append ``tokens`` to sequence ``seq_id`` (created if new). With ``undoable``,
        :meth:`undo` can take exactly this call back (and only the latest such call)."""
        seq = self.seqs.setdefault(seq_id, [])
        active = self._active.setdefault(seq_id, deque())
        log: list[tuple[deque[int], list[tuple[int, int, int]]]] = []
        kids = self.kids
        for token in tokens:
            token = int(token)
            if undoable:
                log.append((deque(active), []))
            active.append(ROOT)
            self.count[ROOT] += 1
            if len(active) > self.max_depth:
                active.popleft()
            seq.append(token)
            for i, node in enumerate(active):
                child = kids.get((node, token), -1)
                if child < 0:
                    child = self._add_child(node, token)
                    moved = (-1, -1)
                else:
                    moved = self._increment(child)
                if undoable:
                    log[-1][1].append((child, *moved))
                active[i] = child
        self._undo = (seq_id, log) if undoable else None

    def undoable(self, seq_id: int) -> int:
        """How many tokens :meth:`undo` would take back from ``seq_id`` (0: none)."""
        return len(self._undo[1]) if self._undo is not None and self._undo[0] == seq_id else 0

    def undo(self) -> list[int]:
        """Take back the latest ``extend(..., undoable=True)`` if nothing changed the tree since:
        every count and sibling order is as before it. Returns the tokens taken back."""
        seq_id, log = self._undo
        self._undo = None
        seq = self.seqs[seq_id]
        taken = seq[len(seq) - len(log) :]
        for before, changes in reversed(log):
            for child, i, j in reversed(changes):
                node = self.parent[child]
                if i < 0:  # created by the append: it is the last child again
                    self._drop_child(node, child)
                    continue
                self.count[child] -= 1
                listed = self.order.get(node)
                if listed is not None and i != j:
                    del listed[j]
                    listed.insert(i, child)
                    self.first[node] = listed[0]
            seq.pop()
            self.count[ROOT] -= 1
            self._active[seq_id] = before
        if not seq:
            del self.seqs[seq_id], self._active[seq_id]
        return taken

    def remove(self, seq_id: int) -> None:
        """Forget sequence ``seq_id``: every occurrence it contributed is subtracted."""
        seq = self.seqs.pop(seq_id)
        self._active.pop(seq_id, None)
        self._undo = None
        for start in range(len(seq)):
            node = ROOT
            self.count[ROOT] -= 1
            for token in seq[start : start + self.max_depth]:
                child = self.kids.get((node, token), -1)
                if child < 0:
                    break
                if self.count[child] > 1:
                    self._decrement(child)
                else:  # its last occurrence: the whole subtree goes with it
                    self._drop_child(node, child)
                    break
                node = child

    def match(self, context: list[int]) -> int:
        """The node of ``context`` (-1 where it does not occur)."""
        node = ROOT
        kids = self.kids
        for token in context:
            node = kids.get((node, token), -1)
            if node < 0:
                return -1
        return node

    def speculate(self, context: list[int], max_spec_tokens: int, max_spec_factor: float,
                  max_spec_offset: float, min_token_prob: float) -> Draft:
        """The reference's path draft after ``context`` (module docstring)."""
        best = Draft()
        for match_len in range(1, len(context)):
            node = self.match(context[len(context) - match_len :])
            if node < 0:
                break  # a longer suffix cannot occur where a shorter one does not
            limit = cap(match_len, max_spec_tokens, max_spec_factor, max_spec_offset)
            draft = self.follow(node, limit, min_token_prob)
            if draft.score >= best.score:
                best = draft
                best.match_len = match_len
        return best

    def follow(self, node: int, limit: int, min_token_prob: float) -> Draft:
        """The path from ``node`` along first children: at most ``limit`` tokens, each with the
        float32 product of ``child.count / parent.count`` along the way, none below
        ``min_token_prob``."""
        draft = Draft(node=node)
        floor = f32(min_token_prob)
        prob = 1.0
        while len(draft.tokens) < limit and self.first[node] >= 0:
            child = self.first[node]
            prob = f32(prob * f32(self.count[child] / self.count[node]))
            if prob < floor:
                break
            draft.tokens.append(self.token[child])
            draft.probs.append(prob)
            draft.score = f32(draft.score + prob)
            node = child
        return draft

    # ------------------------------------------------------------------ sibling order
    def _increment(self, child: int) -> tuple[int, int]:
        """Count one more occurrence; the node moves before the run of its previous sibling where
        its new count reaches that run's (the reference's ``_increment_count``). Returns its
        place before and after."""
        count = self.count
        listed = self.order.get(self.parent[child])
        if listed is None:
            count[child] += 1
            return 0, 0
        i = listed.index(child)
        c = count[child]
        if i == 0 or count[listed[i - 1]] > c + 1:
            count[child] = c + 1
            return i, i
        # The run holding the previous sibling starts at the first place of its count.
        j = bisect_left(listed, -count[listed[i - 1]], hi=i, key=lambda n: -count[n])
        del listed[i]
        listed.insert(j, child)
        count[child] = c + 1
        self.first[self.parent[child]] = listed[0]
        return i, j

    def _decrement(self, child: int) -> None:
        """Count one occurrence less; the node moves after the last of its run of equal counts
        (the reference's ``_decrement_count``)."""
        count = self.count
        listed = self.order.get(self.parent[child])
        c = count[child]
        count[child] = c - 1
        if listed is None:
            return
        count[child] = c  # find its run's end with its count as it was
        i = listed.index(child)
        j = bisect_right(listed, -c, lo=i, key=lambda n: -count[n]) - 1
        count[child] = c - 1
        if j != i:
            del listed[i]
            listed.insert(j, child)
            self.first[self.parent[child]] = listed[0]
