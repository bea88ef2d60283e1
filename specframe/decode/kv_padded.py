"""The target's KV cache for a batch of sequences of ragged lengths (docs/batching.md).

Layout: one transformers cache ``[B, H, S, D]`` whose row ``b`` holds its sequence's committed
prefix in columns ``[0, lengths[b])``; columns past that are stale (a shorter prompt's padding,
or tree nodes left from a step that accepted less) and every query masks them out. A step
appends all trees at columns ``[S, S + n_max)``; :meth:`BatchKV.keep` then moves each row's
accepted path right behind its prefix, drops rows that left the batch and crops the columns to
the longest live prefix. Each row's keys are exactly those of the same sequence decoded alone,
so a sequence's output does not depend on its companions (up to float rounding of other shapes).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from specframe.decode.side_rows import Block, prefix_visibility, top_offset, tree_size
from specframe.models.target import TargetModel
from specframe.tree import DraftTree


def packed_visibility(lengths: Sequence[int], width: int, trees: Sequence[DraftTree | Block]) -> torch.Tensor:
    """Bool ``[B, n_max, width + n_max]``: what node ``i`` of row ``b``'s tree may attend to.

    Its row's valid prefix (columns ``< lengths[b]``; the rest of the ``width`` cache columns
    are stale), and its ancestors and itself among the packed tree columns; a padding node
    (``i >= len(trees[b])``) sees only itself, so no softmax row is empty. A tree may be a
    :class:`~specframe.decode.side_rows.Block` (its side rows after its nodes, each seeing the
    prefix columns its ``prefix`` names).
    """
    n_max = max(len(tree) for tree in trees)
    device = trees[0].device
    visible = torch.zeros(len(trees), n_max, width + n_max, dtype=torch.bool, device=device)
    visible[:, :, width:] = torch.eye(n_max, dtype=torch.bool, device=device)
    for b, tree in enumerate(trees):
        n = len(tree)
        seen = prefix_visibility(tree, lengths[b], width)
        if seen is None:
            visible[b, :n, : lengths[b]] = True
        else:
            visible[b, :n, :width] = seen
        visible[b, :n, width : width + n] = tree.ancestor_mask()
    return visible


class BatchKV:
    """Batched prefill, packed tree forward and ragged compaction over one :class:`TargetModel`."""

    def __init__(self, target: TargetModel) -> None:
        if target.sliding_window is not None:
            raise ValueError(
                f"{target.architecture}: batched decoding does not support sliding-window layers yet "
                "(the per-row window mask is not built); decode its sequences one at a time"
            )
        self.target = target
        self.cache: Any = None
        self.lengths: list[int] = []
        self.last_rows = 0  # the rows (tokens) the last tree forward computed
        self._sizes: list[int] = []
        self._ends: list[int] = []  # each row's tree and side rows

    @property
    def width(self) -> int:
        """Columns ``S`` of the cache (the longest row's prefix after a :meth:`keep`)."""
        layer = self.cache.layers[0] if self.cache is not None and self.cache.layers else None
        keys = getattr(layer, "keys", None)
        return 0 if keys is None or keys.dim() != 4 else int(keys.shape[-2])

    def _forward(self, tokens: torch.Tensor, positions: torch.Tensor, visible: torch.Tensor,
                 hidden: bool, last_logits_only: bool = False, cache: Any = None) -> Any:
        """One model call on ``cache`` (default: the batch cache), which it appends to."""
        t = self.target
        keep = {"logits_to_keep": 1} if last_logits_only and t._takes_logits_to_keep else {}
        return t._call(input_ids=tokens.to(t.device), position_ids=positions.to(t.device),
                       attention_mask=batch_attention_mask(t, visible.to(t.device)), use_cache=True,
                       output_hidden_states=hidden, **{t._cache_kw: self.cache if cache is None else cache}, **keep)

    @torch.inference_mode()
    def prefill(self, prefixes: Sequence[torch.Tensor], hidden: bool = False, logits: bool = False,
                per_row: bool | None = None) -> Any:
        """Start a batch: forward each row's ``prefix`` (its prompt without the root).

        Returns the model output, or None when every prefix is empty (one-token prompts).
        ``logits``: compute them at every position (``[B, P, V]``, rows past a prefix are
        padding) for drafters that read the prompt's logits; otherwise the lm_head runs on the
        last column only (no caller reads it: each root enters with its first tree), as the
        single-sequence prefill skips those rows (B x P x 49152 x 576 multiply-adds at SmolLM2).
        ``per_row`` (default: on a CPU): one forward per prompt, stacked into the batch cache,
        instead of one right-padded forward: a CPU pays for every padding row (four chat prompts
        of 39-159 tokens: 0.42 s alone against 0.77 s padded, SmolLM2, 2 threads), a GPU hardly.
        """
        from transformers import DynamicCache

        self.cache = DynamicCache()
        self.lengths = [int(p.numel()) for p in prefixes]
        width = max(self.lengths)
        if width == 0:
            return None
        if self.target.device.type == "cpu" if per_row is None else per_row:
            return self._prefill_rows(prefixes, width, hidden, logits)
        rows = len(prefixes)
        tokens = torch.zeros(rows, width, dtype=torch.long)
        for b, prefix in enumerate(prefixes):
            tokens[b, : prefix.numel()] = prefix
        lengths = torch.tensor(self.lengths)
        cols = torch.arange(width)
        causal = torch.ones(width, width, dtype=torch.bool).tril()
        # A key past a row's prefix is padding; a padding query still sees keys (no empty softmax row).
        real_key = cols[None, None, :] < lengths[:, None, None]
        padding_query = cols[None, :, None] >= lengths[:, None, None]
        visible = causal[None] & (real_key | padding_query)
        return self._forward(tokens, cols.expand(rows, width), visible, hidden, last_logits_only=not logits)

    def _prefill_rows(self, prefixes: Sequence[torch.Tensor], width: int, hidden: bool, logits: bool) -> Any:
        """:meth:`prefill` one prompt at a time: each row's keys and values (and outputs) are
        those of the prompt alone, right-padded with zeros to ``width`` (masked as stale)."""
        layers, out = self._each_row(prefixes, width, hidden, logits)
        for i, (keys, values) in enumerate(layers):
            self.cache.update(keys, values, i)
        return out

    def _each_row(self, prefixes: Sequence[torch.Tensor], width: int, hidden: bool,
                  logits: bool) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], Any]:
        """Forward each non-empty prefix alone; returns every layer's ``(keys, values)`` of all
        rows stacked (``[rows, H, width, D]``, zero columns past a prefix) and the stacked
        outputs (None when every prefix is empty)."""
        from transformers import DynamicCache
        from transformers.modeling_outputs import CausalLMOutputWithPast

        outs, caches = [], []
        for prefix in prefixes:
            n = int(prefix.numel())
            if n == 0:
                outs.append(None)
                caches.append(None)
                continue
            cache = DynamicCache()
            causal = torch.ones(1, n, n, dtype=torch.bool).tril()
            outs.append(self._forward(prefix[None], torch.arange(n)[None], causal, hidden,
                                      last_logits_only=not logits, cache=cache))
            caches.append(cache)
        template = next((c for c in caches if c is not None), None)
        if template is None:  # one-token prompts: zero rows shaped as the running cache's
            return [(pad_columns(None, layer.keys, width).expand(len(prefixes), -1, -1, -1),
                     pad_columns(None, layer.values, width).expand(len(prefixes), -1, -1, -1))
                    for layer in self._layers()], None
        layers = []
        for i, layer in enumerate(template.layers):
            keys = [pad_columns(None if c is None else c.layers[i].keys, layer.keys, width) for c in caches]
            values = [pad_columns(None if c is None else c.layers[i].values, layer.values, width) for c in caches]
            layers.append((torch.cat(keys), torch.cat(values)))
        some = next(o for o in outs if o is not None)
        cols = width if logits else 1
        stacked = [pad_columns(None if o is None else o.logits, some.logits, cols, dim=1) for o in outs]
        states = None
        if hidden:
            states = tuple(torch.cat([pad_columns(None if o is None else o.hidden_states[j], h, width, dim=1) for o in outs])
                           for j, h in enumerate(some.hidden_states))
        return layers, CausalLMOutputWithPast(logits=torch.cat(stacked), hidden_states=states)

    def _layers(self) -> list[Any]:
        """The cache's attention layers that hold ``[B, H, S, D]`` keys and values."""
        return [layer for layer in self.cache.layers
                if getattr(layer, "keys", None) is not None and layer.keys.dim() == 4]

    @torch.inference_mode()
    def join(self, prefixes: Sequence[torch.Tensor], hidden: bool = False, logits: bool = False) -> Any:
        """Add rows to a running batch (continuous batching): each prefix is prefilled alone,
        as :meth:`prefill` does on a CPU, and its keys and values become a new last row.

        Called after a step, when the cache has its layers (a step's forward made them). Rows
        already in the batch keep their columns; the cache widens with zero (stale) columns if
        a new prefix is longer than every live one. Returns the new rows' outputs as
        :meth:`prefill` returns them (row ``i`` is ``prefixes[i]``), or None when every prefix
        is empty.
        """
        if self.cache is None or not self._layers():
            raise RuntimeError("join() needs a running batch: call prefill() and run a step first")
        lengths = [int(p.numel()) for p in prefixes]
        width = max(self.width, *lengths)
        layers, out = self._each_row(prefixes, width, hidden, logits)
        for layer, (keys, values) in zip(self._layers(), layers):
            layer.keys = torch.cat([widen_columns(layer.keys, width), keys.to(layer.keys.dtype)])
            layer.values = torch.cat([widen_columns(layer.values, width), values.to(layer.values.dtype)])
        self.lengths = self.lengths + lengths
        return out

    @torch.inference_mode()
    def tree_forward(self, trees: Sequence[DraftTree | Block], hidden: bool = False) -> Any:
        """All rows' trees in ONE forward: ``[B, n_max]`` tokens, per-row positions, 4D mask.

        Row ``b``'s node ``i`` sees its row's prefix (``lengths[b]`` columns) and its ancestors;
        padding nodes see only themselves. Logits ``[B, n_max, V]``: row b's first ``len(trees[b])``.
        A tree may be a :class:`~specframe.decode.side_rows.Block`, its side rows after its nodes.
        """
        rows, width = len(trees), self.width
        n_max = max(len(tree) for tree in trees)
        self._sizes, self.last_rows = [tree_size(tree) for tree in trees], rows * n_max
        self._ends = [len(tree) for tree in trees]
        device = self.target.device
        tokens = torch.zeros(rows, n_max, dtype=torch.long, device=device)
        positions = torch.zeros(rows, n_max, dtype=torch.long, device=device)
        visible = packed_visibility(self.lengths, width, trees)
        for b, tree in enumerate(trees):
            n, length = len(tree), self.lengths[b]
            tokens[b, :n] = tree.tokens
            # The prefix holds length = L - 1 entries; the root sits at position L - 1.
            positions[b, :n] = tree.positions(length + 1)
            positions[b, n:] = length
        top = max(length + top_offset(tree) for length, tree in zip(self.lengths, trees))
        if top >= self.target.max_positions:
            raise ValueError(f"position {top} is beyond the model's {self.target.max_positions} positions")
        return self._forward(tokens, positions, visible, hidden)

    def rows_of(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Row b's ``[n_b, ...]`` slice of an output of the last :meth:`tree_forward`."""
        return [tensor[b, :n] for b, n in enumerate(self._sizes)]

    def side_rows_of(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Row b's side rows (after its tree) of an output of the last :meth:`tree_forward`."""
        return [tensor[b, n:end] for b, (n, end) in enumerate(zip(self._sizes, self._ends))]

    def hidden_rows(self, out: Any) -> list[tuple[torch.Tensor, ...]]:
        """Row b's hidden states of the last :meth:`tree_forward`, ``[1, n_b, H]`` per layer."""
        return [tuple(h[None] for h in row) for row in zip(*(self.rows_of(h) for h in out.hidden_states))]

    @torch.inference_mode()
    def keep(self, paths: Sequence[torch.Tensor | None], tree_start: int,
             contiguous: Sequence[bool] | None = None) -> None:
        """Keep row ``b``'s accepted ``paths[b]`` (node indices, root first) behind its prefix,
        drop the rows whose path is None (they left the batch) and crop to the longest prefix.

        ``tree_start``: the column where this step's trees began (:attr:`width` before the
        forward). ``contiguous`` is not needed here (every row's path is gathered).
        """
        live = [b for b, p in enumerate(paths) if p is not None]
        device = self.target.device
        rows, dst, src = [], [], []
        for b in live:
            path = paths[b].to(device, torch.long)
            k = int(path.numel())
            rows.append(torch.full((k,), b, dtype=torch.long, device=device))
            dst.append(torch.arange(self.lengths[b], self.lengths[b] + k, device=device))
            src.append(tree_start + path)
            self.lengths[b] += k
        new_lengths = [self.lengths[b] for b in live]
        width = max(new_lengths, default=0)
        index = torch.tensor(live, dtype=torch.long, device=device)
        every = len(live) == len(paths)
        moves = (torch.cat(rows), torch.cat(dst), torch.cat(src)) if rows else None
        for layer in self._layers():
            for name in ("keys", "values"):
                kv = getattr(layer, name)
                if moves is not None:
                    r, d, s = moves
                    # Advanced indexing on the right copies first, so overlapping slots are safe.
                    kv[r, :, d] = kv[r, :, s]
                # All rows live (most steps): a view; the next step's append copies the cache anyway.
                setattr(layer, name, kv[:, :, :width] if every else kv[index, :, :width])
        self.lengths = new_lengths


def batch_attention_mask(model: TargetModel, visible: torch.Tensor) -> torch.Tensor:
    """``[B, q, k]`` bool visibility as the 4D mask ``model``'s attention takes: bool (SDPA)
    or additive float in the model's dtype (eager)."""
    if model.attn_implementation != "eager":
        return visible[:, None]
    zero = torch.zeros((), dtype=model.dtype, device=model.device)
    return torch.where(visible, zero, torch.finfo(model.dtype).min)[:, None]


def widen_columns(x: torch.Tensor, width: int) -> torch.Tensor:
    """Every row of ``x`` (``[B, H, S, D]``) zero-padded to ``width`` columns (``x`` itself if wide enough)."""
    if x.shape[-2] >= width:
        return x
    pad = x.new_zeros(*x.shape[:-2], width - x.shape[-2], x.shape[-1])
    return torch.cat([x, pad], dim=-2)


def pad_columns(x: torch.Tensor | None, like: torch.Tensor, width: int, dim: int = -2) -> torch.Tensor:
    """``x`` (one row) zero-padded along ``dim`` to ``width``; None: all zeros shaped as ``like``."""
    shape = list(like.shape)
    shape[0], shape[dim] = 1, width
    out = torch.zeros(shape, dtype=like.dtype, device=like.device)
    if x is not None:
        out.narrow(dim, 0, x.shape[dim]).copy_(x)
    return out

