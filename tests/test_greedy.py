"""The vectorised greedy verifier takes the same decisions as the literal walk from the root."""

import torch
from hypothesis import given, strategies as st

from specframe import DraftTree
from specframe.decode.engine import make_plugin
from specframe.decode.read import read_step
from specframe.testing.reference import Verdict, decide, greedy_walk, read_verdict
from specframe.testing.strategies import draft_trees


@given(tree=draft_trees(max_nodes=64, vocab_size=8), seed=st.integers(0, 2**31 - 1), follow=st.floats(0, 1))
def test_vectorised_greedy_equals_the_literal_walk(tree, seed, follow):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(len(tree), 8, generator=gen, dtype=torch.float64)
    # Steer a random share of nodes' argmax onto one of their children so long paths are accepted.
    for parent, child_token in zip(tree.parents[1:].tolist(), tree.tokens[1:].tolist()):
        if torch.rand((), generator=gen) < follow:
            logits[parent, child_token] = 100.0
    verdict = decide(make_plugin("verifiers", "greedy"), tree, logits)
    path, bonus = greedy_walk(tree, logits)
    assert verdict.accepted_path.tolist() == path
    assert verdict.bonus_token == bonus
    # The engine's one packed read of that decision equals reading the walk's verdict plainly.
    packed = read_step(tree, *Verdict(torch.tensor(path), bonus).leaf(tree), torch.tensor(True))
    plain = read_verdict(tree, verdict)
    assert packed.ok and packed.path.tolist() == plain.path.tolist() == path
    assert (packed.tokens, packed.ranks, packed.widths, packed.contiguous, packed.children) == (
        plain.tokens, plain.ranks, plain.widths, plain.contiguous, plain.children)


def test_greedy_takes_the_argmax_child():
    """The example of ``Verifier.verify``'s docstring."""
    tree = DraftTree.root(4).add_nodes(torch.tensor([0, 0]), torch.tensor([2, 5]), torch.tensor([-0.5, -1.0]))
    logits = torch.zeros(3, 8)
    logits[0, 5] = logits[2, 7] = 1.0          # argmax 5 at the root, 7 after node 2
    last, bonus = make_plugin("verifiers", "greedy").verify(tree, logits, None)
    assert (int(last), int(bonus)) == (2, 7)
    assert last.dim() == bonus.dim() == 0 and last.device == bonus.device == tree.device


def test_engine_with_the_reference_walk_gives_the_same_output():
    """The greedy verifier and its literal walk, run by the engine, emit the same tokens."""
    from specframe import SpecDecoder
    from specframe.testing import fixtures as fx
    from specframe.testing.reference import GreedyReferenceVerifier

    target = fx.tiny_target()
    outputs = [
        SpecDecoder.build(target=target, drafter=("model", {"model": fx.close_draft(target)}), policy="talon",
                          verifier=verifier).generate([5, 17, 9], max_new_tokens=16, eos_token_id=None).tokens
        for verifier in ("greedy", GreedyReferenceVerifier(None))
    ]
    assert outputs[0] == outputs[1]


@given(tree=draft_trees(max_nodes=64, vocab_size=8), seed=st.integers(0, 2**31 - 1), follow=st.floats(0, 1))
def test_host_verdict_of_a_tree_in_lists_equals_the_device_verdict(tree, seed, follow):
    """The CPU fast path (a tree held in host lists, decided by verify_host from the argmax
    read with the step) takes greedy_leaf's decision on the same tree and logits."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(len(tree), 8, generator=gen)
    for parent, child_token in zip(tree.parents[1:].tolist(), tree.tokens[1:].tolist()):
        if torch.rand((), generator=gen) < follow:
            logits[parent, child_token] = 100.0
    listed = DraftTree.from_lists(*(getattr(tree, f).tolist() for f in ("tokens", "parents", "depths", "logp", "ranks")))
    greedy = make_plugin("verifiers", "greedy")
    rows = greedy.verdict_rows(listed, logits).tolist()
    last, bonus = greedy.verify(tree, logits, None)
    assert greedy.verify_host(listed.host(), rows) == (int(last), int(bonus))
