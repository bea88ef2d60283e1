"""``compile=True`` runs the target through torch.compile and still decodes losslessly."""

from __future__ import annotations

import torch

import specframe
from specframe.testing.harness import greedy_reference
from specframe.testing.models import tiny_model


def test_compiled_target_reproduces_greedy_decoding():
    torch._dynamo.reset()
    target = tiny_model("llama", seed=5, layers=1)
    dec = specframe.SpecDecoder.build(target=specframe.TargetModel(target, preallocate=True),
                                      drafter=("model", {"model": target}), policy="talon", compile=True)
    assert dec.target.compiled
    prompt = [3, 9, 4]
    out = dec.generate(prompt, max_new_tokens=12, eos_token_id=None)
    assert out.tokens == greedy_reference(target, prompt, 12, None)
    assert len(out.steps) > 1  # several tree sizes went through the compiled forward
