"""The step's record read on the host: the tree's value invariants checked from the one read
(:func:`specframe.decode.read.tree_problem`) agree with :meth:`DraftTree.check_valid`, and the
engine outside strict mode refuses each broken invariant by name."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
import torch
from hypothesis import given, strategies as st

import specframe
from specframe.decode.read import tree_problem
from specframe.testing.models import tiny_model
from specframe.testing.strategies import draft_trees, maybe_broken_trees
from specframe.tree import InvalidTreeError


@given(maybe_broken_trees(fields=("parents", "depths", "tokens")))
def test_host_check_agrees_with_check_valid(tree):
    try:
        tree.check_valid()
        valid = True
    except InvalidTreeError:
        valid = False
    problem = tree_problem(tree.parents.tolist(), tree.tokens.tolist(), tree.depths.tolist(), None)
    assert (problem == "") == valid, problem


@given(tree=draft_trees(max_nodes=12), other=st.integers(0, 50))
def test_host_check_names_a_wrong_root_token(tree, other):
    root = int(tree.tokens[0])
    lists = (tree.parents.tolist(), tree.tokens.tolist(), tree.depths.tolist())
    assert tree_problem(*lists, root) == ""
    if other != root:
        assert tree_problem(*lists, other).startswith(f"root token {root} is not")


@dataclass
class _Opts(specframe.BudgetOptions):
    budget: int = 4


class _Broken(specframe.TreePolicy):
    """Returns a two-node tree with one field replaced."""

    name = "broken"
    Options = _Opts

    def __init__(self, **fields):
        super().__init__(_Opts())
        self.fields = fields

    def build(self, session, budget):
        tree = session.new_tree().add_nodes(torch.tensor([0]), torch.tensor([3]), torch.zeros(1))
        return replace(tree, **{k: torch.tensor(v) for k, v in self.fields.items()})


@pytest.mark.parametrize("fields, message", [
    ({"parents": [-1, 1]}, r"topological order violated at node 1: parent 1"),
    ({"parents": [0, 0]}, r"node 0 must be the root"),
    ({"depths": [0, 2]}, r"depth of node 1 is 2, expected parent depth \+ 1 = 1"),
    ({"depths": [1, 2]}, r"node 0 must be the root"),
])
def test_engine_names_each_broken_invariant_outside_strict_mode(fields, message):
    target = tiny_model("llama", seed=0)
    dec = specframe.SpecDecoder.build(target=target, drafter=("model", {"model": target}),
                                      policy=_Broken(**fields), strict=False)
    with pytest.raises(specframe.EngineError, match=f"policy 'broken' returned an invalid tree: {message}"):
        dec.generate([5, 6, 7], max_new_tokens=4)


class _OutOfRange(specframe.Verifier):
    """Returns a node the tree does not have."""

    name = "out-of-range"

    def verify(self, tree, target_logits, generator=None):
        return torch.tensor(len(tree)), target_logits[0].argmax()


def test_a_node_outside_the_tree_is_named_outside_strict_mode_too():
    # The path is walked on the host from the read, which sees the node's range for free.
    target = tiny_model("llama", seed=0)
    dec = specframe.SpecDecoder.build(target=target, drafter=("model", {"model": target}), policy="chain",
                                      verifier=_OutOfRange(None), strict=False)
    with pytest.raises(specframe.EngineError, match=r"verifier 'out-of-range' returned node \d+ of a \d+-node tree"):
        dec.generate([5, 6, 7], max_new_tokens=4)


@given(tree=draft_trees(max_nodes=12), pick=st.integers(0, 11))
def test_the_read_path_is_the_walk_to_the_verdict(tree, pick):
    from specframe.decode.read import _derived

    last = pick % len(tree)
    lists = (tree.parents.tolist(), tree.tokens.tolist(), tree.ranks.tolist(), tree.depths.tolist())
    read = _derived(*lists, last, 0, tree.device)
    walk, node = [], last
    while node >= 0:  # the plain walk from the verdict to the root
        walk.append(node)
        node = lists[0][node]
    assert read.path.tolist() == walk[::-1]
    assert read.contiguous == (walk[::-1] == list(range(len(walk))))
