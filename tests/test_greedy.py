"""The vectorised greedy verifier takes the same decisions as the literal walk from the root."""

import torch
from hypothesis import given, strategies as st

from specframe.engine import make_plugin
from specframe.testing.harness import greedy_walk
from specframe.testing.strategies import draft_trees


@given(tree=draft_trees(max_nodes=64, vocab_size=8), seed=st.integers(0, 2**31 - 1), follow=st.floats(0, 1))
def test_vectorised_greedy_equals_the_literal_walk(tree, seed, follow):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(len(tree), 8, generator=gen, dtype=torch.float64)
    # Steer a random share of nodes' argmax onto one of their children so long paths are accepted.
    for parent, child_token in zip(tree.parents[1:].tolist(), tree.tokens[1:].tolist()):
        if torch.rand((), generator=gen) < follow:
            logits[parent, child_token] = 100.0
    verdict = make_plugin("verifiers", "greedy").verify(tree, logits, None)
    path, bonus = greedy_walk(tree, logits)
    assert verdict.accepted_path.tolist() == path
    assert verdict.bonus_token == bonus
