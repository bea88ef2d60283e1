"""Drafter ``lookahead``: Lookahead decoding (Fu et al., arXiv 2402.02057) by the rules of its
authors' package ``lade`` 0.0.2 (hao-ai-lab/LookaheadDecoding; what Spec-Bench runs), model-free.

The target drafts for itself. A Jacobi window of ``N - 1`` levels of ``W`` guessed tokens rides in
every verify forward as side rows (:class:`specframe.SideRows`, with lade's attention mask), and
each step the target's predictions at the window's last level become its next level; the
window's columns, read top to bottom with their new prediction, are ``N``-grams the target itself
nearly produced, and go to a pool keyed by the token before them (an LRU list of at most ``G``
per key). The state's rules live in :mod:`specframe.drafters.lookahead_pool`.

Rows, for any policy: the pool's ``N - 1``-token continuations of the step's root are the draft.
At a node whose path (below the root) is a prefix of some of them, the row holds each next token
of those continuations at the share of the continuations that carry it; every other row is
empty. A policy that keeps every candidate (``talon`` with a budget of at least ``G (N - 1) + 1``
and its default gate: every candidate's share is at least ``1 / G``) verifies all of lade's
guesses at once, and greedy verification then accepts the longest matching prefix, lade's verdict
(lade keeps the earliest of equally long matches; the tokens are the same, a trie merges them).

Where lade differs from its paper: when all ``N - 1`` tokens of a guess match, lade emits them
and drops the bonus token the forward computed after them. ``drop_bonus = true`` drafts only each
guess's first ``N - 2`` tokens, which emits exactly lade's tokens (its last guess token is then the
bonus); the default drafts all ``N - 1`` and emits the bonus, as the paper's verification does.

Replay: ``"unsupported"`` (the window needs the target's predictions at the side rows).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from specframe.interfaces import Drafter, SideOutput, SideRows
from specframe.options import require
from specframe.search_space import tunable
from specframe.selection import pad_top
from specframe.tree import DraftTree

from .lookahead_pool import JacobiWindow, NgramPool, jacobi_mask, window_offsets


@dataclass
class LookaheadOptions:
    """Options of the ``lookahead`` drafter (defaults: Spec-Bench's, N=5, W=7, G=7).

    Attributes:
        level: N, the n-gram size (lade's ``LEVEL``): the window holds ``N - 1`` levels and a
            guess ``N - 1`` tokens.
        window: W, the window's width (lade's ``WINDOW_SIZE``): n-grams gathered per step.
        guess_set: G, the most continuations the pool keeps per key (lade's ``GUESS_SET_SIZE``),
            so at most G guesses are verified per step.
        seed: seed of the window's first level, drawn from the prompt (lade's ``random.seed(10)``).
        drop_bonus: lade's verification: a guess matched in full emits its ``N - 1`` tokens and
            no bonus (drafts each guess's first ``N - 2`` tokens). False (default): the bonus too.
    """

    level: int = tunable(5, low=3, high=8)
    window: int = tunable(7, low=1, high=16)
    guess_set: int = tunable(7, low=1, high=16)
    seed: int = 10
    drop_bonus: bool = False

    def __post_init__(self) -> None:
        require(self.level >= 3, "level", f"must be >= 3 (a window of at least two levels), got {self.level}")
        require(self.window >= 1, "window", f"must be >= 1, got {self.window}")
        require(self.guess_set >= 1, "guess_set", f"must be >= 1, got {self.guess_set}")


def max_window_rows(level: int, window: int) -> int:
    """The most window tokens a step carries (the filled window, or the prefill's level 0)."""
    state = JacobiWindow([0], level, window, 0)
    most = 0
    while True:
        sizes = [len(lv) for lv in state.rows()]
        most = max(most, sum(sizes))
        if state.full:
            return most
        state.advance([0] * sizes[-1])


class LookaheadDrafter(Drafter):
    """Lookahead decoding: guesses from the target's own Jacobi window (module docstring)."""

    name = "lookahead"
    Options = LookaheadOptions
    replay = "unsupported"
    # Its window moves on the target's predictions at the side rows, which no fresh drafter fed
    # only the committed tokens has.
    learns_from_verdicts = True

    def __init__(self, options: LookaheadOptions, target: Any) -> None:
        super().__init__(options, target)
        self.max_side_rows = max_window_rows(options.level, options.window)
        self.begin(torch.zeros(1, dtype=torch.long))

    def begin(self, prompt_ids: torch.Tensor, target_hidden: Any = None) -> None:
        """A fresh window drawn from the prompt and an empty pool."""
        o = self.options
        prompt = torch.as_tensor(prompt_ids).flatten().tolist()
        self.window = JacobiWindow(prompt, o.level, o.window, o.seed)
        self.pool = NgramPool(o.level, o.guess_set)
        self.root = int(prompt[-1])
        self._sizes: list[int] = []
        self._rows: dict[tuple[int, ...], tuple[list[float], list[int]]] = {}

    # ------------------------------------------------------------------ side rows
    def side_rows(self, context_len: int, max_position: int) -> SideRows | None:
        """The window's carried levels, at lade's positions and with its mask (None when the
        window would pass the target's last position: the window then waits)."""
        levels = self.window.rows()
        sizes = [len(lv) for lv in levels]
        offsets = window_offsets(sizes)
        if context_len - 1 + max(offsets) > max_position:
            self._sizes = []
            return None
        self._sizes = sizes
        visible = jacobi_mask(sizes, self.window.prefill)[1:, 1:]  # every window row sees the root
        return SideRows([t for lv in levels for t in lv], offsets, visible)

    def commit(self, tokens: torch.Tensor, path: torch.Tensor | None = None, target_hidden: Any = None,
               tree: DraftTree | None = None, side: SideOutput | None = None) -> None:
        """The pool learns the window's n-grams, the window moves one step (with the target's
        predictions at its last level), and the next root is the last committed token."""
        if side is not None and self._sizes:
            new = side.argmax[len(side.argmax) - self._sizes[-1] :]
            if self.window.full:
                self.pool.update(self.root, self.window.levels, new)
            self.window.advance(new)
        self._sizes = []
        self.root = int(torch.as_tensor(tokens).flatten()[-1])
        self._rows = {}

    # ------------------------------------------------------------------ rows
    def guesses(self) -> list[tuple[int, ...]]:
        """This step's guesses: the pool's continuations of the root (oldest first), cut to
        ``N - 2`` tokens with ``drop_bonus``; none until the window is full (as lade)."""
        if not self.window.full:
            return []
        cut = self.options.level - 2 if self.options.drop_bonus else self.options.level - 1
        return [g[:cut] for g in self.pool.guesses(self.root)]

    def ranked(self, path: tuple[int, ...]) -> tuple[list[float], list[int]]:
        """The row after ``path`` (drafted tokens below the root): each next token of the guesses
        that start with ``path``, at its share of them, best first, ties toward the lower id."""
        row = self._rows.get(path)
        if row is None:
            d = len(path)
            counts: dict[int, int] = {}
            for g in self.guesses():
                if len(g) > d and g[:d] == path and g[d] < self.vocab_size:
                    counts[g[d]] = counts.get(g[d], 0) + 1
            total = sum(counts.values())
            pairs = sorted((-c, t) for t, c in counts.items())
            logp = torch.tensor([math.log(-c / total) for c, _ in pairs], dtype=torch.float32).tolist()
            row = self._rows[path] = (logp, [t for _, t in pairs])
        return row

    def _paths(self, tree: DraftTree, nodes: torch.Tensor) -> list[tuple[int, ...]]:
        parents, tokens = tree.parents.tolist(), tree.tokens.tolist()
        out = []
        for node in torch.as_tensor(nodes).flatten().tolist():
            path, u = [], int(node)
            while u > 0:
                path.append(tokens[u])
                u = parents[u]
            out.append(tuple(reversed(path)))
        return out

    def expand(self, tree: DraftTree, nodes: torch.Tensor) -> torch.Tensor:
        """Log-probs ``[len(nodes), V]``: the guesses' next tokens, ``-inf`` elsewhere."""
        paths = self._paths(tree, nodes)
        out = torch.full((len(paths), self.vocab_size), float("-inf"), dtype=torch.float32)
        for r, path in enumerate(paths):
            logp, toks = self.ranked(path)
            if toks:
                out[r, torch.tensor(toks)] = torch.tensor(logp, dtype=torch.float32)
        return out.to(tree.device)

    def expand_top(self, tree: DraftTree, nodes: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`expand`'s top ``k`` per row, built from the few candidates (no dense rows)."""
        paths = self._paths(tree, nodes)
        k = min(int(k), self.vocab_size)
        values, tokens = [], []
        for path in paths:
            vals, toks = pad_top(*self.ranked(path), k, self.vocab_size)
            values.append(vals)
            tokens.append(toks)
        rows, device = len(paths), tree.device
        return (torch.tensor(values, dtype=torch.float32, device=device).view(rows, k),
                torch.tensor(tokens, dtype=torch.long, device=device).view(rows, k),
                torch.arange(k, device=device).expand(rows, k))
