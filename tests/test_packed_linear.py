"""MKL-packed linears: same results as nn.Linear up to float32 rounding, for every row count
(inside a bucket, between buckets, above the largest), and lossless speculative decoding on a
model whose linears are all packed (every forward, plain or tree, runs the packed model)."""

import pytest
import torch
from torch import nn

import specframe
from specframe.packed_linear import PackedLinear, pack_linears, packing_available
from specframe.testing.models import tiny_model

pytestmark = pytest.mark.skipif(not packing_available(), reason="this torch build has no MKL (non-x86)")


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 9, 40])
def test_packed_linear_matches_linear(rows):
    torch.manual_seed(rows)
    lin = nn.Linear(48, 96)
    packed = PackedLinear(lin, buckets=(1, 2, 4, 8))
    x = torch.randn(1, rows, 48)
    with torch.no_grad():
        want, got = lin(x), packed(x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_pack_linears_replaces_every_float32_linear_and_keeps_the_weights():
    model = tiny_model("llama", seed=0, dtype=torch.float32)
    n_linear = sum(type(m) is nn.Linear for m in model.modules())
    weight = model.lm_head.weight
    assert pack_linears(model) == n_linear > 0
    assert not any(type(m) is nn.Linear for m in model.modules())
    assert model.lm_head.weight is weight  # same parameter (ties survive)


def test_speculative_decoding_on_a_packed_model_equals_its_greedy_decoding():
    model = tiny_model("llama", seed=0, dtype=torch.float32)
    pack_linears(model)
    prompt = [5, 6, 7, 8, 9]
    ref = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=20)[0, len(prompt):].tolist()
    dec = specframe.SpecDecoder.build(target=model, drafter=("ngram", {}), policy=("talon", {"budget": 8}),
                                      verifier="greedy")
    assert dec.generate(prompt, max_new_tokens=20, eos_token_id=None).tokens == ref
