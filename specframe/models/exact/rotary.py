"""Rotary embeddings read from a table built in fixed-size blocks of positions.

A model computes cos and sin of ``position x frequency`` element-wise over the forward's
positions; torch's element-wise kernels split a tensor into a vector body and a scalar tail,
and between threads, by its size, and the vector and scalar cos may differ in the last bit.
:class:`ExactRotary` asks the model's own rotary module for whole blocks of :data:`BLOCK`
positions (always the same shape, small enough to run on one thread) and gathers each
position's row, so a position's cos and sin never depend on the forward it is in.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

#: Positions per block: 64 x a head dimension up to 256 stays under torch's parallel grain.
BLOCK = 64
#: Rope types whose frequencies depend on the sequence length seen so far.
LENGTH_DEPENDENT = ("dynamic", "longrope")


class ExactRotary(nn.Module):
    """Wraps a model's rotary module (``forward(x, position_ids) -> (cos, sin)``): the same
    values, computed per block of positions and cached."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self._cos: torch.Tensor | None = None
        self._sin: torch.Tensor | None = None

    def _extend(self, x: torch.Tensor, top: int) -> None:
        have = 0 if self._cos is None else self._cos.shape[0]
        if self._cos is not None and (self._cos.dtype != x.dtype or self._cos.device != x.device):
            have, self._cos, self._sin = 0, None, None
        blocks_cos, blocks_sin = [], []
        for start in range(have, top + 1, BLOCK):
            ids = torch.arange(start, start + BLOCK, device=x.device)[None]
            cos, sin = self.inner(x, ids)
            blocks_cos.append(cos[0])
            blocks_sin.append(sin[0])
        if blocks_cos:
            self._cos = torch.cat(([self._cos] if self._cos is not None else []) + blocks_cos)
            self._sin = torch.cat(([self._sin] if self._sin is not None else []) + blocks_sin)

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin)`` of shape ``[*position_ids.shape, head_dim]``, as the wrapped module."""
        top = int(position_ids.max()) if position_ids.numel() else 0
        if self._cos is None or top >= self._cos.shape[0] or self._cos.dtype != x.dtype:
            self._extend(x, top)
        return self._cos[position_ids], self._sin[position_ids]


def rope_type(module: nn.Module) -> str:
    """The rope type a rotary module computes (``"default"`` when it does not say)."""
    return str(getattr(module, "rope_type", None) or "default")


def rotary_modules(model: nn.Module) -> list[tuple[nn.Module, str, nn.Module]]:
    """(parent, attribute, module) of every rotary-embedding module of ``model`` (transformers
    names them ``rotary_emb``; their class names end in ``RotaryEmbedding``)."""
    return [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
            if type(child).__name__.endswith("RotaryEmbedding")]


def use_exact_rotary(model: Any) -> int:
    """Wrap every rotary module of ``model`` in :class:`ExactRotary`; returns how many. Raises
    ValueError for a rope type whose frequencies follow the sequence length (named)."""
    found = rotary_modules(model)
    for parent, name, child in found:
        kind = rope_type(child)
        if kind in LENGTH_DEPENDENT:
            raise ValueError(f"exact forward: rope type {kind!r} changes its frequencies with the sequence "
                             f"length, so a position's embedding depends on the forward; types refused: "
                             f"{', '.join(LENGTH_DEPENDENT)}")
        setattr(parent, name, ExactRotary(child))
    return len(found)
