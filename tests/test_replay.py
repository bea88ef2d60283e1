"""Replay equals live, step by step, for deterministic drafters x policies x prompts.

The continuation comes from transformers' own greedy ``generate`` (not from the replay code),
so a replay target that verifies against the wrong token fails here.
"""

from __future__ import annotations

from functools import lru_cache

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specframe.decode.engine import SpecDecoder, make_plugin
from specframe.options import NoOptions
from specframe.replay import ReplayTarget, ReplayVerifier, Trace
from specframe.replay.trace import PromptTrace
from specframe.models.target import TargetModel, load_causal_lm
from specframe.testing.fixtures import close_draft, tiny_target
from specframe.testing.harness import greedy_reference
from specframe.testing.profiles import profile_examples

POLICIES = [("chain", {"gamma": 3}), ("talon", {"budget": 10, "mu": 0.03}),
            ("eagle", {"budget": 10, "top_k": 3, "depth": 4}), ("opt-tree", {"budget": 8})]
DRAFTERS = ["ngram", "model"]
MAX_NEW = 12
EXTRA = 12
FIELDS = ("tree_size", "depth", "accepted", "emitted", "draft_forwards", "accepted_ranks", "widths")


@lru_cache(maxsize=None)
def _pair(which: str) -> tuple:
    """(target model, draft model): the shipped tiny demo pair, or a float64 random model and
    a perturbed copy of it."""
    if which == "demo":
        return load_causal_lm("demo-target", dtype=torch.float64), load_causal_lm("demo-draft", dtype=torch.float64)
    target = tiny_target()
    return target, close_draft(target)


def _drafter(name: str, draft: object, target: TargetModel) -> object:
    spec = ("model", {"model": draft}) if name == "model" else (name, {})
    return make_plugin("drafters", spec, target)


def _live(pair: tuple, drafter: str, policy: tuple, prompt: list[int], eos: int | None = None):
    target = TargetModel(pair[0])
    dec = SpecDecoder.build(target, drafter=_drafter(drafter, pair[1], target), policy=policy, verifier="greedy")
    return dec.generate(prompt, max_new_tokens=MAX_NEW, eos_token_id=eos)


def _replay(pair: tuple, drafter: str, policy: tuple, prompt: list[int], cont: list[int], eos: int | None = None):
    trace = Trace({}, {}, {"p": PromptTrace("p", list(prompt), cont, MAX_NEW)})
    target = ReplayTarget(pair[0], trace)
    target.use(prompt)
    dec = SpecDecoder(target, _drafter(drafter, pair[1], target), make_plugin("policies", policy),
                      ReplayVerifier(NoOptions()))
    return dec.generate(prompt, max_new_tokens=MAX_NEW, eos_token_id=eos), target


def _assert_same(live, replay) -> None:
    assert replay.tokens == live.tokens
    assert len(replay.steps) == len(live.steps)
    for i, (a, b) in enumerate(zip(live.steps, replay.steps)):
        for f in FIELDS:
            assert getattr(b, f) == getattr(a, f), f"step {i}: {f} live {getattr(a, f)} replay {getattr(b, f)}"
    assert replay.tau == live.tau and replay.delta == live.delta


@pytest.mark.parametrize("which", ["random", "demo"])
@settings(max_examples=profile_examples())
@given(data=st.data())
def test_replay_equals_live_per_step(which: str, data: st.DataObject) -> None:
    pair = _pair(which)
    vocab = int(pair[0].config.vocab_size)
    policy = data.draw(st.sampled_from(POLICIES), label="policy")
    drafter = data.draw(st.sampled_from(DRAFTERS), label="drafter")
    # Short repetitive prompts give the n-gram drafter something to match.
    unit = data.draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=5), label="unit")
    prompt = (unit * data.draw(st.integers(1, 4), label="repeats"))[:16]
    # Recorded as `specframe record` does: past the stop, EOS ignored.
    cont = greedy_reference(pair[0], prompt, MAX_NEW + EXTRA, None)
    # Sometimes an EOS id the continuation reaches, so the stop falls inside it.
    eos = data.draw(st.one_of(st.none(), st.sampled_from(cont[:MAX_NEW])), label="eos")
    live = _live(pair, drafter, policy, prompt, eos)
    replay, target = _replay(pair, drafter, policy, prompt, cont, eos)
    _assert_same(live, replay)
    assert target.replay_calls == len(replay.steps) + (len(prompt) > 1)  # no target model forward at all


def test_replay_refuses_a_prompt_it_did_not_record() -> None:
    from specframe.replay import TraceError

    trace = Trace({}, {}, {"p": PromptTrace("p", [1, 2, 3], [4, 5], 2)})
    target = ReplayTarget(tiny_target(), trace)
    with pytest.raises(TraceError, match="prompts differ"):
        target.use([1, 2])


def test_trace_mismatch_names_the_difference() -> None:
    from specframe.replay import TraceError

    trace = Trace({}, {"target_model": "a", "max_new_tokens": 64}, {})
    with pytest.raises(TraceError, match="max_new_tokens = 64.*has 32"):
        trace.check_matches({"target_model": "a", "max_new_tokens": 32})


