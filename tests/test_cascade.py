"""The hybrid drafter's cascade: retrieve first, draft with a model only on the steps where
retrieval is unsure; lossless under every policy, the model part's state kept whole."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specframe.decode.engine import SpecDecoder, make_plugin
from specframe.models.target import TargetModel
from specframe.options import OptionError
from specframe.plugins import get_registry
from specframe.testing.fixtures import VOCAB, default_drafter, fixed_policy_spec, tiny_target
from specframe.testing.harness import greedy_by_recomputation
from specframe.testing.profiles import profile_examples

from specframe.drafters.hybrid import HybridDrafter

POLICIES = get_registry().names("policies")
EXAMPLES = max(2, profile_examples() // 3)
MAX_NEW = 12


def cascade(threshold: float, model_part: str = "eagle3") -> tuple[SpecDecoder, HybridDrafter]:
    """ngram first, then a model part (the tiny EAGLE-3 head or draft model), as a cascade."""
    target = TargetModel(tiny_target())
    parts = [make_plugin("drafters", "ngram", target), default_drafter(model_part, target)]
    hybrid = HybridDrafter.from_parts(parts, target, mode="cascade", threshold=threshold)
    return target, hybrid


def decoder(hybrid: HybridDrafter, target: TargetModel, policy: str) -> SpecDecoder:
    return SpecDecoder(target, hybrid, make_plugin("policies", fixed_policy_spec(policy)), make_plugin("verifiers", "greedy"))


@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=EXAMPLES, deadline=None)
@given(prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=10), threshold=st.sampled_from([0.3, 0.7, 0.95]),
       model_part=st.sampled_from(["eagle3", "model"]))
def test_a_cascade_is_lossless_under_every_policy(policy, prompt, threshold, model_part):
    target, hybrid = cascade(threshold, model_part)
    out = decoder(hybrid, target, policy).generate(prompt, max_new_tokens=MAX_NEW, eos_token_id=None)
    assert out.tokens == greedy_by_recomputation(tiny_target(), prompt, MAX_NEW, None)
    assert hybrid.steps_asked[0] == len(out.steps) >= hybrid.steps_asked[1]


def test_threshold_zero_is_the_first_part_alone():
    """The first part is always confident enough: the steps are the n-gram drafter's own."""
    prompt = [4, 9, 12, 30, 2, 17, 9, 12, 30, 2]
    target, hybrid = cascade(0.0)
    mixed = decoder(hybrid, target, "talon").generate(prompt, max_new_tokens=MAX_NEW, eos_token_id=None)
    alone = SpecDecoder(target, make_plugin("drafters", "ngram", target), make_plugin("policies", fixed_policy_spec("talon")),
                        make_plugin("verifiers", "greedy")).generate(prompt, max_new_tokens=MAX_NEW, eos_token_id=None)
    assert [(s.tree_size, s.widths, s.accepted_ranks) for s in mixed.steps] == \
        [(s.tree_size, s.widths, s.accepted_ranks) for s in alone.steps]
    assert hybrid.steps_asked[1] == 0


def test_the_model_part_sits_out_confident_steps_and_keeps_its_state():
    """A repetitive prompt: the n-gram copy is sure on some steps, not on others, so the head
    drafts only some steps; after skipping it still drafts from every committed token (its
    trees on the steps it drafts equal those of a cascade that never skips: threshold 1)."""
    prompt = [4, 9, 12, 30, 2, 17, 9, 12, 30, 2, 17, 9, 12]
    target, hybrid = cascade(0.9)
    out = decoder(hybrid, target, "talon").generate(prompt, max_new_tokens=24, eos_token_id=None)
    assert 0 < hybrid.steps_asked[1] < len(out.steps)
    assert out.tokens == greedy_by_recomputation(tiny_target(), prompt, 24, None)


def test_a_skipping_head_drafts_as_one_that_never_skipped():
    """After a generation in which the cascade's head sat out steps, it drafts the next root
    exactly as a head that drafted every step (a merge hybrid's) over the same committed
    tokens: its state is the committed prefix, whatever it skipped."""
    import torch

    from specframe.tree import DraftTree

    prompt = [4, 9, 12, 30, 2, 17, 9, 12, 30, 2, 17, 9, 12]
    target = TargetModel(tiny_target())
    sometimes, always = default_drafter("eagle3", target), default_drafter("eagle3", target)
    skip = HybridDrafter.from_parts([make_plugin("drafters", "ngram", target), sometimes], target,
                                    mode="cascade", threshold=0.9)
    full = HybridDrafter.from_parts([make_plugin("drafters", "ngram", target), always], target)
    outs = [decoder(h, target, "talon").generate(prompt, max_new_tokens=24, eos_token_id=None) for h in (skip, full)]
    assert outs[0].tokens == outs[1].tokens and 0 < skip.steps_asked[1] < len(outs[0].steps)
    root = DraftTree.root(outs[0].tokens[-1])
    rows = [head.expand(root, torch.tensor([0])) for head in (sometimes, always)]
    assert torch.allclose(rows[0], rows[1], atol=1e-9)


@pytest.mark.parametrize("values, option", [({"mode": "both"}, "mode"), ({"mode": "cascade", "threshold": 1.5}, "threshold"),
                                            ({"mode": "cascade", "score": "calibrated"}, "score")])
def test_bad_cascade_options_name_the_option(values, option):
    target = TargetModel(tiny_target())
    with pytest.raises(OptionError, match=f"'{option}'"):
        make_plugin("drafters", ("hybrid", values), target)
