"""The ``layerskip`` drafter: conformance in every mode, its forward against the model's own, its
options, the stop threshold and SWIFT's search on a deeper tiny model."""

from __future__ import annotations

import pytest
import torch

import specframe
from specframe.decode.engine import make_plugin
from specframe.models.target import TargetModel
from specframe.options import OptionError
from specframe.testing import fixtures as fx
from specframe.testing.conformance import DrafterConformance
from specframe.testing.harness import begin_generation, greedy_reference
from specframe.testing.models import tiny_model

from specframe.drafters.layerskip_forward import SkipPlan, preset_plan, random_sets

ALL_POLICIES = ("chain", "talon", "eagle", "opt-tree", "sequoia", "static", ("sampled-tree", {"k": 2, "depth": 3}))


class TestDrafter_layerskip_exit(DrafterConformance):
    """Early exit after the first of the tiny target's two layers, under every built-in policy."""

    plugin = ("layerskip", {"exit_layer": 1})
    policies = ALL_POLICIES


class TestDrafter_layerskip_sublayers(DrafterConformance):
    """A skipped set of single sublayers: layer 1's attention and layer 0's MLP."""

    plugin = ("layerskip", {"attn_skip": [False, True], "mlp_skip": [True, False]})
    policies = ALL_POLICIES


class TestDrafter_layerskip_swift(DrafterConformance):
    """SWIFT's search switched on (its state carries across prompts: ``persistent_state``)."""

    plugin = ("layerskip", {"search": "swift", "preset": "second-half", "swift_context_window": 2})


class TestDrafter_layerskip_adaptive_stop(DrafterConformance):
    """Draft & Verify's adaptive stop threshold under the chain policy."""

    plugin = ("layerskip", {"preset": "second-half", "stop_threshold": 0.5, "adaptive_stop": True})


@pytest.fixture(scope="module")
def deep():
    """A six-layer tiny float64 Llama (inner layers to skip)."""
    return tiny_model("llama", seed=5, vocab_size=64, hidden=32, layers=6, dtype=torch.float64)


def test_skipping_nothing_gives_the_target_rows(deep):
    target = TargetModel(deep)
    drafter = make_plugin("drafters", ("layerskip", {"preset": "none"}), target)
    committed = [3, 9, 27, 4, 11]
    begin_generation(drafter, target, committed)
    tree = specframe.DraftTree.root(committed[-1])
    row = drafter.expand(tree, torch.tensor([0]))[0]
    want = torch.log_softmax(deep(torch.tensor([committed])).logits[0, -1], dim=-1)
    assert torch.allclose(row, want, atol=1e-10)


def test_early_exit_rows_equal_a_truncated_model(deep):
    """Exit after E layers == the model run with its first E layers, then its norm and head."""
    target = TargetModel(deep)
    drafter = make_plugin("drafters", ("layerskip", {"exit_layer": 3}), target)
    committed = [3, 9, 27, 4, 11, 40]
    begin_generation(drafter, target, committed)
    row = drafter.expand(specframe.DraftTree.root(committed[-1]), torch.tensor([0]))[0]
    out = deep.model(torch.tensor([committed]), output_hidden_states=True)
    hidden = deep.model.norm(out.hidden_states[3][0, -1])
    assert torch.allclose(row, torch.log_softmax(deep.lm_head(hidden), dim=-1), atol=1e-10)


@pytest.mark.parametrize("kv", ["shared", "own"])
@pytest.mark.parametrize("options", [{"preset": "odd"}, {"preset": "first-last-kept"}, {"exit_layer": 2},
                                     {"search": "swift", "swift_context_window": 4, "swift_bayes_interval": 2}])
@pytest.mark.parametrize("policy", ["chain", "talon"])
def test_lossless_on_a_deeper_model(deep, kv, options, policy):
    target = TargetModel(deep)
    dec = specframe.SpecDecoder.build(target=target, drafter=("layerskip", {**options, "kv": kv}), policy=policy,
                                      verifier="greedy", strict=True)
    for prompt in ([5, 17, 9, 33, 2, 40], [11, 3, 3, 28]):
        out = dec.generate(prompt, max_new_tokens=24, eos_token_id=None, seed=0)
        assert out.tokens == greedy_reference(deep, prompt, 24, None)


def test_shared_and_own_kv_draft_the_same_trees(deep):
    trees = {}
    for kv in ("shared", "own"):
        dec = specframe.SpecDecoder.build(target=TargetModel(deep), drafter=("layerskip", {"preset": "odd", "kv": kv}),
                                          policy="talon", verifier="greedy", strict=True)
        out = dec.generate([5, 17, 9, 33, 2, 40], max_new_tokens=20, eos_token_id=None, seed=0)
        trees[kv] = [(s.tree_size, s.accepted) for s in out.steps]
    assert trees["shared"] == trees["own"]


