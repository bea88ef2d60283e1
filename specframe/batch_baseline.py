"""The baseline of batched speculative decoding: batched greedy autoregressive decoding."""

from __future__ import annotations

import copy
from typing import Any, Sequence

import torch

from .batch import BatchDecoder


@torch.inference_mode()
def autoregressive_batch(model: Any, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                         eos: set[int]) -> list[list[int]]:
    """Batched greedy baseline: transformers ``generate`` on the left-padded prompts with the
    all-ones-where-real attention mask; each row cut after its first EOS.

    ``eos`` empty: no stopping, and the config's EOS id is an ordinary token (``min_new_tokens``
    would mask it instead, unlike the speculative arms).
    """
    width = max(len(p) for p in prompts)
    pad = min(eos) if eos else 0
    ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    config = copy.deepcopy(model.generation_config)
    config.update(do_sample=False, max_new_tokens=max_new_tokens, min_new_tokens=None,
                  eos_token_id=sorted(eos), pad_token_id=pad)  # [] = no EOS (None: the model's own)
    out = model.generate(ids.to(model.device), attention_mask=mask.to(model.device), generation_config=config)
    return [BatchDecoder._cut(row[width:].tolist(), max_new_tokens, eos) for row in out]
