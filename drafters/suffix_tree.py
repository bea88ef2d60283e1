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
Memory: up to d nodes per held token.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np


def f32(value: float) -> float:
    """``value`` rounded to float32. One float32 operation on float32 operands is exactly the
    float64 result rounded once (53 >= 2 * 24 + 2 bits), so this reproduces C++ float math."""
    return float(np.float32(value))


class Node:
    """A substring: its last token, occurrence count, parent and ordered children."""

    __slots__ = ("token", "count", "parent", "children", "order")

    def __init__(self, token: int, parent: Node | None) -> None:
        self.token = token
        self.count = 0
        self.parent = parent
        self.children: dict[int, Node] = {}
        # The children in the reference's order (the dict finds one; this ranks them).
        self.order: list[Node] = []


@dataclass
class Draft:
    """A path draft: its tokens, each token's probability, their float32 sum, and the length of
    the context suffix it continues (0: nothing drafted)."""

    tokens: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    score: float = 0.0
    match_len: int = 0
    #: The matched node (the draft's first token is one of its children); None for no match.
    node: Node | None = None


def cap(match_len: int, max_spec_tokens: int, max_spec_factor: float, max_spec_offset: float) -> int:
    """Most tokens drafted after a match of ``match_len`` tokens, as the reference computes it
    (float32 product and sum, then a double epsilon, truncated)."""
    scaled = f32(f32(match_len * f32(max_spec_factor)) + f32(max_spec_offset))
    return max(0, min(max_spec_tokens, int(scaled + 1e-6)))


class SuffixTree:
    """Substrings of up to ``max_depth`` tokens of several sequences, with occurrence counts."""

    def __init__(self, max_depth: int) -> None:
        self.max_depth = max_depth
        self.root = Node(-1, None)
        self.seqs: dict[int, list[int]] = {}
        # Per sequence, the nodes of its last max_depth suffixes: the next token extends each.
        self._active: dict[int, deque[Node]] = {}
        # The latest undoable extend: its sequence and, per token, the active nodes before it
        # and each node it created (places -1) or moved (from, to).
        self._undo: tuple[int, list] | None = None

    def extend(self, seq_id: int, tokens: list[int], undoable: bool = False) -> None:
        """Append ``tokens`` to sequence ``seq_id`` (created if new). With ``undoable``,
        :meth:`undo` can take exactly this call back (and only the latest such call)."""
        seq = self.seqs.setdefault(seq_id, [])
        active = self._active.setdefault(seq_id, deque())
        log: list[tuple[deque[Node], list[tuple[Node, int, int]]]] = []
        for token in tokens:
            token = int(token)
            if undoable:
                log.append((deque(active), []))
            active.append(self.root)
            self.root.count += 1
            if len(active) > self.max_depth:
                active.popleft()
            seq.append(token)
            for i, node in enumerate(active):
                child = node.children.get(token)
                if child is None:
                    child = node.children[token] = Node(token, node)
                    child.count = 1
                    node.order.append(child)
                    moved = (-1, -1)
                else:
                    moved = _increment(child)
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
                order = child.parent.order
                if i < 0:  # created by the append: it is the last child again
                    order.pop()
                    del child.parent.children[child.token]
                    continue
                child.count -= 1
                del order[j]
                order.insert(i, child)
            seq.pop()
            self.root.count -= 1
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
            node = self.root
            node.count -= 1
            for token in seq[start : start + self.max_depth]:
                child = node.children.get(token)
                if child is None:
                    break
                if child.count > 1:
                    _decrement(child)
                else:  # its last occurrence: the whole subtree goes with it
                    del node.children[token]
                    node.order.remove(child)
                    break
                node = child

    def match(self, context: list[int]) -> Node | None:
        """The node of ``context`` (None where it does not occur)."""
        node = self.root
        for token in context:
            node = node.children.get(token)
            if node is None:
                return None
        return node

    def speculate(self, context: list[int], max_spec_tokens: int, max_spec_factor: float,
                  max_spec_offset: float, min_token_prob: float) -> Draft:
        """The reference's path draft after ``context`` (module docstring)."""
        best = Draft()
        for match_len in range(1, len(context)):
            node = self.match(context[len(context) - match_len :])
            if node is None:
                break  # a longer suffix cannot occur where a shorter one does not
            limit = cap(match_len, max_spec_tokens, max_spec_factor, max_spec_offset)
            draft = follow(node, limit, min_token_prob)
            if draft.score >= best.score:
                best = draft
                best.match_len = match_len
        return best


def follow(node: Node, limit: int, min_token_prob: float) -> Draft:
    """The path from ``node`` along first children: at most ``limit`` tokens, each with the
    float32 product of ``child.count / parent.count`` along the way, none below
    ``min_token_prob``."""
    draft = Draft(node=node)
    floor = f32(min_token_prob)
    prob = 1.0
    while len(draft.tokens) < limit and node.order:
        child = node.order[0]
        prob = f32(prob * f32(child.count / node.count))
        if prob < floor:
            break
        draft.tokens.append(child.token)
        draft.probs.append(prob)
        draft.score = f32(draft.score + prob)
        node = child
    return draft


# ---------------------------------------------------------------------- sibling order
def _run_start(order: list[Node], i: int) -> int:
    """First index of the run of equal counts that holds ``order[i]``."""
    count = order[i].count
    while i > 0 and order[i - 1].count == count:
        i -= 1
    return i


def _increment(node: Node) -> tuple[int, int]:
    """Count one more occurrence; the node moves before the run of its previous sibling where
    its new count reaches that run's (the reference's ``_increment_count``). Returns its place
    before and after."""
    order = node.parent.order
    i = order.index(node)
    if i == 0 or order[i - 1].count > node.count + 1:
        node.count += 1
        return i, i
    j = _run_start(order, i - 1)
    del order[i]
    order.insert(j, node)
    node.count += 1
    return i, j


def _decrement(node: Node) -> None:
    """Count one occurrence less; the node moves after the last of its run of equal counts
    (the reference's ``_decrement_count``)."""
    order = node.parent.order
    i = order.index(node)
    j = i
    while j + 1 < len(order) and order[j + 1].count == node.count:
        j += 1
    node.count -= 1
    if j != i:
        del order[i]
        order.insert(j, node)
