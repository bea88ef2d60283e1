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
from specframe.testing.conformance import DrafterConformance
from specframe.testing.fixtures import VOCAB, default_drafter, fixed_policy_spec, tiny_target
from specframe.testing.harness import greedy_by_recomputation
from specframe.testing.profiles import profile_examples

from specframe.drafters.hybrid import HybridDrafter

POLICIES = get_registry().names("policies")
EXAMPLES = max(2, profile_examples() // 3)
MAX_NEW = 12


def cascade(threshold: float | str, model_part: str = "eagle3") -> tuple[SpecDecoder, HybridDrafter]:
    """ngram first, then a model part (the tiny EAGLE-3 head or draft model), as a cascade."""
    target = TargetModel(tiny_target())
    parts = [make_plugin("drafters", "ngram", target), default_drafter(model_part, target)]
    hybrid = HybridDrafter.from_parts(parts, target, mode="cascade", threshold=threshold)
    return target, hybrid


def decoder(hybrid: HybridDrafter, target: TargetModel, policy: str) -> SpecDecoder:
    return SpecDecoder(target, hybrid, make_plugin("policies", fixed_policy_spec(policy)), make_plugin("verifiers", "greedy"))


@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=EXAMPLES, deadline=None)
@given(prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=10), threshold=st.sampled_from([0.3, 0.7, 0.95, "auto"]),
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
                                            ({"mode": "cascade", "threshold": "fast"}, "threshold"),
                                            ({"mode": "cascade", "score": "calibrated"}, "score")])
def test_bad_cascade_options_name_the_option(values, option):
    target = TargetModel(tiny_target())
    with pytest.raises(OptionError, match=f"'{option}'"):
        make_plugin("drafters", ("hybrid", values), target)


class FakeClock:
    """The gate's clock: each step lasts what the test says."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run_gate(gate, clock, steps: int, probability: float, outcome) -> list[bool]:
    """``steps`` decisions at ``probability``; ``outcome(asked)`` gives (tokens, seconds)."""
    choices = []
    for _ in range(steps):
        asked = gate.ask(1, probability)
        tokens, seconds = outcome(asked)
        clock.now += seconds
        gate.settle(tokens)
        choices.append(asked)
    return choices


def test_the_auto_gate_asks_where_asking_pays_and_explores():
    from specframe.drafters.cascade_gate import EXPLORE, WARM, CascadeGate

    clock = FakeClock()
    gate = CascadeGate(1, clock=clock)
    gate.start()
    # Unsure copy (bin of 0.1): the head doubles the tokens for 1.5x the time -> ask.
    pays = run_gate(gate, clock, 40, 0.1, lambda asked: (4, 0.03) if asked else (2, 0.02))
    # Sure copy (bin of 0.99): the head adds nothing and costs time -> skip.
    wastes = run_gate(gate, clock, 40, 0.99, lambda asked: (3, 0.03) if asked else (3, 0.02))
    for choices, wanted in ((pays, True), (wastes, False)):
        warm, rest = choices[: 2 * WARM], choices[2 * WARM:]
        assert warm.count(True) == warm.count(False) == WARM
        against = [i for i, c in enumerate(rest) if c != wanted]
        assert against == [i for i in range(len(rest)) if (i + 1) % EXPLORE == 0]


def test_an_auto_cascade_keeps_its_gate_across_requests_and_replays_approximately():
    target, hybrid = cascade("auto")
    assert hybrid.persistent_state and hybrid.replay == "approximate"
    dec = decoder(hybrid, target, "talon")
    prompt = [4, 9, 12, 30, 2, 17, 9, 12, 30, 2]
    for _ in range(2):
        out = dec.generate(prompt, max_new_tokens=MAX_NEW, eos_token_id=None)
        assert out.tokens == greedy_by_recomputation(tiny_target(), prompt, MAX_NEW, None)
    assert sum(sum(t) for t in hybrid.gate.tries) == sum(hybrid.steps_asked[:1]) > len(out.steps)
    fixed = cascade(0.5)[1]
    assert not fixed.persistent_state and fixed.gate is None


class TestCascadeConformance(DrafterConformance):
    """The cascade of the n-gram lookup and the tiny EAGLE-3 head at a fixed threshold."""

    plugin = "hybrid"

    def make_drafter(self, target: TargetModel):
        parts = [make_plugin("drafters", "ngram", target), default_drafter("eagle3", target)]
        return HybridDrafter.from_parts(parts, target, mode="cascade", threshold=0.7)


class TestCascadeAutoConformance(DrafterConformance):
    """The cascade's second setting: ``threshold = "auto"`` (state across requests: checked
    after earlier generations), the draft model as its model part."""

    plugin = "hybrid"

    def make_drafter(self, target: TargetModel):
        parts = [make_plugin("drafters", "ngram", target), default_drafter("model", target)]
        return HybridDrafter.from_parts(parts, target, mode="cascade", threshold="auto")


def test_set_clock_reaches_the_auto_gate_and_two_instances_then_decide_alike():
    """The cascade's "auto" gate reads the clock the hybrid is given (``uses_clock``): under
    one TickClock each, two instances fed the same generations draw the same trees, which the
    wall clock does not promise."""
    from specframe.clock import TickClock

    target = TargetModel(tiny_target())

    def steps() -> list[int]:
        parts = [make_plugin("drafters", "ngram", target), default_drafter("model", target)]
        drafter = HybridDrafter.from_parts(parts, target, mode="cascade", threshold="auto")
        assert drafter.uses_clock
        clock = TickClock()
        drafter.set_clock(clock)
        dec = SpecDecoder.build(target=target, drafter=drafter, policy=("chain", {"gamma": 3}), verifier="greedy")
        sizes = []
        for prompt in ([5, 17, 9, 33], [5, 17, 9, 2], [11, 3, 3, 28]):
            sizes += [s.tree_size for s in dec.generate(prompt, max_new_tokens=12, eos_token_id=None).steps]
        assert clock.readings > 0, "the gate never read the clock it was given"
        return sizes

    assert steps() == steps()
    fixed = HybridDrafter.from_parts([make_plugin("drafters", "ngram", target)], target, mode="cascade", threshold=0.5)
    assert not fixed.uses_clock
