"""The lossy verifiers ``typical`` and ``margin``: the fast verifiers take their literal references'
decisions, read nothing back from the device, keep the verdict invariants, reduce to greedy
verification at their strictest settings and never accept less than greedy at looser ones.

Conformance (root paths, budget, the engine's read) runs in tests/test_conformance_builtins.py.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import specframe
from specframe.decode.engine import make_plugin
from specframe.options import OptionError
from specframe.testing import fixtures as fx
from specframe.testing.harness import greedy_reference
from specframe.testing.host_reads import HostReadCounter
from specframe.testing.lossy_reference import MarginReferenceVerifier, TypicalReferenceVerifier
from specframe.testing.reference import Verdict, decide
from specframe.testing.strategies import draft_trees
from specframe.tree import DraftTree

VOCAB = 8
TEMPERATURES = st.sampled_from([0.0, 0.7, 1.0, 1.5])
# delta = 1 is left out: on a uniform row p == exp(-H) exactly, a knife edge where the fast
# verifier's and the reference's entropies (torch and Python sums) may round apart.
TYPICAL_OPTIONS = st.fixed_dictionaries({
    "epsilon": st.sampled_from([0.01, 0.09, 0.3, 1.0]), "delta": st.sampled_from([0.0, 0.3, 0.6, 2.0, 8.0]),
    "temperature": TEMPERATURES,
})
MARGIN_OPTIONS = st.fixed_dictionaries({
    "ratio": st.sampled_from([0.05, 0.3, 0.5, 0.9, 1.0]), "temperature": TEMPERATURES,
})


def random_logits(tree: DraftTree, seed: int, ties: bool = False) -> torch.Tensor:
    """``[len(tree), VOCAB]`` float64 target logits; ``ties`` rounds them (exact ties at the top)."""
    logits = torch.randn(len(tree), VOCAB, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 2
    return logits.round() if ties else logits


def verdict(verifier: specframe.Verifier, tree: DraftTree, logits: torch.Tensor, seed: int = 0) -> Verdict:
    """``verifier``'s decision (return convention checked) from a generator seeded with ``seed``."""
    return decide(verifier, tree, logits, torch.Generator().manual_seed(seed))


def same(a: Verdict, b: Verdict) -> bool:
    """Same accepted path and same bonus token."""
    return (a.accepted_path.tolist(), a.bonus_token) == (b.accepted_path.tolist(), b.bonus_token)


def is_prefix(short: Verdict, long: Verdict) -> bool:
    """``short``'s accepted path is a prefix of ``long``'s (both start at the root)."""
    a, b = short.accepted_path.tolist(), long.accepted_path.tolist()
    return b[:len(a)] == a


def greedy(tree: DraftTree, logits: torch.Tensor) -> Verdict:
    """The lossless greedy verifier's decision."""
    return verdict(make_plugin("verifiers", "greedy"), tree, logits)


def two_children() -> DraftTree:
    """Root (token 4) with children 1 then 2, and a grandchild 3 under the first child."""
    tree = DraftTree.root(4).add_nodes(torch.tensor([0, 0]), torch.tensor([1, 2]), torch.tensor([-0.5, -1.0]))
    return tree.add_nodes(torch.tensor([1]), torch.tensor([3]), torch.tensor([-1.0]))


def logits_of(*rows: list[float]) -> torch.Tensor:
    """Target logits whose softmax rows are the given probabilities (log p; 0 -> -inf)."""
    return torch.tensor(rows, dtype=torch.float64).log()


# ---------------------------------------------------------------------------- fast == reference
@given(tree=draft_trees(max_nodes=24, vocab_size=VOCAB), seed=st.integers(0, 2**31 - 1),
       options=TYPICAL_OPTIONS, ties=st.booleans())
