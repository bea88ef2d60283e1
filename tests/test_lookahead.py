"""The ``lookahead`` drafter (drafters/lookahead.py): lossless under every built-in policy, one
host read per step with its window riding as side rows, its options checked, and its window
paying off on text whose guesses repeat. Parity with lade: tests/test_parity_lookahead.py."""

from __future__ import annotations

import pytest

import specframe
from specframe.decode.engine import SpecDecoder, make_plugin
from specframe.drafters.lookahead import max_window_rows
from specframe.models.target import TargetModel
from specframe.options import OptionError
from specframe.plugins import get_registry
from specframe.testing.fixtures import fixed_policy_spec, tiny_target
from specframe.testing.harness import greedy_by_recomputation
from specframe.testing.host_reads import count_step_reads

POLICIES = get_registry().names("policies", dist="specframe")
PROMPT = [5, 6, 7, 5, 6, 7, 5, 6]
MAX_NEW = 40


def _decoder(policy, verifier="greedy", options=None, strict=None):
    target = TargetModel(tiny_target())
    drafter = make_plugin("drafters", ("lookahead", options or {"level": 4, "window": 4, "guess_set": 4}), target)
    return SpecDecoder(target, drafter, make_plugin("policies", policy), make_plugin("verifiers", verifier), strict=strict)


@pytest.mark.parametrize("policy", POLICIES)
def test_greedy_output_is_the_targets_under_every_policy(policy):
    out = _decoder(fixed_policy_spec(policy)).generate(PROMPT, max_new_tokens=MAX_NEW, eos_token_id=None)
    assert out.tokens == greedy_by_recomputation(tiny_target(), PROMPT, MAX_NEW, None)


@pytest.mark.parametrize("policy", POLICIES)
def test_sampling_verification_runs_under_every_policy(policy):
    """Sampling verifiers take lookahead's trees: seeded runs repeat, and sampling reduced to
    the argmax (top_k 1) is greedy decoding."""
    spec = fixed_policy_spec(policy)
    runs = [_decoder(spec, ("sampling", {"temperature": 0.9})).generate(PROMPT, max_new_tokens=MAX_NEW,
                                                                         eos_token_id=None, seed=3).tokens
            for _ in range(2)]
    assert runs[0] == runs[1] and len(runs[0]) == MAX_NEW
    top1 = _decoder(spec, ("sampling", {"top_k": 1})).generate(PROMPT, max_new_tokens=MAX_NEW, eos_token_id=None, seed=3)
    assert top1.tokens == greedy_by_recomputation(tiny_target(), PROMPT, MAX_NEW, None)


def test_the_window_rides_in_the_steps_one_host_read():
    dec = _decoder(("talon", {"budget": 13}), strict=False)
    reads = count_step_reads(dec, PROMPT, max_new_tokens=24)
    assert reads["steps"] > 1
    assert reads["engine"] == reads["steps"]


def test_a_full_tree_accepts_guesses_on_repetitive_text():
    """Where the target's own guesses repeat, a policy that keeps every guess accepts some: the
    window pays for itself in tokens per step (what it costs in time depends on the device)."""
    out = _decoder(("talon", {"budget": 13})).generate(PROMPT, max_new_tokens=MAX_NEW, eos_token_id=None)
    assert sum(s.accepted for s in out.steps) > 0
    assert out.tau > 1.0


def test_side_rows_are_bounded_by_the_declared_most():
    # prefill W + N - 3, then (W - 1) + (N - 2) W once full: 27 at Spec-Bench's defaults
    assert max_window_rows(5, 7) == 27
    assert max_window_rows(4, 4) == 11 and max_window_rows(3, 1) == 1
    dec = _decoder(("talon", {"budget": 13}))
    sizes = []
    side_rows = dec.drafter.side_rows
    dec.drafter.side_rows = lambda c, m: (lambda s: sizes.append(len(s)) or s)(side_rows(c, m))
    dec.generate(PROMPT, max_new_tokens=20, eos_token_id=None)
    assert max(sizes) <= dec.drafter.max_side_rows


@pytest.mark.parametrize("options,name", [({"level": 2}, "level"), ({"window": 0}, "window"),
                                          ({"guess_set": 0}, "guess_set")])
def test_bad_options_name_the_option(options, name):
    with pytest.raises(OptionError, match=name):
        specframe.SpecDecoder.build(tiny_target(), drafter=("lookahead", options))
