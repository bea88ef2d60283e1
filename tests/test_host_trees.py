"""Trees held in host lists (DraftTree.from_lists), the CPU fast path of a policy that grows
its tree on the host: the same tensors, mask and engine read as a tree built from tensors, and
the chain's host loop builds the tree its tensor loop builds, node for node."""

from __future__ import annotations

import copy
import dataclasses
import math
import sys

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
from specframe.plugins import get_registry

# The built-ins as the registry loaded them (the module a patch must reach).
chain_module = sys.modules[get_registry().get("policies", "chain").__module__]
talon_module = sys.modules[get_registry().get("policies", "talon").__module__]
grow_on_host, talon_on_host = chain_module.grow_on_host, talon_module.grow_on_host

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


@pytest.mark.parametrize("drafter", ["ngram", "model", "model-f32"])
@given(prompt=st.lists(st.integers(0, fx.VOCAB - 1), min_size=2, max_size=12), budget=st.integers(2, 40),
       mu=st.sampled_from([0.003, 0.03, 0.3, 1.0]), top_k=st.integers(1, 12), init_layers=st.integers(0, 2))
def test_talons_host_loop_builds_the_tensor_loops_tree(drafter, prompt, budget, mu, top_k, init_layers):
    target, make = _drafters()
    tgt = specframe.TargetModel(target)
    policy = make_plugin("policies", ("talon", {"budget": budget, "mu": mu, "top_k": top_k,
                                                 "init_layers": init_layers}))
    log_mu = math.log(mu)
    trees, forwards = [], []
    for grow in (lambda s, g: policy.grow_tensors(s, g, budget, top_k, log_mu),
                 lambda s, g: talon_on_host(s, g, budget, top_k, init_layers, log_mu)):
        dra = make[drafter](tgt)
        dra.begin(torch.tensor(prompt))
        session = DraftSession(dra, prompt[-1], torch.device("cpu"), context_len=len(prompt))
        trees.append(grow(session, Growth(budget, budget)))
        forwards.append(session.draft_forwards)
    tensors, listed = trees
    assert listed.has_host() and forwards[0] == forwards[1]
    for f in FIELDS:
        assert torch.equal(getattr(listed, f), getattr(tensors, f)), f


@pytest.fixture(scope="module")
def eagle_target():
    from specframe.testing.models import tiny_model

    return tiny_model("llama", seed=3, layers=4, vocab_size=fx.VOCAB, dtype=torch.float64)


@pytest.mark.parametrize("drafter", ["model", "eagle3"])
@pytest.mark.parametrize("policy", [("talon", {"budget": 12}), ("talon", {"budget": 30, "mu": 0.3, "init_layers": 2}),
                                    ("chain", {"gamma": 4, "confidence_stop": True, "confidence_threshold": 0.5})])
def test_the_host_loops_decode_as_the_tensor_loops(drafter, policy, eagle_target, monkeypatch):
    """Whole generations: the CPU's host loops and the tensor loops (forced by replacing the
    host loops) give the same steps, tree for tree. (Sizes chosen by the auto sizer depend on
    measured time, so they differ from run to run: fixed sizes here, the prune below.)"""
    from specframe.drafters.eagle_checkpoint import random_head

    # EAGLE-3 with a reduced vocabulary (a non-trivial map) reads list-held trees without tensors.
    target = eagle_target if drafter == "eagle3" else fx.tiny_target()
    spec = ("eagle3", {"head": random_head(target, "eagle3", seed=2, draft_vocab_size=24)}) if drafter == "eagle3" \
        else ("model", {"model": fx.close_draft(target)})
    runs = []
    for host in (True, False):
        dec = specframe.SpecDecoder.build(target=target, drafter=spec, policy=policy, strict=False)
        if not host:
            pol = dec.policy
            monkeypatch.setattr(talon_module, "grow_on_host",
                                lambda s, g, n, k, init, log_mu: pol.grow_tensors(s, g, n, k, log_mu))
            monkeypatch.setattr(chain_module, "grow_on_host",
                                lambda s, g, gamma, threshold: pol.grow_tensors(s, g, gamma, threshold))
        trees = []
        out = dec.generate([5, 17, 9, 4, 4, 12], max_new_tokens=40, eos_token_id=None,
                           on_step=lambda view: trees.append((view.tree.has_host(), view.tree.tokens.tolist(),
                                                              view.tree.parents.tolist())))
        runs.append((out.tokens, [(s.tree_size, s.accepted) for s in out.steps], trees))
        monkeypatch.undo()
    (tokens, steps, trees), (tokens_t, steps_t, trees_t) = runs
    assert tokens == tokens_t and steps == steps_t
    assert [t[1:] for t in trees] == [t[1:] for t in trees_t]
    assert any(t[0] for t in trees) and not any(t[0] for t in trees_t)


