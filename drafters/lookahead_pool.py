"""Lookahead decoding's state, host side: the Jacobi window and the n-gram pool, by ``lade`` 0.0.2's
rules (hao-ai-lab/LookaheadDecoding, the package Spec-Bench runs; docs/parity.md).

The window holds ``N - 1`` levels of guessed tokens. Level 0 starts as ``W + N - 3`` tokens drawn
from the prompt with ``random.Random(seed).choice`` (lade seeds Python's ``random`` with 10 and
calls ``random.choice(prompt)``), and each step's target forward predicts the next level from the
last one; while the window fills, every level drops its first token and the new level keeps all
but its first prediction. Once full (levels of ``W - 1, W, ..., W`` tokens), every step adds one
``N``-gram per window column to the pool (:meth:`NgramPool.update`, lade's inline
``update_token_map``) and shifts the window by one (``ALWAYS_FWD_ONE``): level 0 becomes level
1 without its first token, each level the next, and the last level the step's predictions.

:func:`jacobi_mask` is the visibility among the root and the window rows that lade's
``j_make_causal_mask_multilevel`` builds; :func:`window_offsets` their positions.
"""

from __future__ import annotations

import random
from typing import Sequence

import torch

Gram = tuple[int, ...]


class NgramPool:
    """lade's ``token_map``: key token -> its ``N - 1``-token continuations, an LRU list of at
    most ``guess_set`` per key (oldest first; a repeated one moves to the end)."""

    def __init__(self, level: int, guess_set: int) -> None:
        self.level = level
        self.guess_set = guess_set
        self.map: dict[int, list[Gram]] = {}

    def add(self, key: int, gram: Gram) -> None:
        """Put ``gram`` last in ``key``'s list, dropping the oldest when the list is full."""
        grams = self.map.setdefault(key, [])
        if gram in grams:
            grams.remove(gram)
        elif len(grams) >= self.guess_set:
            del grams[0]
        grams.append(gram)

    def update(self, root: int, levels: Sequence[Sequence[int]], new: Sequence[int]) -> None:
        """One step's n-grams: column ``i`` of the full window (levels ``1 .. N - 2``) followed by
        its new prediction ``new[i]``, keyed by the token before it (the step's root for column
        0, level 0's token ``i - 1`` after that), columns in order as lade adds them."""
        width = len(new)
        for i in range(width):
            key = root if i == 0 else levels[0][i - 1]
            self.add(int(key), tuple(int(levels[ll][i]) for ll in range(1, self.level - 1)) + (int(new[i]),))

    def guesses(self, key: int) -> list[Gram]:
        """``key``'s continuations, oldest first (lade's guess order)."""
        return list(self.map.get(key, ()))


class JacobiWindow:
    """The ``N - 1`` levels of lade's ``past_tokens`` and how a step moves them (module docstring)."""

    def __init__(self, prompt: Sequence[int], level: int, window: int, seed: int) -> None:
        self.level, self.window = level, window
        rng = random.Random(seed)
        first = [rng.choice(list(prompt)) for _ in range(window + level - 3)]
        self.levels: list[list[int] | None] = [first] + [None] * (level - 2)
        self.fill = 0  # lade's fill_level: the last level the forward carries

    @property
    def full(self) -> bool:
        """Every level holds tokens (lade: ``past_tokens[LEVEL - 2] is not None``)."""
        return self.levels[self.level - 2] is not None

    @property
    def prefill(self) -> bool:
        """Only level 0 exists: lade's first (prefill) forward, a plain causal mask."""
        return self.levels[1] is None

    def rows(self) -> list[list[int]]:
        """The levels the step's forward carries (0 .. fill level), in order."""
        return [list(lv) for lv in self.levels[: self.fill + 1] if lv is not None]

    def advance(self, new: Sequence[int]) -> None:
        """Move the window by a step whose last carried level predicted ``new`` (the pool update
        comes first, from the window as it was: :meth:`NgramPool.update`)."""
        new = [int(t) for t in new]
        if self.prefill:
            self.levels[0] = self.levels[0][1:]
            self.levels[1] = new
            self.fill += 1
        elif not self.full:
            for ll in range(self.fill + 1):
                self.levels[ll] = self.levels[ll][1:]
            self.levels[self.fill + 1] = new[1:]
            self.fill += 1
        else:  # ALWAYS_FWD_ONE
            self.levels[0] = self.levels[1][1:]
            for ll in range(1, self.level - 2):
                self.levels[ll] = list(self.levels[ll + 1])
            self.levels[self.level - 2] = new


def window_offsets(sizes: Sequence[int]) -> list[int]:
    """Positions of the window rows past the root (lade's ``ids_list``): level 0 at 1, 2, ...;
    level ``l >= 1`` at ``l, l + 1, ...``."""
    out: list[int] = []
    for ll, size in enumerate(sizes):
        start = 1 if ll == 0 else ll
        out += list(range(start, start + size))
    return out


def jacobi_mask(sizes: Sequence[int], prefill: bool) -> torch.Tensor:
    """Bool ``[1 + S, 1 + S]`` over the root and the window rows (levels of ``sizes``), as lade's
    ``j_make_causal_mask_multilevel`` lets them attend: at the prefill, plainly causal; after
    it, the root and level 0 causal, and level ``l``'s token ``r`` sees the root, level 0's
    first ``r`` tokens and the tokens ``r`` of levels ``1 .. l`` (itself included), so that each
    level continues the Jacobi trajectory of its column."""
    total = 1 + sum(sizes)
    if prefill:
        return torch.ones(total, total, dtype=torch.bool).tril()
    mask = torch.zeros(total, total, dtype=torch.bool)
    tiny = sizes[0] + 1  # the root and level 0
    mask[:tiny, :tiny] = torch.ones(tiny, tiny, dtype=torch.bool).tril()
    for ll in range(1, len(sizes)):
        if sizes[ll] != tiny:
            raise ValueError(f"window level {ll} holds {sizes[ll]} tokens, level 0 {sizes[0]}: "
                             f"a filled level holds one more than level 0")
        rows = slice(tiny * ll, tiny * (ll + 1))
        mask[rows, :tiny] = torch.ones(tiny, tiny, dtype=torch.bool).tril()
        for other in range(1, ll + 1):
            mask[rows, tiny * other : tiny * (other + 1)] |= torch.eye(tiny, dtype=torch.bool)
    return mask