def test_undeclared_and_unsupported_drafters_are_refused() -> None:
    from specframe.replay.runner import ReplayError, check_drafter

    class Undeclared:
        name = "x"

    class Unsupported:
        name = "y"
        replay = "unsupported"

    with pytest.raises(ReplayError, match="does not declare"):
        check_drafter(Undeclared(), "arm 'a'")
    with pytest.raises(ReplayError, match="unsupported"):
        check_drafter(Unsupported(), "arm 'b'")


def test_builtin_drafters_declare_replay() -> None:
    from specframe.plugins import get_registry

    reg = get_registry()
    assert reg.get("drafters", "ngram").replay == "exact"
    assert reg.get("drafters", "model").replay == "exact"
    assert reg.get("drafters", "eagle3").replay == "approximate"


def test_rest_fit_recovers_a_line_and_never_goes_negative() -> None:
    from specframe.replay.projection import fit_rest

    a, b = fit_rest([(1, 0.002), (3, 0.004), (5, 0.006)])  # 2 ms + 1 ms per drafted node
    assert a == pytest.approx(0.002) and b == pytest.approx(0.001)
    assert fit_rest([(1, 0.003), (5, 0.001)])[1] == 0.0
    assert fit_rest([]) == (0.0, 0.0)


def test_projected_policy_writes_curve_times_into_the_steps() -> None:
    from specframe.interfaces import StepStats
    from specframe.sizing.profile import CostCurve
    from specframe.replay.projection import ProjectedPolicy, StepModel

    curve = CostCurve("c", [1, 2, 4], [0, 100], [[1.0, 2.0, 4.0], [2.0, 3.0, 5.0]])
    model = StepModel(curve, "test", rest_fixed=0.5, rest_per_node=0.25, curve_scale=2.0)

    class Target:
        last_context = 51  # 50 cached tokens: halfway between the rows

    policy = ProjectedPolicy(make_plugin("policies", ("chain", {"gamma": 3})), model, Target())
    step = StepStats(tree_size=2, depth=1, accepted=1, emitted=2, draft_forwards=1, draft_time=0.1,
                     policy_time=0.0, target_time=0.01, verify_time=0.02, other_time=0.0, widths=[1, 1],
                     accepted_ranks=[0], budget_cut=0)
    policy.observe(step)
    assert step.target_time == pytest.approx(2.0 * 2.5) and step.verify_time == pytest.approx(0.75)
    assert policy.replaced == pytest.approx(0.03) and policy.added == pytest.approx(5.75)


def test_eagle3_replay_over_recorded_hidden_states_matches_live_in_float64(tmp_path) -> None:
    """An approximate drafter: in float64 the full forward's hidden states equal the tree
    forward's closely enough that the tiny pair's EAGLE-3 head replays step for step."""
    from specframe.replay.record import _IndexSpy
    from specframe.replay.trace import save_hidden

    model = _pair("demo")[0]
    spec = ("eagle3", {"path": "demo-eagle", "dtype": "float64"})
    policy = ("talon", {"budget": 10, "mu": 0.03})
    prompt = list(range(5, 40))
    target = TargetModel(model)
    live = SpecDecoder(target, make_plugin("drafters", spec, target), make_plugin("policies", policy),
                       make_plugin("verifiers", "greedy")).generate(prompt, max_new_tokens=MAX_NEW, eos_token_id=None)
    cont = greedy_reference(model, prompt, MAX_NEW + EXTRA, None)
    target.reset()
    states = target.causal_forward(torch.tensor(prompt + cont), True).hidden_states
    spy = _IndexSpy(states)
    make_plugin("drafters", spec, target).begin(torch.tensor(prompt), target_hidden=spy)
    rel, sha1 = save_hidden(tmp_path, 0, {i: states[i][0] for i in spy.read})
    trace = Trace({}, {}, {"p": PromptTrace("p", prompt, cont, MAX_NEW, hidden_file=rel, hidden_sha1=sha1)},
                  path=tmp_path)
    replay_target = ReplayTarget(model, trace)
    replay_target.use(prompt)
    replay = SpecDecoder(replay_target, make_plugin("drafters", spec, replay_target), make_plugin("policies", policy),
                         ReplayVerifier(NoOptions())).generate(prompt, max_new_tokens=MAX_NEW, eos_token_id=None)
    _assert_same(live, replay)


@pytest.mark.parametrize("name, why", [("sampling", "samples"), ("traversal", "samples"), ("typical", "is lossy"),
                                       ("margin", "is lossy"), ("greedy", None)])
def test_verifiers_that_read_more_than_the_greedy_continuation_are_refused(name, why) -> None:
    from specframe.plugins import get_registry
    from specframe.replay.runner import unreplayable_verifier

    found = unreplayable_verifier(get_registry().get("verifiers", name))
    assert (found is None) if why is None else found.startswith(why)