def test_typical_takes_the_reference_decisions(tree, seed, options, ties):
    fast = make_plugin("verifiers", ("typical", options))
    logits = random_logits(tree, seed, ties)
    assert same(verdict(fast, tree, logits, seed), verdict(TypicalReferenceVerifier(fast.options), tree, logits, seed))


@given(tree=draft_trees(max_nodes=24, vocab_size=VOCAB), seed=st.integers(0, 2**31 - 1),
       options=MARGIN_OPTIONS, ties=st.booleans())
def test_margin_takes_the_reference_decisions(tree, seed, options, ties):
    fast = make_plugin("verifiers", ("margin", options))
    logits = random_logits(tree, seed, ties)
    assert same(verdict(fast, tree, logits, seed), verdict(MarginReferenceVerifier(fast.options), tree, logits, seed))


# ---------------------------------------------------------------------------- invariants
@given(tree=draft_trees(max_nodes=24, vocab_size=VOCAB), seed=st.integers(0, 2**31 - 1),
       spec=st.one_of(TYPICAL_OPTIONS.map(lambda o: ("typical", o)), MARGIN_OPTIONS.map(lambda o: ("margin", o))))
def test_verdict_is_a_root_path_plus_one_bonus(tree, seed, spec):
    """The path runs from the root along parent links to ``last``, so ``depth(last) + 1`` tokens
    are emitted (the drafted ones and the bonus); the bonus is a token of the vocabulary; the
    same generator state gives the same decision."""
    verifier = make_plugin("verifiers", spec)
    logits = random_logits(tree, seed)
    out = verdict(verifier, tree, logits, seed)
    path = out.accepted_path.tolist()
    assert path == tree.path_to(path[-1])
    assert len(path) == int(tree.depths[path[-1]]) + 1
    assert 0 <= out.bonus_token < VOCAB
    assert same(out, verdict(verifier, tree, logits, seed))


@given(tree=draft_trees(max_nodes=24, vocab_size=VOCAB), seed=st.integers(0, 2**31 - 1))
def test_strictest_settings_accept_exactly_what_greedy_accepts(tree, seed):
    """At temperature 0: ``typical`` with epsilon = 1 and delta >= V (threshold 1: nothing but
    the argmax passes) and ``margin`` with ratio = 1 take greedy's decision, bonus included
    (random float64 logits: no exact ties)."""
    logits = random_logits(tree, seed)
    want = greedy(tree, logits)
    for spec in (("typical", {"epsilon": 1.0, "delta": float(VOCAB), "temperature": 0.0}),
                 ("margin", {"ratio": 1.0, "temperature": 0.0})):
        assert same(verdict(make_plugin("verifiers", spec), tree, logits), want), spec


@given(tree=draft_trees(max_nodes=24, vocab_size=VOCAB), seed=st.integers(0, 2**31 - 1), ties=st.booleans(),
       epsilon=st.sampled_from([0.01, 0.09, 1.0]), delta=st.sampled_from([0.0, 0.3, 0.9]),
       ratio=st.sampled_from([0.05, 0.5, 1.0]), temperature=TEMPERATURES)
def test_looser_settings_extend_greedys_path(tree, seed, ties, epsilon, delta, ratio, temperature):
    """Greedy's accepted path is a prefix of theirs (so never longer): the argmax child passes
    (margin: p = max p; typical with delta < 1: max p >= exp(-H) > delta exp(-H)) and ranks
    first among passing children, exact ties included."""
    logits = random_logits(tree, seed, ties)
    want = greedy(tree, logits)
    for spec in (("typical", {"epsilon": epsilon, "delta": delta, "temperature": temperature}),
                 ("margin", {"ratio": ratio, "temperature": temperature})):
        assert is_prefix(want, verdict(make_plugin("verifiers", spec), tree, logits, seed)), spec


@given(tree=draft_trees(max_nodes=24, vocab_size=VOCAB), seed=st.integers(0, 2**31 - 1),
       temperature=TEMPERATURES)
