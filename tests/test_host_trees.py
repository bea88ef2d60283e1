"""Trees held in host lists (DraftTree.from_lists), the CPU fast path of a policy that grows
its tree on the host: the same tensors, mask and engine read as a tree built from tensors, and
the chain's host loop builds the tree its tensor loop builds, node for node."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from hypothesis import given, strategies as st

import specframe
from specframe import DraftTree
from specframe.decode.engine import make_plugin
from specframe.interfaces import DraftSession
from specframe.sizing.growth import Growth
from specframe.testing import fixtures as fx
from specframe.testing.strategies import draft_trees
from strategies.chain import grow_on_host

FIELDS = ("tokens", "parents", "depths", "logp", "ranks")


def _listed(tree: DraftTree) -> DraftTree:
    return DraftTree.from_lists(*(getattr(tree, f).tolist() for f in FIELDS))


def _pointer_jumping_mask(tree: DraftTree) -> torch.Tensor:
    plain = DraftTree(**{f: getattr(tree, f).clone() for f in FIELDS})
    return plain.ancestor_mask()


@given(draft_trees(max_nodes=80, vocab_size=16))
def test_a_tree_in_lists_has_the_tensors_and_mask_of_its_values(tree):
    listed = _listed(tree)
    assert listed.has_host() and len(listed) == len(tree) and listed.device == tree.device
    assert torch.equal(listed.ancestor_mask(), _pointer_jumping_mask(tree))
    for f in FIELDS:
        assert torch.equal(getattr(listed, f), getattr(tree, f)) and getattr(listed, f).dtype == getattr(tree, f).dtype
    assert listed.host() == tree.host()


def test_a_broken_tree_in_lists_gets_the_masks_tolerant_build():
    # A parent after its child: the host rows stop, the pointer jumping (which clamps) answers.
    broken = DraftTree.from_lists([4, 1, 2], [-1, 2, 0], [0, 1, 1], [0.0, -1.0, -1.0], [-1, 0, 0])
    assert torch.equal(broken.ancestor_mask(), _pointer_jumping_mask(broken))


def test_a_replaced_tree_holds_no_lists():
    listed = DraftTree.from_lists([4, 1], [-1, 0], [0, 1], [0.0, -1.0], [-1, 0])
    other = dataclasses.replace(listed, tokens=torch.tensor([4, 2]))
    assert not other.has_host() and other.host().tokens == [4, 2] and other.tokens.tolist() == [4, 2]
    assert repr(listed).startswith("DraftTree(")


def _drafters():
    target = fx.tiny_target()
    return target, {
        "ngram": lambda tgt: make_plugin("drafters", "ngram", tgt),
        "model": lambda tgt: make_plugin("drafters", ("model", {"model": fx.close_draft(target)}), tgt),
        "model-f32": lambda tgt: make_plugin("drafters", ("model", {"model": copy.deepcopy(fx.close_draft(target)).float()}),
                                             tgt),
    }


@pytest.mark.parametrize("drafter", ["ngram", "model", "model-f32"])
@given(prompt=st.lists(st.integers(0, fx.VOCAB - 1), min_size=2, max_size=12), gamma=st.integers(1, 6),
       threshold=st.sampled_from([None, 0.3, 0.9]))
def test_the_chains_host_loop_builds_the_tensor_loops_tree(drafter, prompt, gamma, threshold):
    target, make = _drafters()
    tgt = specframe.TargetModel(target)
    options = {"gamma": gamma} if threshold is None else {"gamma": gamma, "confidence_stop": True,
                                                           "confidence_threshold": threshold}
    policy = make_plugin("policies", ("chain", options))
    trees, forwards = [], []
    for grow in (policy.grow_tensors, grow_on_host):
        dra = make[drafter](tgt)
        dra.begin(torch.tensor(prompt))
        session = DraftSession(dra, prompt[-1], torch.device("cpu"), context_len=len(prompt))
        trees.append(grow(session, Growth(gamma + 1, gamma + 1), gamma, threshold))
        forwards.append(session.draft_forwards)
    tensors, listed = trees
    assert listed.has_host() and forwards[0] == forwards[1]
    for f in FIELDS:
        assert torch.equal(getattr(listed, f), getattr(tensors, f)), f