def test_sampling_verification_runs_root_paths(deep):
    dec = specframe.SpecDecoder.build(target=TargetModel(deep), drafter=("layerskip", {"preset": "odd"}),
                                      policy=("sampled-tree", {"k": 2, "depth": 3}),
                                      verifier=("sampling", {"temperature": 0.8}), strict=True)
    out = dec.generate([5, 17, 9, 33], max_new_tokens=16, eos_token_id=None, seed=3)
    assert len(out.tokens) == 16


def test_swift_search_moves_the_skipped_set_and_keeps_its_state(deep):
    target = TargetModel(deep)
    options = {"search": "swift", "swift_context_window": 4, "swift_bayes_interval": 3, "swift_max_score": 1.0}
    dec = specframe.SpecDecoder.build(target=target, drafter=("layerskip", options), policy="chain", strict=True)
    drafter = dec.drafter
    first = drafter.plan
    dec.generate([5, 17, 9, 33, 2, 40], max_new_tokens=24, eos_token_id=None, seed=0)
    state = drafter.search.state
    assert state.opt_iter > 0 and len(state.scores) == state.opt_iter
    iters = state.opt_iter
    dec.generate([11, 3, 3, 28], max_new_tokens=24, eos_token_id=None, seed=0)
    assert drafter.search.state.opt_iter > iters  # carried across prompts, not reset by begin
    assert drafter.plan == drafter.search.plan
    assert first == preset_plan("odd", 6)


def test_chain_stops_at_the_drafter_threshold(deep):
    target = TargetModel(deep)
    dec = specframe.SpecDecoder.build(target=target, drafter=("layerskip", {"preset": "odd", "stop_threshold": 0.99}),
                                      policy=("chain", {"gamma": 8}), strict=True)
    out = dec.generate([5, 17, 9, 33], max_new_tokens=16, eos_token_id=None, seed=0)
    assert max(s.tree_size for s in out.steps) < 9  # a random tiny model is rarely 99% sure


def test_presets_and_random_sets():
    assert preset_plan("odd", 6) == SkipPlan.from_lists([1, 3], [1, 3])
    assert preset_plan("first-last-kept", 4) == SkipPlan.from_lists([1, 2], [1, 2])
    assert SkipPlan.exit_after(2, 4) == SkipPlan.from_lists([2, 3], [2, 3])
    import numpy

    attn, mlp = random_sets(10, 0.5, numpy.random.RandomState(0))
    assert len(attn) + len(mlp) == 8 and all(1 <= i <= 8 for i in attn + mlp)


@pytest.mark.parametrize("options, word", [({"preset": "bogus"}, "preset"), ({"exit_layer": 9}, "exit_layer"),
                                           ({"attn_skip": [True], "mlp_skip": [False]}, "attn_skip"),
                                           ({"attn_skip": [True, False]}, "attn_skip"), ({"kv": "x"}, "kv"),
                                           ({"search": "swift", "exit_layer": 1}, "search")])
def test_bad_options_are_named(options, word):
    with pytest.raises(OptionError, match=word):
        make_plugin("drafters", ("layerskip", options), TargetModel(fx.tiny_target()))


@pytest.mark.parametrize("options", [{"preset": "odd"}, {"exit_layer": 2},
                                     {"search": "swift", "swift_context_window": 4, "swift_bayes": False}])
def test_replay_equals_live_per_step(deep, options):
    """A replayed target has no cache: the drafter keeps its own context KV and drafts the trees
    the live run drafted (the same tokens, sizes and acceptances on every step)."""
    from specframe.options import NoOptions
    from specframe.replay import ReplayTarget, ReplayVerifier, Trace
    from specframe.replay.trace import PromptTrace

    prompt, max_new = [5, 17, 9, 33, 2, 40], 20
    live = specframe.SpecDecoder.build(TargetModel(deep), drafter=("layerskip", options), policy="talon",
                                       verifier="greedy").generate(prompt, max_new_tokens=max_new, eos_token_id=None)
    trace = Trace({}, {}, {"p": PromptTrace("p", prompt, greedy_reference(deep, prompt, max_new + 8, None), max_new)})
    target = ReplayTarget(deep, trace)
    target.use(prompt)
    dec = specframe.SpecDecoder(target, make_plugin("drafters", ("layerskip", options), target),
                                make_plugin("policies", "talon"), ReplayVerifier(NoOptions()))
    replay = dec.generate(prompt, max_new_tokens=max_new, eos_token_id=None)
    assert replay.tokens == live.tokens
    assert [(s.tree_size, s.accepted) for s in replay.steps] == [(s.tree_size, s.accepted) for s in live.steps]