def test_a_looser_threshold_only_extends_the_path(tree, seed, temperature):
    """Passing sets are upper sets of p and the walk takes the most probable passing child, so
    loosening a rule keeps every choice it made and may add more: the tighter path is a prefix."""
    logits = random_logits(tree, seed)

    def path(spec: tuple[str, dict]) -> Verdict:
        return verdict(make_plugin("verifiers", (spec[0], {**spec[1], "temperature": temperature})), tree, logits)

    ratios = [path(("margin", {"ratio": r})) for r in (1.0, 0.7, 0.4, 0.1)]
    typicals = [path(("typical", {"epsilon": e, "delta": d})) for e, d in ((1.0, 8.0), (0.3, 0.9), (0.09, 0.3), (0.01, 0.0))]
    for chain in (ratios, typicals):
        assert all(is_prefix(tight, loose) for tight, loose in zip(chain, chain[1:]))


# ---------------------------------------------------------------------------- hand-computed
def test_typical_hand_computed_threshold():
    """Root row p = (.5, .3, .1, .1): H = 1.1683, exp(-H) = .3109. Children: token 1 (p .3) then
    token 2 (p .1); greedy (argmax 0) accepts neither."""
    tree = two_children()
    logits = logits_of([0.5, 0.3, 0.1, 0.1], [0.1, 0.1, 0.1, 0.7], [0.7, 0.1, 0.1, 0.1], [0.7, 0.1, 0.1, 0.1])
    assert greedy(tree, logits).accepted_path.tolist() == [0]

    def decision(epsilon: float, delta: float) -> tuple[list[int], int]:
        out = verdict(make_plugin("verifiers", ("typical", {"epsilon": epsilon, "delta": delta, "temperature": 0})),
                      tree, logits)
        return out.accepted_path.tolist(), out.bonus_token

    # threshold min(.09, .0933) = .09: both children pass, the more probable (token 1) wins; under
    # it token 3 is the argmax (greedy variant: always passes); bonus = argmax after node 3.
    assert decision(0.09, 0.3) == ([0, 1, 3], 0)
    assert decision(0.2, 1.0) == ([0, 1, 3], 0)   # threshold .2: token 1 (.3) passes
    assert decision(0.35, 1.0) == ([0], 0)        # threshold .3109 > .3: nothing passes at the root


def test_margin_hand_computed_ratio():
    """Root row p = (.5, .3, .1, .1): token 1 is at .6 of the top, token 2 at .2."""
    tree = two_children()
    logits = logits_of([0.5, 0.3, 0.1, 0.1], [0.1, 0.1, 0.1, 0.7], [0.7, 0.1, 0.1, 0.1], [0.1, 0.6, 0.1, 0.2])
    for ratio, want in ((0.5, ([0, 1, 3], 1)), (0.7, ([0], 0)), (0.2, ([0, 1, 3], 1)), (1.0, ([0], 0))):
        out = verdict(make_plugin("verifiers", ("margin", {"ratio": ratio})), tree, logits)
        assert (out.accepted_path.tolist(), out.bonus_token) == want, ratio


def test_sampled_bonus_follows_the_generator():
    """At temperature > 0 the bonus is drawn from the target row of the last node with one
    uniform: a fixed seed repeats it, and over seeds it covers the row's support."""
    tree = two_children()
    logits = logits_of([0.5, 0.3, 0.1, 0.1], [0.25, 0.25, 0.25, 0.25], [0.7, 0.1, 0.1, 0.1], [0.7, 0.1, 0.1, 0.1])
    verifier = make_plugin("verifiers", ("margin", {"ratio": 0.9, "temperature": 1.0}))  # accepts nothing
    bonuses = {verdict(verifier, tree, logits, seed).bonus_token for seed in range(40)}
    assert bonuses == {0, 1, 2, 3}
    assert verdict(verifier, tree, logits, 7).bonus_token == verdict(verifier, tree, logits, 7).bonus_token


