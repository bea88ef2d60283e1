"""The ``sampling`` verifier: warping equals transformers', the fast verifier takes the reference's
decisions given the same random numbers, seeds reproduce, and misuse fails with a clear message.

Distribution (losslessness) tests live in test_sampling_distribution.py (marked statistical).
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import specframe
from specframe.decode.engine import make_plugin
from specframe.testing.distribution import hf_warped_scores
from specframe.testing.models import perturbed_copy, tiny_model
from specframe.testing.reference import SamplingReferenceVerifier, Verdict, decide, sample_accept_reference
from specframe.testing.strategies import draft_trees
from specframe.testing.synthetic import SyntheticDrafter, make_session
from specframe.verifiers.sampling import MissingDraftProbsError, sample_accept_batch, target_probs, warp_logits

MODES = ("deterministic", "iid", "without_replacement")
VOCAB = 8


@given(seed=st.integers(0, 2**31 - 1), temperature=st.sampled_from([0.3, 0.7, 1.0, 1.5]),
       top_k=st.integers(0, 12), top_p=st.sampled_from([0.0, 0.3, 0.9, 0.95, 1.0]),
       ties=st.booleans())
def test_warping_equals_transformers_warpers(seed, temperature, top_k, top_p, ties):
    logits = torch.randn(6, 10, generator=torch.Generator().manual_seed(seed))
    if ties:
        logits = logits.round()  # many exact ties at the top-k / top-p boundaries
    assert torch.equal(warp_logits(logits, temperature, top_k, top_p), hf_warped_scores(logits, temperature, top_k, top_p))


def sample_accept(tree, probs, uniforms):
    """The vectorised decision for one draw, read back as a host verdict."""
    last, bonus = sample_accept_batch(tree, probs, uniforms.reshape(1, -1))
    return Verdict.from_leaf(tree, last[0], bonus[0])


def _random_case(tree, mode, seed, sparse):
    """Warped target rows, draft rows (children's q positive) and uniforms for ``tree``."""
    gen = torch.Generator().manual_seed(seed)
    n = len(tree)
    logits = torch.randn(n, VOCAB, generator=gen, dtype=torch.float64) * 2
    options = dataclasses.replace(make_plugin("verifiers", "sampling").options, top_k=3 if sparse else 0)
    probs = target_probs(logits, options)
    q = torch.softmax(torch.randn(n, VOCAB, generator=gen, dtype=torch.float64) * 2, dim=-1)
    tree = dataclasses.replace(tree, drafting=mode, draft_probs=None if mode == "deterministic" else q)
    return tree, probs, torch.rand(n, generator=gen, dtype=torch.float64)


@given(tree=draft_trees(max_nodes=24, vocab_size=VOCAB), mode=st.sampled_from(MODES),
       seed=st.integers(0, 2**31 - 1), sparse=st.booleans())
def test_fast_takes_the_reference_decisions(tree, mode, seed, sparse):
    tree, probs, u = _random_case(tree, mode, seed, sparse)
    fast, ref = sample_accept(tree, probs, u), sample_accept_reference(tree, probs, u)
    assert fast.accepted_path.tolist() == ref.accepted_path.tolist()
    assert fast.bonus_token == ref.bonus_token
    # A verdict is a root path of the tree whose tokens, and the bonus, the warped target allows.
    path = fast.accepted_path.tolist()
    assert path == tree.path_to(path[-1])
    assert all(probs[tree.parents[i], tree.tokens[i]] > 0 for i in path[1:])
    assert probs[path[-1], fast.bonus_token] > 0


@given(tree=draft_trees(max_nodes=16, vocab_size=VOCAB), mode=st.sampled_from(MODES), seed=st.integers(0, 2**31 - 1))
def test_verifier_and_reference_verifier_agree(tree, mode, seed):
    """The plugin's one entry point, ``verify``, decides as the reference verifier from the
    same generator state (same warping, same uniforms, same decisions)."""
    tree, _, _ = _random_case(tree, mode, seed, sparse=False)
    logits = torch.randn(len(tree), VOCAB, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 2
    verifier = make_plugin("verifiers", ("sampling", {"temperature": 0.8, "top_p": 0.9}))
    fast = decide(verifier, tree, logits, torch.Generator().manual_seed(seed + 1))
    ref = decide(SamplingReferenceVerifier(verifier.options), tree, logits, torch.Generator().manual_seed(seed + 1))
    assert (fast.accepted_path.tolist(), fast.bonus_token) == (ref.accepted_path.tolist(), ref.bonus_token)


@given(tree=draft_trees(max_nodes=16, vocab_size=VOCAB), mode=st.sampled_from(MODES), seed=st.integers(0, 2**31 - 1))
def test_batched_decisions_equal_one_at_a_time(tree, mode, seed):
    tree, probs, _ = _random_case(tree, mode, seed, sparse=False)
    gen = torch.Generator().manual_seed(seed + 1)
    u = torch.rand(5, len(tree), generator=gen, dtype=torch.float64)
    last, bonus = sample_accept_batch(tree, probs, u)  # one tree, five draws
    for s in range(5):
        ref = sample_accept_reference(tree, probs, u[s])
        assert (int(last[s]), int(bonus[s])) == (ref.accepted_path.tolist()[-1], ref.bonus_token)
    # Five different trees of one topology: relabelled tokens, own target and draft rows.
    tokens = torch.stack([torch.randperm(VOCAB, generator=gen)[tree.tokens] for _ in range(5)])
    many_probs = torch.softmax(torch.randn(5, len(tree), VOCAB, generator=gen, dtype=torch.float64), dim=-1)
    many_q = torch.softmax(torch.randn(5, len(tree), VOCAB, generator=gen, dtype=torch.float64), dim=-1)
    q_arg = None if mode == "deterministic" else many_q
    last, bonus = sample_accept_batch(tree, many_probs, u, tokens=tokens, draft_probs=q_arg)
    for s in range(5):
        one = dataclasses.replace(tree, tokens=tokens[s], draft_probs=q_arg if q_arg is None else many_q[s])
        ref = sample_accept_reference(one, many_probs[s], u[s])
        assert (int(last[s]), int(bonus[s])) == (ref.accepted_path.tolist()[-1], ref.bonus_token)


def test_hand_computed_decisions():
    """A root with children 2 then 5 (deterministic), target P = [.., .5 at 2, .3 at 5, .2 at 7]."""
    tree = DraftTreeFixture.two_children()
    probs = torch.zeros(3, VOCAB, dtype=torch.float64)
    probs[0, [2, 5, 7]] = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    probs[1:, 1] = 1.0
    u = lambda a, b: torch.tensor([0.99, a, b], dtype=torch.float64)  # noqa: E731 - u[0] = bonus draw
    for verdict in (sample_accept, sample_accept_reference):
        assert verdict(tree, probs, u(0.49, 0.0)).accepted_path.tolist() == [0, 1]  # 0.49 < 0.5
        # Reject 2 (0.51 >= 0.5): R = {5: .6, 7: .4}; accept 5 iff u < 0.6.
        assert verdict(tree, probs, u(0.51, 0.59)).accepted_path.tolist() == [0, 2]
        rejected = verdict(tree, probs, u(0.51, 0.61))
        assert rejected.accepted_path.tolist() == [0]
        assert rejected.bonus_token == 7  # only 7 is left in the residual


class DraftTreeFixture:
    """Small hand-made trees."""

    @staticmethod
    def two_children():
        tree = specframe.DraftTree.root(4)
        return tree.add_nodes(torch.tensor([0, 0]), torch.tensor([2, 5]), torch.tensor([-0.5, -1.0]))


# ---------------------------------------------------------------------------- errors
@pytest.mark.parametrize("mode", ["iid", "without_replacement"])
def test_sampled_tree_without_draft_probs_is_a_clear_error(mode):
    tree = dataclasses.replace(DraftTreeFixture.two_children(), drafting=mode)
    verifier = make_plugin("verifiers", "sampling")
    with pytest.raises(MissingDraftProbsError, match=f"tree.drafting is '{mode}' but tree.draft_probs is None"):
        verifier.verify(tree, torch.zeros(3, VOCAB))
    bad = dataclasses.replace(tree, draft_probs=torch.ones(2, VOCAB) / VOCAB)
    with pytest.raises(MissingDraftProbsError, match=r"shape \(2, 8\), expected \(3, 8\)"):
        verifier.verify(bad, torch.zeros(3, VOCAB))


@pytest.mark.parametrize("options, option", [
    ({"temperature": 0.0}, "temperature"), ({"temperature": -1.0}, "temperature"),
    ({"temperature": float("nan")}, "temperature"), ({"top_k": -1}, "top_k"),
    ({"top_p": 1.5}, "top_p"), ({"seed": "7"}, "seed"), ({"top_k": 2.5}, "top_k"),
])
def test_bad_sampling_options_name_the_option(options, option):
    with pytest.raises(specframe.OptionError, match=f"option '{option}'"):
        make_plugin("verifiers", ("sampling", options))


def test_unknown_sampling_option_lists_valid_ones():
    with pytest.raises(specframe.OptionError, match=r"unknown option\(s\) \['temp'\].*temperature, top_k, top_p"):
        make_plugin("verifiers", ("sampling", {"temp": 0.5}))


@pytest.mark.parametrize("spec, option", [
    (("chain", {"sample": "yes"}), "sample"), (("chain", {"seed": 1.5}), "seed"),
    (("sampled-tree", {"k": 0}), "k"), (("sampled-tree", {"depth": 0}), "depth"),
    (("sampled-tree", {"budget": 1}), "budget"),
])
def test_bad_sampling_policy_options_name_the_option(spec, option):
    with pytest.raises(specframe.OptionError, match=f"option '{option}'"):
        make_plugin("policies", spec)


# ---------------------------------------------------------------------------- engine
V_E2E = 32


@lru_cache(maxsize=None)
def _pair():
    target = tiny_model("llama", seed=3, vocab_size=V_E2E)
    return target, perturbed_copy(target, 0.3, seed=4)


def _decoder(policy=("chain", {"sample": True, "gamma": 3}), verifier=("sampling", {})):
    target, draft = _pair()
    return specframe.SpecDecoder.build(target=target, drafter=("model", {"model": draft}), policy=policy, verifier=verifier)


def _greedy(prompt, n):
    target, _ = _pair()
    ids = torch.tensor([prompt])
    out = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n, pad_token_id=0)
    return out[0, len(prompt):].tolist()


PROMPT = [5, 9, 2, 17]


def test_greedy_verifier_refuses_temperature():
    dec = _decoder(policy="chain", verifier="greedy")
    with pytest.raises(ValueError, match="temperature=0.8 needs a sampling verifier, but verifier 'greedy' is not one"):
        dec.generate(PROMPT, max_new_tokens=4, temperature=0.8)
    with pytest.raises(ValueError, match="temperature must be a finite number >= 0"):
        dec.generate(PROMPT, max_new_tokens=4, temperature=-0.5)
    with pytest.raises(ValueError, match="either seed or generator"):
        dec.generate(PROMPT, max_new_tokens=4, seed=1, generator=torch.Generator())


def test_temperature_zero_is_exact_greedy():
    for policy in [("chain", {"sample": True, "gamma": 3}), ("talon", {"budget": 12}), ("sampled-tree", {"k": 2, "depth": 2})]:
        out = _decoder(policy=policy).generate(PROMPT, max_new_tokens=12, temperature=0, eos_token_id=None)
        assert out.tokens == _greedy(PROMPT, 12), policy


def test_temperature_override_applies_to_the_call_only():
    dec = _decoder(verifier=("sampling", {"temperature": 1.0}))
    # At temperature 1e-4 sampling is argmax unless two logits are within ~1e-3: greedy output.
    cold = dec.generate(PROMPT, max_new_tokens=20, temperature=1e-4, seed=0, eos_token_id=None)
    assert cold.tokens == _greedy(PROMPT, 20)
    assert dec.verifier.options.temperature == 1.0
    hot = dec.generate(PROMPT, max_new_tokens=20, seed=0, eos_token_id=None)
    assert hot.tokens != cold.tokens  # T = 1 on a 32-token vocabulary: 20 argmax picks are unlikely


@pytest.mark.parametrize("policy", [
    ("chain", {"sample": True, "gamma": 3}), ("sampled-tree", {"k": 2, "depth": 3}),
    ("sampled-tree", {"k": 3, "depth": 2, "replacement": True}), ("talon", {"budget": 12}), "chain",
])
def test_same_seed_same_output_different_seed_different_output(policy):
    dec = _decoder(policy=policy, verifier=("sampling", {"temperature": 1.0}))
    runs = {seed: dec.generate(PROMPT, max_new_tokens=16, seed=seed, eos_token_id=None).tokens for seed in (1, 2)}
    assert dec.generate(PROMPT, max_new_tokens=16, seed=1, eos_token_id=None).tokens == runs[1]
    assert runs[1] != runs[2]


def test_plugin_seed_options_make_a_fresh_decoder_reproducible():
    def run():
        dec = _decoder(policy=("chain", {"sample": True, "gamma": 3, "seed": 5}), verifier=("sampling", {"seed": 6}))
        return [dec.generate(PROMPT, max_new_tokens=16, eos_token_id=None).tokens for _ in range(2)]

    first, second = run(), run()
    assert first == second
    assert first[0] != first[1]  # one stream per decoder: the second call continues it


def test_reference_verifier_instance_runs_in_the_engine():
    target, draft = _pair()
    options = make_plugin("verifiers", ("sampling", {"temperature": 0.9})).options
    fast = _decoder(verifier=("sampling", {"temperature": 0.9}))
    slow = specframe.SpecDecoder.build(target=target, drafter=("model", {"model": draft}),
                                       policy=("chain", {"sample": True, "gamma": 3}),
                                       verifier=SamplingReferenceVerifier(options))
    for seed in range(2):
        a = fast.generate(PROMPT, max_new_tokens=8, seed=seed, eos_token_id=None)
        b = slow.generate(PROMPT, max_new_tokens=8, seed=seed, eos_token_id=None)
        assert a.tokens == b.tokens


# ---------------------------------------------------------------------------- sampling policies
def _session(seed=0):
    drafter = SyntheticDrafter(VOCAB, temperature=0.7, seed=2, dtype=torch.float64)
    return drafter, make_session(drafter, root_token=3, generator=torch.Generator().manual_seed(seed))


def test_chain_sample_records_q_and_declares_iid():
    drafter, session = _session()
    tree = make_plugin("policies", ("chain", {"sample": True, "gamma": 4})).build(session, 60)
    assert tree.drafting == "iid" and len(tree) == 5 and tree.width_per_depth() == [1, 1, 1, 1, 1]
    for node in range(4):
        path = tuple(tree.tokens[: node + 1].tolist())
        assert torch.allclose(tree.draft_probs[node], drafter.row(path).double().exp())
        assert tree.draft_probs[node, tree.tokens[node + 1]] > 0
    assert float(tree.draft_probs[4].abs().sum()) == 0.0  # never expanded
    greedy = make_plugin("policies", ("chain", {"gamma": 4})).build(_session()[1], 60)
    assert greedy.drafting == "deterministic" and greedy.draft_probs is None


@pytest.mark.parametrize("replacement", [False, True])
def test_sampled_tree_shape_and_records(replacement):
    drafter, session = _session()
    policy = make_plugin("policies", ("sampled-tree", {"k": 3, "depth": 3, "replacement": replacement}))
    tree = policy.build(session, 60)
    tree.check_valid(60)
    assert tree.drafting == "without_replacement" and session.draft_forwards == 3
    widths = tree.width_per_depth()
    if replacement:
        assert all(w <= 3 ** d for d, w in enumerate(widths))
    else:
        assert widths == [1, 3, 9, 27]
    expanded = torch.nonzero(tree.depths < 3).flatten().tolist()
    for node in expanded:
        assert torch.allclose(tree.draft_probs[node], drafter.row(tuple(tree.tokens[tree.path_to(node)].tolist())).double().exp())
    small = make_plugin("policies", ("sampled-tree", {"k": 3, "depth": 3})).build(_session()[1], 7)
    assert len(small) == 7 and small.width_per_depth() == [1, 3, 3]


def test_sampling_policies_follow_the_session_generator():
    for spec in [("chain", {"sample": True}), ("sampled-tree", {})]:
        trees = [make_plugin("policies", spec).build(_session(seed)[1], 60) for seed in (0, 0, 1, 2)]
        assert torch.equal(trees[0].tokens, trees[1].tokens)
        assert not all(torch.equal(trees[0].tokens, t.tokens) for t in trees[2:])
