"""The flat batch cache: every live sequence's tree in ONE row of real nodes (docs/batching.md).

:class:`~specframe.decode.kv_padded.BatchKV` packs B trees as ``[B, n_max]`` tokens, so a step computes
``B x n_max`` rows whatever the trees' sizes; on a CPU, where a forward's cost grows with its
rows, padding is paid in full (a 1-node stub beside an 8-node tree costs 8 rows). Here the trees
are concatenated into ``[1, sum n_b]`` tokens, ECHO's super-tree, and the batch's caches sit
side by side in one cache row: sequence b owns the *segment* of columns ``[s_b C, s_b C + C)``
(``C`` the segment capacity) and holds its committed prefix at the segment's start. A node sees
its own segment's prefix and its tree ancestors, nothing of the other sequences.

The linears then compute only real nodes; attention reads every segment's columns (masked) for
every node, a cost that grows with B x C but stays small beside the linears at the context
lengths of a CPU. Sequences that leave free their segment for the next to join; each segment
keeps exactly the keys and values of its sequence decoded alone.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from specframe.decode.kv_padded import BatchKV, widen_columns
from specframe.decode.side_rows import Block, prefix_visibility, top_offset, tree_size
from specframe.models.target import TargetModel
from specframe.tree import DraftTree


def flat_visibility(lengths: Sequence[int], starts: Sequence[int], width: int,
                    trees: Sequence[DraftTree | Block]) -> torch.Tensor:
    """Bool ``[sum n_b, width + sum n_b]``: what each node of the concatenated trees may attend
    to. Node i of row b sees its segment's prefix (columns ``[starts[b], starts[b] +
    lengths[b])`` of the ``width`` cache columns; the rest of the cache is other rows' or stale)
    and its ancestors and itself among its own tree's columns. A tree may be a
    :class:`~specframe.decode.side_rows.Block` (side rows after its nodes, each seeing the prefix
    columns its ``prefix`` names)."""
    sizes = [len(tree) for tree in trees]
    total = sum(sizes)
    visible = torch.zeros(total, width + total, dtype=torch.bool, device=trees[0].device)
    at = 0
    for tree, length, start, n in zip(trees, lengths, starts, sizes):
        seen = prefix_visibility(tree, length, length)
        visible[at : at + n, start : start + length] = True if seen is None else seen
        visible[at : at + n, width + at : width + at + n] = tree.ancestor_mask()
        at += n
    return visible


class FlatKV(BatchKV):
    """A batch cache in one row of segments, with the interface of :class:`BatchKV`.

    ``reserve``: columns each segment keeps free past its longest prompt (the decoder passes
    ``max_new_tokens + 1``); a sequence that outgrows its segment makes every segment wider
    (a copy of the cache, rare).
    """

    layout = "flat"

    def __init__(self, target: TargetModel, reserve: int = 128) -> None:
        super().__init__(target)
        self.reserve = max(1, int(reserve))
        self.capacity = 0
        self.segments: list[int] = []  # live row -> its segment
        self.free: list[int] = []
        self._count = 0  # segments allocated (live or free)
        self._spans: list[tuple[int, int]] = []  # the last forward's (first node, nodes) per row
        self._side_spans: list[tuple[int, int]] = []  # and (first side row, side rows)

    # ------------------------------------------------------------------ rows in and out
    @torch.inference_mode()
    def prefill(self, prefixes: Sequence[torch.Tensor], hidden: bool = False, logits: bool = False,
                per_row: bool | None = None) -> Any:
        """Start a batch: each prefix prefilled alone into its own segment (``per_row`` is
        ignored: the flat layout has no padded prefill)."""
        from transformers import DynamicCache

        self.cache = DynamicCache()
        self.lengths, self.segments, self.free = [], [], []
        self._count = 0
        self.capacity = max(int(p.numel()) for p in prefixes) + self.reserve
        return self.join(prefixes, hidden, logits)

    @torch.inference_mode()
    def join(self, prefixes: Sequence[torch.Tensor], hidden: bool = False, logits: bool = False) -> Any:
        """Add rows: each prefix is prefilled alone and written into a free segment (new ones
        are appended when none is free). Returns the new rows' outputs as :meth:`BatchKV.join`."""
        lengths = [int(p.numel()) for p in prefixes]
        if max(lengths) + self.reserve > self.capacity:
            self._widen(max(lengths) + self.reserve)
        layers, out = self._each_row(prefixes, max(lengths), hidden, logits) if max(lengths) else ([], None)
        segments = []
        for _ in prefixes:
            if not self.free:
                self.free.append(self._count)
                self._count += 1
            segments.append(self.free.pop(0))
        if layers and not self._layers():  # every earlier prefix was empty: no layers yet
            for i, (keys, values) in enumerate(layers):
                self.cache.update(keys[:1, :, :0], values[:1, :, :0], i)
        for layer, (keys, values) in zip(self._layers(), layers):
            for name, new in (("keys", keys), ("values", values)):
                store = self._grown(getattr(layer, name))
                for j, (segment, n) in enumerate(zip(segments, lengths)):
                    at = segment * self.capacity
                    store[:, :, at : at + n] = new[j : j + 1, :, :n].to(store.dtype)
                setattr(layer, name, store)
        self.segments += segments
        self.lengths = self.lengths + lengths
        return out

    def _grown(self, store: torch.Tensor) -> torch.Tensor:
        """``store`` with room for every allocated segment (zero columns appended)."""
        return widen_columns(store, self._count * self.capacity)

    def _widen(self, capacity: int) -> None:
        """Every segment ``capacity`` columns wide, each keeping its prefix at its start."""
        old, self.capacity = self.capacity, capacity
        for layer in self._layers():
            layer.keys, layer.values = self._relayout(layer.keys, old), self._relayout(layer.values, old)

    def _relayout(self, store: torch.Tensor, old: int) -> torch.Tensor:
        """``store``'s segments of ``old`` columns re-laid at :attr:`capacity` columns each."""
        count = store.shape[-2] // old if old else 0
        if not count or old == self.capacity:
            return store
        heads, dim = store.shape[1], store.shape[-1]
        wide = store.new_zeros(1, heads, count, self.capacity, dim)
        wide[:, :, :, :old] = store[:, :, : count * old].reshape(1, heads, count, old, dim)
        return wide.reshape(1, heads, count * self.capacity, dim)

    # ------------------------------------------------------------------ one step
    @torch.inference_mode()
    def tree_forward(self, trees: Sequence[DraftTree | Block], hidden: bool = False) -> Any:
        """All rows' trees in ONE forward of ``[1, sum n_b]`` tokens (no padding): row b's node
        sees its segment's prefix and its ancestors. Logits ``[1, sum n_b, V]``; :meth:`rows_of`
        splits any output per row. A tree may be a :class:`~specframe.decode.side_rows.Block`,
        its side rows after its nodes (:meth:`side_rows_of` splits those)."""
        width, device = self.width, self.target.device
        sizes = [len(tree) for tree in trees]
        visible = flat_visibility(self.lengths, [s * self.capacity for s in self.segments], width, trees)
        tokens = torch.cat([tree.tokens.to(device) for tree in trees])
        # The prefix holds length = L - 1 entries; the root sits at position L - 1.
        positions = torch.cat([tree.positions(length + 1).to(device) for tree, length in zip(trees, self.lengths)])
        starts = [sum(sizes[:b]) for b in range(len(sizes))]
        spans = [(at, tree_size(tree)) for at, tree in zip(starts, trees)]
        self._side_spans = [(at + n, size - n) for (at, n), size in zip(spans, sizes)]
        top = max(length + top_offset(tree) for length, tree in zip(self.lengths, trees))
        if top >= self.target.max_positions:
            raise ValueError(f"position {top} is beyond the model's {self.target.max_positions} positions")
        self._spans, self.last_rows = spans, sum(sizes)
        return self._forward(tokens[None], positions[None], visible[None].to(device), hidden)

    def rows_of(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Row b's ``[n_b, ...]`` slice of an output of the last :meth:`tree_forward`."""
        return [tensor[0, at : at + n] for at, n in self._spans]

    def side_rows_of(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Row b's side rows (after its tree) of an output of the last :meth:`tree_forward`."""
        return [tensor[0, at : at + n] for at, n in self._side_spans]

    @torch.inference_mode()
    def keep(self, paths: Sequence[torch.Tensor | None], tree_start: int,
             contiguous: Sequence[bool] | None = None) -> None:
        """Move row b's accepted ``paths[b]`` (node indices, root first) behind its prefix in
        its segment; a row whose path is None leaves and frees its segment. The tree columns go."""
        device = self.target.device
        live = [b for b, p in enumerate(paths) if p is not None]
        counts = {b: int(paths[b].numel()) for b in live}
        old = self.capacity
        need = max((self.lengths[b] + counts[b] for b in live), default=0)
        if need > self.capacity:  # a sequence outgrew its segment: widen them all (rare)
            self.capacity = need + self.reserve
        dst, src = [], []
        for b in live:
            at = self.segments[b] * self.capacity + self.lengths[b]
            dst.append(torch.arange(at, at + counts[b], device=device))
            src.append(self._spans[b][0] + paths[b].to(device, torch.long))  # its tree's first column
        moves = (torch.cat(dst), torch.cat(src)) if dst else None
        for layer in self._layers():
            for name in ("keys", "values"):
                kv = getattr(layer, name)
                store = self._grown(self._relayout(kv[:, :, :tree_start], old))
                if moves is not None:
                    # Advanced indexing on the right copies first: the tree columns may share
                    # ``store``'s memory.
                    store[:, :, moves[0]] = kv[:, :, tree_start:][:, :, moves[1]]
                setattr(layer, name, store)
        self.free += [self.segments[b] for b, p in enumerate(paths) if p is None]
        self.segments = [self.segments[b] for b in live]
        self.lengths = [self.lengths[b] + counts[b] for b in live]


def check_layout(layout: str) -> str:
    """``layout`` if it is one of :data:`LAYOUTS`, else a ValueError naming the valid ones."""
    if layout not in LAYOUTS:
        raise ValueError(f"batch layout {layout!r} is not one of {', '.join(LAYOUTS)}")
    return layout


def make_batch_kv(target: TargetModel, layout: str, reserve: int = 128) -> BatchKV:
    """The batch cache of ``layout``: :class:`FlatKV` (``"flat"``) or :class:`BatchKV` (``"padded"``)."""
    return FlatKV(target, reserve) if check_layout(layout) == "flat" else BatchKV(target)


#: The batch cache layouts :func:`make_batch_kv` builds.
LAYOUTS = ("padded", "flat")
