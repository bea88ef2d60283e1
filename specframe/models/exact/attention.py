"""The exact forward's attention, registered with transformers' attention interface under
:data:`NAME`, so a model runs it without a change to its code.

Each query row attends over exactly the keys its mask lets it see, in logical order, with one
fixed accumulation (``csrc/exact_ops.cpp``): the same token gives the same bits alone, in any
tree, in any batch and layout. :func:`reference_attention` is the slow, obvious version the
tests hold it against.
"""

from __future__ import annotations

from typing import Any

import torch

from specframe.models.exact.kernel import load_extension, unavailable_reason

#: The attention implementation name the exact forward registers with transformers.
NAME = "specframe_exact"


class ExactUnavailableError(RuntimeError):
    """The exact forward cannot run here (no kernel for this device, dtype or model)."""


def _visible(mask: torch.Tensor | None, queries: int, keys: int) -> torch.Tensor | None:
    """A bool ``[B, 1, Q, S]`` visibility mask from what transformers passes: bool as it is, an
    additive float mask as "not minus infinity", cut to the keys that exist."""
    if mask is None:
        return None
    mask = mask[:, :, -queries:, :keys]
    if mask.dtype != torch.bool:
        mask = mask > torch.finfo(mask.dtype).min / 2
    return mask


def exact_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                            value: torch.Tensor, attention_mask: torch.Tensor | None, dropout: float = 0.0,
                            scaling: float | None = None, is_causal: bool | None = None,
                            **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: ``query`` ``[B, Hq, Q, D]``, ``key`` and
    ``value`` ``[B, Hkv, S, D]``; returns ``([B, Q, Hq, D], None)``. Without a mask the rows
    are causal (several queries) or see every key (one). Refuses what the kernel does not
    compute (a GPU tensor, a soft cap, a position bias, attention sinks) in one line."""
    for extra in ("softcap", "position_bias", "s_aux", "sinks"):
        if kwargs.get(extra) is not None:
            raise ExactUnavailableError(f"exact attention has no {extra}; run this model with exact = false")
    if query.device.type != "cpu":
        raise ExactUnavailableError(
            f"exact attention has no {query.device.type} kernel (specframe_exact_ops is CPU only); "
            "run with exact = false on this device")
    ops = load_extension()
    if ops is None:
        raise ExactUnavailableError(f"the exact attention kernel does not build here: {unavailable_reason()}")
    scale = float(scaling if scaling is not None else query.shape[-1] ** -0.5)
    causal = bool(getattr(module, "is_causal", True) if is_causal is None else is_causal) and query.shape[2] > 1
    mask = _visible(attention_mask, query.shape[2], key.shape[2])
    return ops.attention(query, key, value, mask, scale, causal), None


def reference_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    """The slow, obvious attention: for every row and head, the visible keys picked out, a
    float64 softmax over their scores, the weighted sum of their values. Same layouts as
    :func:`exact_attention_forward` (``mask`` bool ``[B, 1, Q, S]`` or None for all keys)."""
    batch, heads, queries, dim = query.shape
    group = heads // key.shape[1]
    out = torch.zeros(batch, queries, heads, dim, dtype=torch.float64)
    for b in range(batch):
        for i in range(queries):
            seen = torch.arange(key.shape[2]) if mask is None else mask[min(b, mask.shape[0] - 1), 0, i].nonzero()[:, 0]
            if seen.numel() == 0:
                continue
            for h in range(heads):
                k = key[b, h // group, seen].double()
                v = value[b, h // group, seen].double()
                weights = torch.softmax(k @ query[b, h, i].double() * scale, dim=0)
                out[b, i, h] = weights @ v
    return out.to(query.dtype)


def register() -> bool:
    """Register :data:`NAME` with transformers (idempotent): this attention, and the bool masks
    SDPA takes. False when transformers has no attention interface."""
    try:
        from transformers import AttentionInterface, AttentionMaskInterface
        from transformers.masking_utils import sdpa_mask
    except ImportError:
        return False
    AttentionInterface.register(NAME, exact_attention_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return True
