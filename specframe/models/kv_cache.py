"""The pre-allocated KV cache of :class:`specframe.models.target.TargetModel`: transformers cache
layers whose keys and values live in buffers allocated once per sequence and compacted in place,
all layers in one shared buffer where their shapes allow (:class:`SharedKV`)."""

from __future__ import annotations

import functools

import torch


@functools.cache  # one class for the process: torch.compile guards on the cache layer's type
def preallocated_layer_class() -> type:
    """A DynamicLayer whose K/V live in buffers allocated once (created lazily: transformers'
    cache classes are imported only when a model runs)."""
    from transformers.cache_utils import DynamicLayer

    class PreallocatedLayer(DynamicLayer):
        """K/V buffers of ``capacity`` positions: ``update`` writes in place and returns views,
        ``keep`` compacts in place, so a generation never reallocates its cache. ``keys`` and
        ``values`` are views of the first ``length`` positions, made when read: a crop is one
        integer per layer (two views on each of 30 layers took 0.1-0.2 ms a step on the CPU)."""

        def __init__(self, capacity: int, shared: "SharedKV | None" = None, index: int = 0) -> None:
            self._kbuf = self._vbuf = None
            super().__init__()
            self.capacity = capacity
            self.length = 0
            self.shared, self.index = shared, index

        @property
        def keys(self) -> torch.Tensor | None:  # type: ignore[override]
            return None if self._kbuf is None else self._kbuf[..., : self.length, :]

        @keys.setter
        def keys(self, value: torch.Tensor | None) -> None:
            if value is not None:  # DynamicLayer starts empty; nothing else may swap the buffer
                raise AttributeError("a pre-allocated layer's keys are a view of its buffer")

        @property
        def values(self) -> torch.Tensor | None:  # type: ignore[override]
            return None if self._vbuf is None else self._vbuf[..., : self.length, :]

        @values.setter
        def values(self, value: torch.Tensor | None) -> None:
            if value is not None:
                raise AttributeError("a pre-allocated layer's values are a view of its buffer")

        def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
            batch, heads = key_states.shape[:2]
            self.device = key_states.device
            views = None if self.shared is None else self.shared.views(self.index, key_states, value_states,
                                                                       self.capacity)
            if views is not None:
                self._kbuf, self._vbuf = views
            else:
                self._kbuf = key_states.new_zeros(batch, heads, self.capacity, key_states.shape[-1])
                self._vbuf = value_states.new_zeros(batch, heads, self.capacity, value_states.shape[-1])
            self.is_initialized = True

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            end = self.length + key_states.shape[-2]
            if end > self.capacity:
                raise RuntimeError(f"pre-allocated KV cache overflow: {end} > capacity {self.capacity}")
            self._kbuf[..., self.length : end, :] = key_states
            self._vbuf[..., self.length : end, :] = value_states
            self.length = end
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self.length

        def keep(self, start: int, slots: torch.Tensor, contiguous: bool = False) -> None:
            n = int(slots.numel())
            # Contiguous slots (0..n-1) already sit right behind the prefix: nothing to move.
            if n and not contiguous:
                # Advanced indexing copies first, so overlapping source/destination is safe.
                self._kbuf[..., start : start + n, :] = self._kbuf[..., start + slots, :]
                self._vbuf[..., start : start + n, :] = self._vbuf[..., start + slots, :]
            self.length = start + n

    return PreallocatedLayer


class SharedKV:
    """One buffer ``[2 * layers, batch, heads, capacity, head_dim]`` for every pre-allocated
    layer's keys and values, so keeping a non-contiguous path is one gather and one copy for the
    whole cache instead of two per layer. Allocated by the first layer that fills it; a layer
    whose keys and values do not fit its shape (another head count or dimension, keys and values
    of different shapes) keeps buffers of its own, and the cache then compacts layer by layer."""

    def __init__(self, layers: int) -> None:
        self.layers = layers
        self.buffer: torch.Tensor | None = None
        self.members = 0
        self.broken = False

    def views(self, index: int, keys: torch.Tensor, values: torch.Tensor,
              capacity: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Layer ``index``'s (keys, values) views of the buffer, or None when they do not fit."""
        shape = (*keys.shape[:2], capacity, keys.shape[-1])
        fits = values.shape == keys.shape and values.dtype == keys.dtype
        if fits and self.buffer is None and not self.broken:
            self.buffer = keys.new_zeros(2 * self.layers, *shape)
        if not fits or self.buffer is None or self.buffer.shape[1:] != shape or self.buffer.dtype != keys.dtype \
                or self.buffer.device != keys.device:
            self.broken = True
            return None
        self.members += 1
        return self.buffer[2 * index], self.buffer[2 * index + 1]

    @property
    def whole(self) -> bool:
        """Whether every layer lives in the buffer (one compaction serves them all)."""
        return not self.broken and self.members == self.layers
