"""Divergence reports: the first differing position and the target's logit margin there."""

import torch

from specframe.experiments.divergence import find_divergence, first_difference
from specframe.testing.models import tiny_model


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2, 3], [1, 2]) == 2  # the arm stopped early
    assert first_difference([1, 2], [1, 2, 7]) == 2


def test_divergence_names_position_tokens_and_the_targets_margin():
    model = tiny_model("llama", seed=0)
    prompt = [3, 1, 4, 1, 5]
    gen = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=6, output_scores=True,
                         return_dict_in_generate=True)
    reference = gen.sequences[0, len(prompt):].tolist()
    answer = reference[:3] + [(reference[3] + 1) % model.config.vocab_size] + reference[4:]
    div = find_divergence(model, "chain", 7, 0, 0, prompt, reference, answer)
    assert (div.position, div.reference_token, div.arm_token) == (3, reference[3], answer[3])
    top = torch.topk(gen.scores[3][0].double(), 2).values  # generate's own logits at that step
    assert abs(div.margin - float(top[0] - top[1])) < 1e-4
    assert find_divergence(model, "chain", 7, 0, 0, prompt, reference, list(reference)) is None
