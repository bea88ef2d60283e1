"""Tiny random transformers models for tests (no download; built from configs)."""

from __future__ import annotations

import copy
from typing import Any

import torch

ARCHITECTURES = ("llama", "qwen2", "qwen3", "mistral", "gpt2")


def tiny_config(arch: str = "llama", vocab_size: int = 64, hidden: int = 32, layers: int = 2,
                heads: int = 4, kv_heads: int = 2, max_positions: int = 512,
                attn_implementation: str = "sdpa") -> Any:
    """A small config of one of ``ARCHITECTURES`` with the given attention implementation."""
    import transformers as tf

    common = dict(vocab_size=vocab_size, bos_token_id=0, eos_token_id=1, pad_token_id=0)
    if arch == "gpt2":
        cfg = tf.GPT2Config(n_embd=hidden, n_layer=layers, n_head=heads, n_positions=max_positions,
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **common)
    else:
        cls = {"llama": tf.LlamaConfig, "qwen2": tf.Qwen2Config, "qwen3": tf.Qwen3Config,
               "mistral": tf.MistralConfig}[arch]
        extra = {"sliding_window": None} if arch in ("mistral", "qwen2", "qwen3") else {}
        cfg = cls(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=hidden // heads,
                  max_position_embeddings=max_positions, tie_word_embeddings=False, **extra, **common)
    cfg._attn_implementation = attn_implementation
    return cfg


def tiny_model(arch: str = "llama", seed: int = 0, dtype: torch.dtype = torch.float64,
               attn_implementation: str = "sdpa", init_std: float = 0.3, **config: Any) -> Any:
    """A randomly initialised tiny causal LM in ``dtype`` (float64 for exact greedy equality).

    ``init_std`` is larger than transformers' default so that logits are peaked enough for
    drafts to be accepted now and then, as with a real pair.
    """
    import transformers as tf

    cfg = tiny_config(arch, attn_implementation=attn_implementation, **config)
    cfg.initializer_range = init_std
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(cfg, attn_implementation=attn_implementation)
    return model.to(dtype).eval()


def perturbed_copy(model: Any, noise: float, seed: int = 0) -> Any:
    """A copy of ``model`` with Gaussian noise added to every weight: a draft that agrees often."""
    draft = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * noise * p.std().clamp(min=1e-3))
    return draft.eval()
