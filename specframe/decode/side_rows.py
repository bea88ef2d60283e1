"""Side rows in the step (:class:`specframe.SideRows`, docs/hooks.md): a row's tree and its drafter's side rows as one
block of the target forward, and the side outputs read with the verdict.

A :class:`Block` stands where a layout takes a :class:`~specframe.tree.DraftTree` (tokens,
positions, an attention mask, a device, a length): the tree's nodes first, in the tree's order
(so the accepted path's columns and the verifier's logits rows are the tree's alone), then the
side rows. Tree nodes see only the prefix and their ancestors, never a side row, so the verdict
is the one the tree alone gets. A side row sees the committed tokens its ``prefix`` names (the
root is the block's column 0) and the side rows its ``visible`` row names.

:class:`SideStep` is a step's side rows for all its rows: it asks each drafter that declares
``max_side_rows``, hands the layouts the blocks, appends every side argmax to the step's one
host read and gives each drafter its :class:`~specframe.side.SideOutput` with ``commit``.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from specframe.models.row_argmax import row_argmax
from specframe.interfaces import SideOutput, SideRows
from specframe.tree import DraftTree


class Block:
    """A tree followed by side rows, with the interface the KV layouts read of a tree."""

    def __init__(self, tree: DraftTree, side: SideRows, committed: int) -> None:
        self.tree = tree
        self.committed = committed  # the row's committed tokens, root included
        self.side = side
        self.size = len(tree)  # the tree's nodes: the block's first rows
        self.device = tree.device
        self.tokens = torch.cat([tree.tokens, torch.tensor(side.tokens, dtype=torch.long, device=self.device)])
        self._offsets = torch.cat([tree.depths, torch.tensor(side.offsets, dtype=torch.long, device=self.device)])

    def __len__(self) -> int:
        return self.size + len(self.side)

    def positions(self, num_committed: int) -> torch.Tensor:
        """Absolute positions: with ``num_committed`` tokens (root included) the root sits at
        ``num_committed - 1``; nodes at their depth past it, side rows at their offset."""
        return self._offsets + (num_committed - 1)

    def ancestor_mask(self) -> torch.Tensor:
        """``[m, m]`` bool among the block's rows: the tree's ancestor mask, each side row's
        ``visible`` side rows (and itself), and the root for a side row whose prefix holds it."""
        n, s = self.size, len(self.side)
        mask = torch.zeros(n + s, n + s, dtype=torch.bool, device=self.device)
        mask[:n, :n] = self.tree.ancestor_mask()
        mask[n:, n:] = self.side.visible.to(self.device) | torch.eye(s, dtype=torch.bool, device=self.device)
        if self.side.prefix is None:
            mask[n:, 0] = True
        else:  # only a prefix of every committed token holds the root
            mask[n:, 0] = torch.tensor([p >= self.committed for p in self.side.prefix], device=self.device)
        return mask

    def prefix_columns(self, length: int) -> list[int] | None:
        """Per block row, how many of the ``length`` cached prefix entries it sees (tree nodes:
        all); None when every row sees all of them."""
        if self.side.prefix is None:
            return None
        return [length] * self.size + [min(p, length) for p in self.side.prefix]


def prefix_columns(block: Any, length: int) -> list[int] | None:
    """:meth:`Block.prefix_columns` of a block, None for a plain tree (every node sees the prefix)."""
    return block.prefix_columns(length) if isinstance(block, Block) else None


def tree_size(block: Any) -> int:
    """The tree's nodes in a block (its first rows), or a plain tree's length."""
    return block.size if isinstance(block, Block) else len(block)


def side_size(block: Any) -> int:
    """The side rows in a block (0 for a plain tree)."""
    return len(block.side) if isinstance(block, Block) else 0


class SideStep:
    """One step's side rows: asked of each row's drafter, carried through the forward and the
    step's one host read, and handed back with ``commit``."""

    def __init__(self, rows: Sequence[Any], max_positions: int, vocab_size: int) -> None:
        self.sides: list[SideRows | None] = []
        for row in rows:
            side = None
            if getattr(row.drafter, "max_side_rows", 0):
                context = len(row.committed)
                side = row.drafter.side_rows(context, max_positions - 1)
                if side is not None:
                    side = check_side_rows(row.drafter.name, side, context, max_positions - 1, vocab_size)
                    limit = int(row.drafter.max_side_rows)
                    if len(side) > limit:
                        raise ValueError(f"drafter {row.drafter.name!r}: side_rows returned {len(side)} rows, "
                                         f"over its max_side_rows {limit}")
            self.sides.append(side)
        self.committed = [len(row.committed) for row in rows]
        self.any = any(side is not None for side in self.sides)
        self._argmax: list[torch.Tensor] = []
        self._logits: list[torch.Tensor | None] = [None] * len(self.sides)
        self.outputs: list[SideOutput | None] = [None] * len(self.sides)

    def blocks(self, trees: Sequence[DraftTree]) -> list[Any]:
        """Each row's tree, as a :class:`Block` where its drafter added side rows."""
        if not self.any:
            return list(trees)
        return [tree if side is None else Block(tree, side, committed)
                for tree, side, committed in zip(trees, self.sides, self.committed)]

    def forward(self, kv: Any, trees: Sequence[DraftTree], hidden: bool) -> Any:
        """The step's one target forward over ``kv``: the trees, with side rows where asked."""
        if not self.any:
            return kv.tree_forward(trees, hidden=hidden)
        return kv.tree_forward(self.blocks(trees), hidden=hidden)

    def take(self, kv: Any, logits: torch.Tensor) -> list[torch.Tensor]:
        """The side rows' argmax (device tensors, one per row with side rows) of the forward's
        ``logits``, to append to the step's one host read; keeps the logits rows where asked."""
        if not self.any:
            return []
        self._argmax = []
        for b, (side, rows) in enumerate(zip(self.sides, kv.side_rows_of(logits))):
            if side is None:
                continue
            self._argmax.append(row_argmax(rows, fresh=True))
            self._logits[b] = rows if side.logits else None
        return self._argmax

    def give(self, flat: list[int]) -> list[int]:
        """Parse the side argmax from the tail of ``flat``, the step's host read (the records of
        :meth:`take` were appended last); returns the rest."""
        at = len(flat) - self.size
        rest = flat[:at]
        for b, side in enumerate(self.sides):
            if side is None:
                continue
            self.outputs[b] = SideOutput(side, flat[at : at + len(side)], self._logits[b])
            at += len(side)
        return rest

    @property
    def size(self) -> int:
        """Ints the side argmax add to the step's host read."""
        return sum(len(side) for side in self.sides if side is not None)

    def keyword(self, b: int, drafter: Any) -> dict[str, Any]:
        """``{"side": SideOutput or None}`` for a drafter that declares side rows, else ``{}``."""
        return {"side": self.outputs[b]} if getattr(drafter, "max_side_rows", 0) else {}


