"""The suite's statistics are right: exact emitted distributions, chi-square p-values, tree sampling."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specframe.testing.distribution import TreeSampler, chi_square_pvalue, emitted_distribution, hf_warped_probs
from specframe.testing.strategies import draft_trees
from specframe.tree import DraftTree


def test_emitted_distribution_hand_example():
    # root (token 9) -> child with token 2; V = 3.
    tree = DraftTree.root(9).add_nodes(torch.tensor([0]), torch.tensor([2]), torch.tensor([-0.5]))
    probs = torch.tensor([[0.2, 0.3, 0.5], [0.6, 0.4, 0.0]], dtype=torch.float64)
    got = emitted_distribution(tree, probs)
    want = {(0,): 0.2, (1,): 0.3, (2, 0): 0.3, (2, 1): 0.2}
    assert got.keys() == want.keys() and all(math.isclose(got[k], want[k]) for k in want)


@settings(max_examples=30, deadline=None)
@given(tree=draft_trees(max_nodes=12, vocab_size=5), seed=st.integers(0, 1000))
def test_emitted_distribution_sums_to_one_and_matches_a_slow_walk(tree, seed):
    probs = torch.softmax(torch.randn(len(tree), 5, generator=torch.Generator().manual_seed(seed), dtype=torch.float64), -1)
    got = emitted_distribution(tree, probs)
    assert math.isclose(sum(got.values()), 1.0, rel_tol=1e-9)
    # Slow reference: probability of each outcome as a product along the walk it describes.
    tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
    for outcome, p in got.items():
        node, mass = 0, 1.0
        for i, tok in enumerate(outcome):
            mass *= float(probs[node, tok])
            child = [c for c in range(len(tokens)) if parents[c] == node and tokens[c] == tok]
            if i < len(outcome) - 1:
                assert child, f"outcome {outcome} continues past a token that is not in the tree"
                node = child[0]
            else:
                assert not child, f"outcome {outcome} stops on a drafted child"
        assert math.isclose(mass, p, rel_tol=1e-9)


@pytest.mark.parametrize("stat, df, p", [(3.841458820694124, 1, 0.05), (5.991464547107979, 2, 0.05),
                                         (18.307038053275146, 10, 0.05), (9.21034037197618, 2, 0.01)])
def test_chi_square_pvalue_matches_chi2_tables(stat, df, p):
    # One cell per degree of freedom plus one, counts built to give exactly `stat`.
    k = df + 1
    total = 10_000
    probs = {i: 1.0 / k for i in range(k)}
    exp = total / k
    # Put the whole deviation on cells 0 and 1 (+d, -d): stat = 2 d^2 / exp.
    d = math.sqrt(stat * exp / 2)
    counts = {i: exp for i in range(k)}
    counts[0], counts[1] = exp + d, exp - d
    got, got_df = chi_square_pvalue(counts, probs)
    assert got_df == df and math.isclose(got, p, rel_tol=1e-6)


def test_chi_square_pools_rare_cells_and_detects_a_biased_sample():
    probs = {"a": 0.5, "b": 0.499, "c": 0.0005, "d": 0.0005}
    fair, df = chi_square_pvalue({"a": 1000, "b": 998, "c": 1, "d": 1}, probs)
    assert df == 2 and fair > 0.5  # c and d (expected 1 each) pooled into one cell
    biased, _ = chi_square_pvalue({"a": 1200, "b": 800}, probs)
    assert biased < 1e-10


def test_hf_warped_probs_normalise_and_truncate():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]], dtype=torch.float64)
    probs = hf_warped_probs(logits, temperature=0.5, top_k=2, top_p=1.0)
    assert torch.allclose(probs.sum(-1), torch.ones(1, dtype=torch.float64))
    assert probs[0, 2] == 0 and probs[0, 3] == 0
    assert math.isclose(float(probs[0, 0] / probs[0, 1]), math.exp(2.0), rel_tol=1e-9)


@pytest.mark.parametrize("mode", ["deterministic", "iid", "without_replacement"])
def test_tree_sampler_draws_valid_trees_that_record_their_drafting(mode):
    shape = [-1, 0, 1, 2] if mode == "iid" else [-1, 0, 0, 0, 1, 1, 4]
    q = torch.softmax(torch.randn(len(shape), 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64), -1)
    gen = torch.Generator().manual_seed(1)
    firsts = []
    for _ in range(400):
        tree = TreeSampler(shape, q, mode).draw(gen)
        tree.check_valid()
        assert tree.drafting == mode
        if mode != "deterministic":
            assert torch.equal(tree.draft_probs[0], q[0])
        firsts.append(int(tree.tokens[1]))
    counts = {t: firsts.count(t) for t in set(firsts)}
    if mode == "deterministic":
        assert counts == {int(q[0].argmax()): 400}
    else:  # the first child of the root is a plain draw from q[0]
        p_value, _ = chi_square_pvalue(counts, {t: float(q[0, t]) for t in range(8)})
        assert p_value > 1e-4
