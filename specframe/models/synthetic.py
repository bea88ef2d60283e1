"""Tiny random transformers models built from a config (no download) and noisy copies of a model.

The product's ``random:<arch>`` and ``perturbed:<alias>`` experiment models (docs/experiments.md)
and the test suite's models (re-exported by :mod:`specframe.testing.models`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

# The architectures of the quick tests (and of ``random:`` models in experiment configs).
ARCHITECTURES = ("llama", "qwen2", "qwen3", "mistral", "gpt2")
# The architecture matrix of docs/architectures.md: every entry runs lossless speculative
# decoding against ``model.generate`` in tests/test_architectures.py. "-swa" variants slide.
MATRIX = ("llama", "qwen2", "qwen2-swa", "qwen3", "qwen3-swa", "mistral-swa", "gemma2", "gemma3",
          "phi3-swa", "gpt2", "gpt_neox", "olmo2", "olmo3", "starcoder2-swa", "cohere2", "gpt_oss")
# More causal LMs that take a 4D mask, one or two policies each (docs/architectures.md).
EXTENDED = ("mixtral-swa", "qwen3_moe-swa", "ministral", "smollm3", "exaone4", "gemma", "granite", "phi",
            "opt", "gpt_bigcode", "falcon")
# Attention kernels a tree mask works with, per architecture: transformers refuses SDPA for
# models with attention logit soft-capping (Gemma 2) or attention sinks (gpt-oss).
EAGER_ONLY = ("gemma2", "gpt_oss")
WINDOW = 8  # sliding window of the "-swa" and hybrid tiny models: prompts of 5x it stay cheap


def _llama_like(cls: Any, hidden: int, layers: int, heads: int, kv_heads: int, max_positions: int,
                **extra: Any) -> Any:
    """A config of the Llama family's argument names (most decoder-only models)."""
    return cls(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
               num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=hidden // heads,
               max_position_embeddings=max_positions, tie_word_embeddings=False, **extra)


def _hybrid_types(layers: int) -> list[str]:
    """Sliding first, full last: both kinds of layer in a 2-layer model."""
    return ["sliding_attention"] * (layers - 1) + ["full_attention"]


def _matrix_config(arch: str, hidden: int, layers: int, heads: int, kv_heads: int,
                   max_positions: int, common: dict) -> Any:
    """Configs of the architectures beyond the quick ones (see ``MATRIX``)."""
    import transformers as tf

    size = dict(hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads, max_positions=max_positions)
    hybrid = dict(sliding_window=WINDOW, layer_types=_hybrid_types(layers))
    if arch in ("qwen2-swa", "qwen3-swa"):
        cls = tf.Qwen2Config if arch == "qwen2-swa" else tf.Qwen3Config
        # Qwen slides on the layers from max_window_layers on: a hybrid model.
        return _llama_like(cls, **size, use_sliding_window=True, sliding_window=WINDOW,
                           max_window_layers=layers - 1, **common)
    if arch == "mistral-swa":
        return _llama_like(tf.MistralConfig, **size, sliding_window=WINDOW, **common)
    if arch == "gemma2":
        # soft-capping of attention scores and of the final logits, scaled embeddings
        return _llama_like(tf.Gemma2Config, **size, **hybrid, attn_logit_softcapping=5.0,
                           final_logit_softcapping=3.0, **common)
    if arch == "gemma3":
        # different rope bases for sliding and full layers, scaled embeddings, final soft-capping
        rope = {"sliding_attention": {"rope_type": "default", "rope_theta": 10.0},
                "full_attention": {"rope_type": "default", "rope_theta": 10_000.0}}
        return _llama_like(tf.Gemma3TextConfig, **size, **hybrid, rope_parameters=rope,
                           final_logit_softcapping=3.0, **common)
    if arch == "phi3-swa":
        cfg = tf.Phi3Config(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                            num_attention_heads=heads, num_key_value_heads=kv_heads,
                            max_position_embeddings=max_positions, original_max_position_embeddings=max_positions,
                            sliding_window=WINDOW, tie_word_embeddings=False, resid_pdrop=0.0,
                            embd_pdrop=0.0, attention_dropout=0.0, **common)
        return cfg
    if arch == "gpt_neox":
        return tf.GPTNeoXConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                                num_attention_heads=heads, max_position_embeddings=max_positions,
                                tie_word_embeddings=False, hidden_dropout=0.0, attention_dropout=0.0, **common)
    if arch == "olmo2":
        return _llama_like(tf.Olmo2Config, **size, **common)
    if arch == "olmo3":
        return _llama_like(tf.Olmo3Config, **size, **hybrid, **common)
    if arch == "starcoder2-swa":
        return tf.Starcoder2Config(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                                   num_attention_heads=heads, num_key_value_heads=kv_heads,
                                   max_position_embeddings=max_positions, sliding_window=WINDOW,
                                   tie_word_embeddings=False, residual_dropout=0.0, embedding_dropout=0.0,
                                   **common)
    if arch == "cohere2":
        return tf.Cohere2Config(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                                num_attention_heads=heads, num_key_value_heads=kv_heads,
                                max_position_embeddings=max_positions, **hybrid, **common)
    if arch == "gpt_oss":
        # attention sinks (a learned per-head logit in the softmax), a tiny mixture of experts
        rope = {"rope_type": "default", "rope_theta": 10_000.0}  # YaRN is not what is tested here
        cfg = _llama_like(tf.GptOssConfig, **size, **hybrid, num_local_experts=2, num_experts_per_tok=1,
                          rope_parameters=rope, **common)
        cfg._experts_implementation = "batched_mm"  # grouped_mm takes no float64; eager is 7x slower
        return cfg
    if arch in EXTENDED:
        return _extended_config(arch, size, hybrid, common)
    raise ValueError(f"unknown tiny architecture {arch!r}; valid: {', '.join(MATRIX + EXTENDED)}")