def top_offset(block: Any) -> int:
    """An upper bound of the block's largest position past its root, known on the host (a
    tree's: its size less one)."""
    if isinstance(block, Block):
        return max(block.size - 1, max(block.side.offsets))
    return len(block) - 1


def prefix_visibility(block: Any, length: int, width: int) -> torch.Tensor | None:
    """Bool ``[m, width]``: which of the first ``width`` cache columns each block row sees when
    its side rows restrict their prefix (a row sees columns ``< its count``, counted from the
    row's first cache column); None when every row sees the ``length`` prefix columns."""
    cols = prefix_columns(block, length)
    if cols is None:
        return None
    counts = torch.tensor(cols, device=block.device)
    return torch.arange(width, device=block.device)[None, :] < counts[:, None]


def check_side_rows(name: str, side: SideRows, context_len: int, max_position: int, vocab_size: int) -> SideRows:
    """``side`` with host lists and a bool mask, or a ValueError naming drafter ``name`` and the
    bad field: sizes, token range, positions within ``[0, max_position]``, ``prefix`` within
    ``[0, context_len]``. Reads nothing from the device (the mask's values are not checked)."""
    tokens, offsets = [int(t) for t in side.tokens], [int(o) for o in side.offsets]
    visible = torch.as_tensor(side.visible, dtype=torch.bool)
    s = len(tokens)
    where = f"drafter {name!r}: side_rows"
    if s == 0:
        raise ValueError(f"{where} has no tokens: return None for a step without side rows")
    if len(offsets) != s or tuple(visible.shape) != (s, s):
        raise ValueError(f"{where}: {s} tokens need {s} offsets and visible [{s}, {s}], got "
                         f"{len(offsets)} offsets and visible {list(visible.shape)}")
    if min(tokens) < 0 or max(tokens) >= vocab_size:
        raise ValueError(f"{where}: tokens must be in [0, {vocab_size}), got {tokens}")
    root = context_len - 1
    low, high = root + min(offsets), root + max(offsets)
    if low < 0 or high > max_position:
        raise ValueError(f"{where}: positions {low}..{high} are outside [0, {max_position}] "
                         f"(offsets from the root at position {root})")
    prefix = None
    if side.prefix is not None:
        prefix = [int(p) for p in side.prefix]
        if len(prefix) != s or min(prefix) < 0 or max(prefix) > context_len:
            raise ValueError(f"{where}: prefix must be {s} counts in [0, {context_len}], got {prefix}")
    return SideRows(tokens, offsets, visible, prefix, bool(side.logits))