# ---------------------------------------------------------------------------- device and options
@pytest.mark.parametrize("spec", ["typical", ("typical", {"temperature": 0}), "margin",
                                  ("margin", {"temperature": 0.8, "seed": 3})])
def test_verify_reads_nothing_back_from_the_device(spec):
    tree = two_children().add_nodes(torch.tensor([2, 3]), torch.tensor([5, 6]), torch.tensor([-2.0, -2.0]))
    logits = random_logits(tree, 1)
    verifier = make_plugin("verifiers", spec)
    with HostReadCounter() as counter:
        verifier.verify(tree, logits, torch.Generator().manual_seed(0))
    assert counter.total == 0, dict(counter.counts)


@pytest.mark.parametrize("spec, option", [
    (("typical", {"epsilon": 0.0}), "epsilon"), (("typical", {"epsilon": 1.5}), "epsilon"),
    (("typical", {"delta": -0.1}), "delta"), (("typical", {"temperature": -1.0}), "temperature"),
    (("typical", {"temperature": math.nan}), "temperature"), (("margin", {"ratio": 0.0}), "ratio"),
    (("margin", {"ratio": 1.5}), "ratio"), (("margin", {"temperature": math.inf}), "temperature"),
])
def test_bad_options_are_named(spec, option):
    with pytest.raises(OptionError, match=f"option '{option}'"):
        make_plugin("verifiers", spec)


def test_registered_as_lossy_sampling_verifiers():
    assert {"typical", "margin"} <= set(specframe.available()["verifiers"])
    for name, defaults in (("typical", {"epsilon": 0.09, "delta": 0.3, "temperature": 1.0}),
                           ("margin", {"ratio": 0.5, "temperature": 0.0})):
        verifier = make_plugin("verifiers", name)
        assert (verifier.lossless, verifier.sampling) == (False, True)
        assert {k: getattr(verifier.options, k) for k in defaults} == defaults


# ---------------------------------------------------------------------------- in the engine
def _decoder(verifier) -> specframe.SpecDecoder:
    target = fx.tiny_target()
    return specframe.SpecDecoder.build(target=target, drafter=("model", {"model": fx.close_draft(target)}),
                                       policy="talon", verifier=verifier, strict=True)


@pytest.mark.parametrize("fast, reference", [
    (("typical", {"temperature": 0.8}), TypicalReferenceVerifier),
    (("margin", {"ratio": 0.3, "temperature": 0.8}), MarginReferenceVerifier),
])
def test_engine_runs_fast_and_reference_alike(fast, reference):
    """Whole generations: the fast verifier and its reference emit the same tokens from one seed,
    and ``generate(temperature=...)`` overrides the lossy verifier's temperature."""
    dec = _decoder(fast)
    prompt = [5, 17, 9, 33, 2, 40]
    out = dec.generate(prompt, max_new_tokens=16, eos_token_id=None, seed=3)
    ref = _decoder(reference(dec.verifier.options)).generate(prompt, max_new_tokens=16, eos_token_id=None, seed=3)
    assert out.tokens == ref.tokens and len(out.tokens) == 16
    hot = dec.generate(prompt, max_new_tokens=16, eos_token_id=None, seed=3, temperature=1.3)
    assert len(hot.tokens) == 16 and dec.verifier.options.temperature == 0.8  # the override is per call


def test_generate_temperature_zero_is_lossless_greedy():
    """``generate(temperature=0)`` verifies with the registered ``greedy`` verifier whatever the
    decoder's (so a lossy decoder's output then equals greedy decoding); the lossy greedy
    variant is the verifier's own ``temperature = 0`` option."""
    dec = _decoder(("typical", {"epsilon": 0.01, "delta": 0.0}))
    prompt = [5, 17, 9, 33, 2, 40]
    out = dec.generate(prompt, max_new_tokens=24, eos_token_id=None, temperature=0)
    assert out.tokens == greedy_reference(fx.tiny_target(), prompt, 24, None)
