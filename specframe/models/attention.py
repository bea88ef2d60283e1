"""SDPA attention that hands grouped-query K/V to the kernel as they are (``enable_gqa``).

Every forward of the engine passes an explicit 4D mask (the tree's ancestor mask over the
cache). With a mask, transformers' SDPA path copies each layer's K/V to all query heads
(``repeat_kv``) before attention, except for a single query (which it folds into the query
length, so this module leaves that case to it). SmolLM2-135M has 9 query heads
over 3 K/V heads, so a 16-token tree forward on a 200-token cache copied 30 x 2 tensors three
times their size; PyTorch's CPU SDPA takes the grouped heads directly (``enable_gqa=True``,
torch >= 2.5). On a 2-core Xeon that shortens a 16-token forward by 2.6-4 ms and leaves one
token unchanged (docs/results.md). Same arithmetic, no copy: the outputs agree
with the copying path to float rounding.

It is registered with transformers under :data:`NAME` (attention and mask interfaces alike, so
the model's own ``generate`` keeps working) and installed by :func:`use_gqa_sdpa`, which
:func:`specframe.models.target.load_causal_lm` applies to CPU models loaded with ``"sdpa"``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

NAME = "sdpa_gqa"


def gqa_sdpa_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                               value: torch.Tensor, attention_mask: torch.Tensor | None, dropout: float = 0.0,
                               scaling: float | None = None, is_causal: bool | None = None,
                               **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature. A masked grouped-query call of several
    queries runs SDPA with ``enable_gqa``; anything else (one query, no mask, a position bias, a
    soft cap) goes to transformers' own SDPA function unchanged."""
    grouped = getattr(module, "num_key_value_groups", 1) > 1
    plain = kwargs.get("position_bias") is None and kwargs.get("softcap") is None
    # One query: transformers folds the heads into the query length instead (no copy either),
    # which measured as fast or faster than enable_gqa there.
    if not (grouped and plain and attention_mask is not None and query.shape[2] > 1):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                         scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def register() -> bool:
    """Register :data:`NAME` with transformers (idempotent). False when transformers has no
    attention/mask interfaces or torch's SDPA has no ``enable_gqa``."""
    try:
        from transformers import AttentionInterface, AttentionMaskInterface
        from transformers.masking_utils import sdpa_mask
    except ImportError:
        return False
    if "enable_gqa" not in (F.scaled_dot_product_attention.__doc__ or ""):
        return False
    AttentionInterface.register(NAME, gqa_sdpa_attention_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return True


def use_gqa_sdpa(model: Any) -> bool:
    """Switch a CPU ``model`` whose attention is ``"sdpa"`` and has grouped K/V heads to
    :data:`NAME`. Returns whether it did; anything else is left as it is."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    on_cpu = next(model.parameters()).device.type == "cpu"
    if getattr(model.config, "_attn_implementation", None) != "sdpa" or not on_cpu or not heads or kv_heads == heads:
        return False
    if not register():
        return False
    model.set_attn_implementation(NAME)
    return model.config._attn_implementation == NAME