def _moe(cfg: Any) -> Any:
    cfg._experts_implementation = "batched_mm"  # grouped_mm takes no float64; eager is 7x slower
    return cfg


def _extended_config(arch: str, size: dict, hybrid: dict, common: dict) -> Any:
    """Configs of ``EXTENDED``: more of transformers' causal LMs, each with what sets it apart."""
    import transformers as tf

    hidden, layers, heads = size["hidden"], size["layers"], size["heads"]
    plain = dict(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                 max_position_embeddings=size["max_positions"], tie_word_embeddings=False, **common)
    if arch == "mixtral-swa":  # mixture of experts, every layer slides
        return _moe(_llama_like(tf.MixtralConfig, **size, sliding_window=WINDOW, num_local_experts=2,
                                num_experts_per_tok=1, **common))
    if arch == "qwen3_moe-swa":
        return _moe(_llama_like(tf.Qwen3MoeConfig, **size, use_sliding_window=True, sliding_window=WINDOW,
                                num_experts=2, num_experts_per_tok=1, moe_intermediate_size=hidden, **common))
    if arch == "ministral":
        return _llama_like(tf.MinistralConfig, **size, **hybrid, **common)
    if arch == "smollm3":  # hybrid, and layer 1 has no rotary embedding at all (NoPE)
        return _llama_like(tf.SmolLM3Config, **size, **hybrid, no_rope_layers=[1, 0], **common)
    if arch == "exaone4":
        return _llama_like(tf.Exaone4Config, **size, **hybrid, **common)
    if arch == "gemma":  # scaled embeddings, full attention
        return _llama_like(tf.GemmaConfig, **size, **common)
    if arch == "granite":  # embedding, residual, attention and logit multipliers
        return _llama_like(tf.GraniteConfig, **size, embedding_multiplier=2.0, residual_multiplier=0.5,
                           attention_multiplier=0.2, logits_scaling=2.0, **common)
    if arch == "phi":  # partial rotary embedding
        return tf.PhiConfig(intermediate_size=2 * hidden, partial_rotary_factor=0.5, resid_pdrop=0.0,
                            embd_pdrop=0.0, attention_dropout=0.0, **plain)
    if arch == "opt":  # learned absolute positions
        return tf.OPTConfig(ffn_dim=2 * hidden, word_embed_proj_dim=hidden, dropout=0.0,
                            attention_dropout=0.0, **plain)
    if arch == "gpt_bigcode":  # multi-query attention, learned absolute positions
        return tf.GPTBigCodeConfig(n_embd=hidden, n_layer=layers, n_head=heads, n_positions=size["max_positions"],
                                   resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **common)
    if arch == "falcon":
        return tf.FalconConfig(hidden_dropout=0.0, attention_dropout=0.0, **plain)
    raise ValueError(arch)


def tiny_config(arch: str = "llama", vocab_size: int = 64, hidden: int = 32, layers: int = 2,
                heads: int = 4, kv_heads: int = 2, max_positions: int = 512,
                attn_implementation: str = "sdpa") -> Any:
    """A small config of one of ``MATRIX`` (``ARCHITECTURES`` included) or ``EXTENDED`` with
    the given attention implementation."""
    import transformers as tf

    common = dict(vocab_size=vocab_size, bos_token_id=0, eos_token_id=1, pad_token_id=0)
    if arch == "gpt2":
        cfg = tf.GPT2Config(n_embd=hidden, n_layer=layers, n_head=heads, n_positions=max_positions,
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **common)
    elif arch in ("llama", "qwen2", "qwen3", "mistral"):
        cls = {"llama": tf.LlamaConfig, "qwen2": tf.Qwen2Config, "qwen3": tf.Qwen3Config,
               "mistral": tf.MistralConfig}[arch]
        extra = {"sliding_window": None} if arch in ("mistral", "qwen2", "qwen3") else {}
        cfg = _llama_like(cls, hidden, layers, heads, kv_heads, max_positions, **extra, **common)
    else:
        cfg = _matrix_config(arch, hidden, layers, heads, kv_heads, max_positions, common)
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
    for module in draft.modules():  # kernels that packed a copy of their weight must see the noise
        if hasattr(module, "repack"):
            module.repack()
    return draft.eval()


@dataclass
class RandomModelOptions:
    """The ``random`` table of a ``random:<arch>`` model (arguments of :func:`tiny_model`)."""

    vocab_size: int = 64
    hidden: int = 32
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    max_positions: int = 512
    seed: int = 0
    init_std: float = 0.3


@dataclass
class PerturbedOptions:
    """The ``random`` table of a ``perturbed:<alias>`` model (arguments of :func:`perturbed_copy`)."""

    noise: float = 0.05
    seed: int = 0
