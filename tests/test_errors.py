"""Bad input fails early with a message naming the problem, and nothing is half-done."""

from dataclasses import dataclass, replace

import pytest
import torch

import specframe
from specframe.testing.models import tiny_model


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", seed=0, max_positions=64)


def _build(target, **kw):
    kw.setdefault("drafter", ("model", {"model": target}))
    return specframe.SpecDecoder.build(target=target, **kw)


def test_unknown_plugin_name_lists_available(target):
    with pytest.raises(specframe.PluginError, match="unknown policy 'talonn'; available policies: .*chain"):
        _build(target, policy="talonn")
    with pytest.raises(specframe.PluginError, match="unknown verifier 'greedyy'.*greedy"):
        _build(target, verifier="greedyy")
    with pytest.raises(specframe.PluginError, match="unknown drafter 'modle'.*model"):
        _build(target, drafter="modle")


def test_unknown_option_names_the_valid_ones(target):
    with pytest.raises(specframe.OptionError, match=r"unknown option\(s\) \['gama'\] for policy 'chain'; "
                                                    r"valid options: .*gamma"):
        _build(target, policy=("chain", {"gama": 3}))


@pytest.mark.parametrize("value", [2.5, True, None])
def test_ill_typed_option_is_named(target, value):
    with pytest.raises(specframe.OptionError, match="option 'gamma' of policy 'chain' must be int"):
        _build(target, policy=("chain", {"gamma": value}))


def test_string_option_other_than_auto_is_named(target):
    # gamma takes an int or "auto" (hardware-aware size), so "4" is refused by value.
    with pytest.raises(specframe.OptionError, match="option 'gamma' must be an int or \"auto\", got '4'"):
        _build(target, policy=("chain", {"gamma": "4"}))


def test_out_of_range_option_is_named(target):
    with pytest.raises(specframe.OptionError, match="option 'gamma' must be >= 1, got 0"):
        _build(target, policy=("chain", {"gamma": 0}))


def test_empty_prompt(target):
    with pytest.raises(ValueError, match="prompt is empty"):
        _build(target).generate([], max_new_tokens=4)


def test_drafter_vocabulary_must_match(target):
    other = tiny_model("llama", seed=1, vocab_size=48)
    with pytest.raises(ValueError, match="vocabulary size 48, the target has 64"):
        _build(target, drafter=("model", {"model": other}))


def test_prompt_plus_new_tokens_beyond_max_positions(target):
    with pytest.raises(ValueError, match=r"prompt \(10 tokens\) \+ max_new_tokens \(60\) = 70 exceeds "
                                         r"the target's 64 positions"):
        _build(target).generate(list(range(2, 12)), max_new_tokens=60)


@dataclass
class _Opts(specframe.BudgetOptions):
    budget: int = 4


class _BrokenPolicy(specframe.TreePolicy):
    """Returns whatever tree the test injects."""

    name = "broken"
    Options = _Opts

    def __init__(self, make_tree):
        super().__init__(_Opts())
        self.make_tree = make_tree

    def build(self, session, budget):
        return self.make_tree(session.new_tree())


def _add(tree, parents, tokens):
    return tree.add_nodes(torch.tensor(parents), torch.tensor(tokens), torch.zeros(len(tokens)))


def _listed(root, parents, tokens, logp=None, depths=None):
    """A tree in host lists: ``root``'s token, then nodes under ``parents`` (depth 1 unless given)."""
    return specframe.DraftTree.from_lists([int(root.tokens[0]), *tokens], [-1, *parents], [0, *(depths or [1] * len(tokens))],
                                          [0.0, *(logp or [0.0] * len(tokens))], [-1, *range(len(tokens))])


@pytest.mark.parametrize(
    "make_tree, message",
    [
        (lambda t: _add(t, [0] * 5, [2, 3, 4, 5, 6]), "6 nodes, over the budget of 4"),
        (lambda t: _add(t, [0, 0], [7, 7]), "siblings must have distinct tokens"),
        (lambda t: t.add_nodes(torch.tensor([0]), torch.tensor([3]), torch.tensor([float("nan")])),
         "non-finite draft log-prob"),
        (lambda t: specframe.DraftTree.root(int(t.tokens[0]) + 1), "root token"),
        (lambda t: replace(_add(t, [0], [3]), ranks=torch.zeros(1, dtype=torch.long)),
         r"ranks has shape \(1,\), expected \(2,\)"),
        # The same breaks in a tree held in host lists (the CPU policies' trees), checked on its lists.
        (lambda t: _listed(t, [0] * 5, [2, 3, 4, 5, 6]), "6 nodes, over the budget of 4"),
        (lambda t: _listed(t, [0, 0], [7, 7]), "siblings must have distinct tokens"),
        (lambda t: _listed(t, [0], [3], logp=[float("nan")]), "non-finite draft log-prob"),
        (lambda t: _listed(t, [2, 0], [3, 4], depths=[1, 1]), "topological order violated at node 1"),
        (lambda t: specframe.DraftTree.from_lists([int(t.tokens[0]) + 1], [-1], [0], [0.0], [-1]), "root token"),
        (lambda t: specframe.DraftTree.from_lists([int(t.tokens[0]), 3], [-1, 0], [0, 1], [0.0, 0.0], [-1]),
         r"ranks has shape \(1,\), expected \(2,\)"),
    ],
)
@pytest.mark.parametrize("strict", [True, False], ids=["strict", "device-flag"])
def test_invalid_tree_from_a_policy_names_policy_and_invariant(target, make_tree, message, strict):
    # Strict mode checks the tree on the host before the target runs; otherwise the engine
    # reads the device validity flag with the verdict and names the invariant all the same.
    dec = _build(target, policy=_BrokenPolicy(make_tree), strict=strict)
    with pytest.raises(specframe.EngineError, match=f"policy 'broken' returned an invalid tree: .*{message}"):
        dec.generate([5, 6, 7], max_new_tokens=4)


class _HostVerdictVerifier(specframe.Verifier):
    """Returns the accepted path as a list, as a verifier written for the old API would."""

    name = "host-verdict"

    def verify(self, tree, target_logits, generator=None):
        return [0], int(target_logits[0].argmax())


class _OutOfRangeVerifier(specframe.Verifier):
    """Returns a node the tree does not have."""

    name = "out-of-range"

    def verify(self, tree, target_logits, generator=None):
        return torch.tensor(len(tree)), target_logits[0].argmax()


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "default"])
def test_verifier_breaking_the_return_convention_is_named(target, strict):
    dec = _build(target, policy="chain", verifier=_HostVerdictVerifier(None), strict=strict)
    with pytest.raises(specframe.EngineError, match=r"verifier 'host-verdict' returned last=\[0\]: verify must "
                                                    r"return .* two 0-dim integer tensors on the tree's device"):
        dec.generate([5, 6, 7], max_new_tokens=4)


def test_strict_mode_checks_the_verifiers_node_range(target):
    dec = _build(target, policy="chain", verifier=_OutOfRangeVerifier(None), strict=True)
    with pytest.raises(specframe.EngineError, match=r"verifier 'out-of-range' returned node \d+ of a \d+-node tree"):
        dec.generate([5, 6, 7], max_new_tokens=4)


def test_strict_mode_follows_the_environment(target, monkeypatch):
    monkeypatch.setenv("SPECFRAME_STRICT", "1")
    assert _build(target).strict and not _build(target, strict=False).strict
    monkeypatch.setenv("SPECFRAME_STRICT", "0")
    assert not _build(target).strict and _build(target, strict=True).strict
    monkeypatch.delenv("SPECFRAME_STRICT")
    assert not _build(target).strict