@given(tree=draft_trees(max_nodes=40, vocab_size=16), data=st.data())
def test_the_auto_sizers_cut_of_a_tree_in_lists_is_its_cut_in_tensors(tree, data):
    from specframe.sizing.prune import closed, subtree

    parents = tree.parents.tolist()
    keep = closed(sorted({0, *data.draw(st.lists(st.integers(0, len(tree) - 1), max_size=len(tree)))}), parents)
    index = {old: new for new, old in enumerate(keep)}
    kept_parents = [index[parents[i]] if i else -1 for i in keep]
    listed, tensors = subtree(_listed(tree), keep, kept_parents), subtree(tree, keep, kept_parents)
    assert listed.has_host()
    for f in FIELDS:
        assert torch.equal(getattr(listed, f), getattr(tensors, f)), f
    assert torch.equal(listed.origins(), tensors.origins())


@given(seed=st.integers(0, 2**31 - 1), rows=st.integers(1, 4), width=st.integers(2, 40), k=st.integers(1, 8),
       levels=st.sampled_from([3, 1 << 20]), specials=st.booleans())
def test_the_eagle_drafters_host_top_k_is_topk_per_row_or_declines(seed, rows, width, k, levels, specials):
    """EAGLE's top_lists takes one topk of k + 1 places and sorts k on the host: where it answers,
    it is topk_per_row's answer (mapped ids included); ties at the k-th place, short rows and
    NaN make it decline (the exact selection runs instead)."""
    from specframe.selection import topk_per_row

    host_top = sys.modules[get_registry().get("drafters", "eagle").__module__]._host_top
    g = torch.Generator().manual_seed(seed)
    logp = torch.randint(0, levels, (rows, width), generator=g).float()
    if specials:
        logp[torch.rand(rows, width, generator=g) < 0.2] = float("-inf")
        logp[torch.rand(rows, width, generator=g) < 0.05] = float("nan")
    k = min(k, width - 1)
    ids = sorted(torch.randperm(3 * width, generator=g)[:width].tolist())  # an increasing map
    top = torch.topk(logp, k + 1, dim=-1, sorted=True)
    got = host_top(top.values.tolist(), top.indices.tolist(), k, ids)
    if top.values.isnan().any():
        assert got is None
        return
    values, index, _ = topk_per_row(logp, k)
    if got is None:
        assert (values[:, -1] == -math.inf).any() or (top.values[:, k - 1] == top.values[:, k]).any()
        return
    assert [v for v, _ in got] == values.tolist()
    assert [t for _, t in got] == [[ids[i] for i in row] for row in index.tolist()]


@pytest.mark.parametrize("drafter", ["ngram", "eagle3", "eagle"])
def test_a_drafters_top_lists_are_its_expand_top(drafter, eagle_target):
    from specframe.drafters.eagle_checkpoint import random_head

    tgt = specframe.TargetModel(eagle_target)
    spec = drafter if drafter == "ngram" else \
        (drafter, {"head": random_head(eagle_target, drafter, seed=2, **({"draft_vocab_size": 24} if drafter == "eagle3" else {}))})
    dra = make_plugin("drafters", spec, tgt)
    prompt = [5, 9, 3, 5, 9, 4, 5, 9]
    dra.begin(torch.tensor(prompt), target_hidden=tuple(eagle_target(torch.tensor([prompt[:-1]]), output_hidden_states=True).hidden_states)
              if drafter != "ngram" else None)
    session = DraftSession(dra, prompt[-1], torch.device("cpu"), context_len=len(prompt))
    tree = talon_on_host(session, Growth(12, 12), 12, 3, 1, math.log(0.1))
    nodes = list(range(len(tree)))
    for k in (1, 2, 5):
        values, tokens, _ = dra.expand_top(tree, torch.tensor(nodes), k)
        assert dra.top_lists(tree, nodes, k) == list(zip(values.tolist(), tokens.tolist()))
