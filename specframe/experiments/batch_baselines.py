"""The baseline of batched speculative decoding: batched greedy autoregressive decoding."""

from __future__ import annotations

import copy
from typing import Any, Sequence

import torch

from specframe.decode.engine import cut_output


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
    return [cut_output(row[width:].tolist(), max_new_tokens, eos) for row in out]


@torch.inference_mode()
def autoregressive_refill(target: Any, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                          eos: set[int], max_live: int, layout: str = "padded") -> list[list[int]]:
    """Batched greedy decoding with continuous batching: at most ``max_live`` sequences at
    once, each step one forward of every live row's last token over the ragged batch cache
    (:class:`specframe.decode.kv_padded.BatchKV`, as the speculative arms use it) and one host read of
    the argmaxes; a row that finishes is replaced by the next prompt. The autoregressive
    counterpart of ``BatchDecoder.generate(max_live=...)``, so a comparison with it isolates
    what speculation adds to the refilling that both do. ``target``: a ``TargetModel``;
    ``layout``: the batch cache's (``BatchDecoder``'s ``layout``; one-node trees pad nothing).
    """
    from specframe.decode.kv_flat import make_batch_kv
    from specframe.tree import DraftTree

    ids = [list(map(int, p)) for p in prompts]
    out: list[list[int]] = [[] for _ in ids]
    width = min(max_live, len(ids))
    kv = make_batch_kv(target, layout, reserve=max_new_tokens + 1)
    kv.prefill([torch.tensor(p[:-1], dtype=torch.long) for p in ids[:width]])
    live, waiting = list(range(width)), list(range(width, len(ids)))
    last = [ids[i][-1] for i in live]
    while live:
        start = kv.width
        logits = kv.tree_forward([DraftTree.root(t, device=target.device) for t in last]).logits
        nexts = torch.cat(kv.rows_of(logits)).argmax(-1).tolist()  # the step's one host read
        paths, still, kept = [], [], []
        for i, tok in zip(live, nexts):
            out[i].append(tok)
            done = tok in eos or len(out[i]) >= max_new_tokens
            paths.append(None if done else torch.zeros(1, dtype=torch.long))
            if not done:
                still.append(i)
                kept.append(tok)
        kv.keep(paths, start)
        live, last = still, kept
        if waiting and len(live) < width:
            joining, waiting = waiting[: width - len(live)], waiting[width - len(live) :]
            kv.join([torch.tensor(ids[i][:-1], dtype=torch.long) for i in joining])
            live += joining
            last += [ids[i][-1] for i in joining]
    return out
