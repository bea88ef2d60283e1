"""SDPA with grouped K/V heads passed as they are (specframe.models.attention): installed only where it
applies, the same logits as transformers' copying path under a tree mask, and lossless
speculative decoding on a model that uses it."""

import pytest
import torch

import specframe
from specframe.sizing import profile
from specframe.models.attention import NAME, use_gqa_sdpa
from specframe.models.target import TargetModel
from specframe.testing.harness import check_output, greedy_reference
from specframe.testing.models import tiny_model


def test_only_a_grouped_sdpa_model_on_the_cpu_is_switched():
    grouped = tiny_model("llama", heads=4, kv_heads=2)
    assert use_gqa_sdpa(grouped) and grouped.config._attn_implementation == NAME
    ungrouped = tiny_model("llama", heads=4, kv_heads=4)
    assert not use_gqa_sdpa(ungrouped) and ungrouped.config._attn_implementation == "sdpa"
    eager = tiny_model("llama", attn_implementation="eager")
    assert not use_gqa_sdpa(eager) and eager.config._attn_implementation == "eager"


def test_the_cost_curve_of_a_switched_model_is_cached_apart():
    model = tiny_model("llama")
    before = profile.model_label(model)
    use_gqa_sdpa(model)
    assert profile.model_label(model) == before + "-gqa"


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tree_forward_logits_equal_the_copying_paths(arch):
    copying = TargetModel(tiny_model(arch, seed=3))
    switched_model = tiny_model(arch, seed=3)
    assert use_gqa_sdpa(switched_model)
    switched = TargetModel(switched_model)
    tree = profile.balanced_tree(7, 64, fanout=2)  # three levels: siblings must not see each other
    logits = []
    for target in (copying, switched):
        target.reset()
        target.causal_forward(torch.arange(2, 30) % target.vocab_size)
        out = target.tree_forward(tree.tokens, tree.positions(28), tree.ancestor_mask())
        logits.append(out.logits)
    torch.testing.assert_close(logits[1], logits[0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("policy", [("talon", {"budget": 8}), ("chain", {"gamma": 3})])
def test_speculative_decoding_with_grouped_sdpa_equals_greedy_decoding(policy):
    model = tiny_model("llama", seed=1)
    draft = tiny_model("llama", seed=1, init_std=0.3)
    assert use_gqa_sdpa(model) and use_gqa_sdpa(draft)
    prompt = [5, 6, 7, 8, 9]
    eos = int(model.config.eos_token_id)
    ref = greedy_reference(model, prompt, 24, eos)
    dec = specframe.SpecDecoder.build(target=model, drafter=("model", {"model": draft}), policy=policy,
                                      verifier="greedy")
    out = dec.generate(prompt, max_new_tokens=24, eos_token_id=eos)
    check_output(out, ref, 24, eos, "grouped sdpa")
    assert len(ref) > 8 and out.tau > 1.0
