"""The ``hybrid`` drafter: the merged row against the rule written out, expand_top against the
selection over the dense merged rows (ties, duplicates across parts, sparse and dense parts),
what each part is handed, one draft forward per call, and its declarations."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import specframe
from specframe.drafters.hybrid import HybridDrafter, HybridDrafterOptions
from specframe.interfaces import Drafter
from specframe.options import OptionError
from specframe.selection import topk_per_row
from specframe.testing.fixtures import tiny_target

VOCAB = 20


class _Target:
    vocab_size = VOCAB
    device = torch.device("cpu")


class _Fixed(Drafter):
    """A part whose row at a node is a fixed function of the node's token (some ``-inf``)."""

    name = "fixed"

    def __init__(self, seed: int, finite: int, ties: bool) -> None:
        super().__init__(None, _Target())
        gen = torch.Generator().manual_seed(seed)
        table = torch.log_softmax(torch.randn(VOCAB, VOCAB, generator=gen, dtype=torch.float64), -1)
        if ties:
            table = (table * 2).round() / 2  # equal values inside a row and across parts
        cut = torch.topk(table, finite, dim=-1).values[:, -1:]
        self.table = torch.where(table >= cut, table, -math.inf).float()
        self.calls: list[tuple[str, dict]] = []

    def expand(self, tree, nodes):
        return self.table[tree.tokens[nodes]]

    def begin(self, prompt_ids, **kwargs):
        self.calls.append(("begin", kwargs))

    def commit(self, tokens, path=None, tree=None, **kwargs):
        self.calls.append(("commit", kwargs))


def _hybrid(parts: list[Drafter]) -> HybridDrafter:
    drafter = HybridDrafter(HybridDrafterOptions(drafters=["ngram"]), _Target())
    drafter.parts = parts
    drafter.log_parts = math.log(len(parts))
    return drafter


def _chain() -> specframe.DraftTree:
    tree = specframe.DraftTree.root(0)
    for token in range(1, VOCAB):
        tree = tree.add_nodes(torch.tensor([token - 1]), torch.tensor([token]), tree.logp[-1:] - 1.0)
    return tree


def test_the_merged_row_is_the_max_of_the_parts_minus_log_parts():
    parts = [_Fixed(1, 5, False), _Fixed(2, 3, False), _Fixed(3, VOCAB, False)]
    tree, nodes = _chain(), torch.arange(VOCAB)
    got = _hybrid(parts).expand(tree, nodes)
    for node in range(VOCAB):
        for token in range(VOCAB):
            best = max(float(p.table[node, token]) for p in parts)
            assert math.isclose(float(got[node, token]), best - math.log(3), abs_tol=1e-6) or best == -math.inf
    assert bool((torch.logsumexp(got.double(), -1) <= 1e-6).all())  # still a sub-probability


@given(seeds=st.lists(st.integers(0, 2**16), min_size=1, max_size=3), finite=st.integers(1, VOCAB),
       ties=st.booleans(), k=st.integers(1, VOCAB), nodes=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=6))
def test_expand_top_equals_the_selection_over_the_merged_rows(seeds, finite, ties, k, nodes):
    hybrid = _hybrid([_Fixed(s, max(1, finite - i), ties) for i, s in enumerate(seeds)])
    tree, index = _chain(), torch.tensor(nodes)
    want = topk_per_row(hybrid.expand(tree, index), k)
    got = hybrid.expand_top(tree, index, k)
    for name, g, w in zip(("values", "ids", "ranks"), got, want):
        assert torch.equal(g, w), f"{name}: {g} vs {w}"


@pytest.mark.parametrize("k", [1, 3])
def test_expand_top_of_rows_no_part_can_extend_is_the_selection_filler(k):
    """Tokens whose rows are dead in every part (an n-gram miss on a token the table never saw)
    get what the selection gives an all -inf row; k = 1 is the chain's own merge."""
    parts = [_Fixed(1, 4, True), _Fixed(2, 2, True)]
    for part in parts:
        part.table[[2, 5, 7]] = -math.inf
    parts[1].table[3] = -math.inf  # dead in one part only
    hybrid, tree, index = _hybrid(parts), _chain(), torch.tensor([2, 3, 5, 6, 7])
    for g, w in zip(hybrid.expand_top(tree, index, k), topk_per_row(hybrid.expand(tree, index), k)):
        assert torch.equal(g, w)


def test_parts_get_only_the_target_outputs_they_declare():
    plain, learning = _Fixed(1, 3, False), _Fixed(2, 3, False)
    learning.needs_target_logits = True
    hybrid = _hybrid([plain, learning])
    logits = torch.zeros(1, VOCAB)
    hybrid.begin(torch.tensor([1, 2]), target_hidden=None, target_logits=logits)
    hybrid.commit(torch.tensor([3]), torch.tensor([0]), None, tree=_chain(), target_logits=logits)
    assert plain.calls == [("begin", {}), ("commit", {})]
    assert [name for name, _ in learning.calls] == ["begin", "commit"]
    assert all(kw == {"target_logits": logits} and kw["target_logits"] is logits for _, kw in learning.calls)


def test_declarations_are_the_union_and_the_weakest_replay():
    target = specframe.TargetModel(tiny_target())
    hybrid = specframe.engine.make_plugin("drafters", ("hybrid", {"drafters": ["ngram", ["recycle", {"k": 4}]]}),
                                          target)
    assert hybrid.needs_target_logits and not hybrid.needs_target_hidden and hybrid.persistent_state
    assert hybrid.replay == "unsupported" and hybrid.parts[1].options.k == 4
    ngram_only = specframe.engine.make_plugin("drafters", ("hybrid", {"drafters": ["ngram"]}), target)
    assert ngram_only.replay == "exact" and not ngram_only.needs_target_logits


@pytest.mark.parametrize("bad", [[], ["ngram", 3], [["ngram"]], ["no-such-drafter"], [["ngram", {"max_ngram": 0}]]])
def test_bad_parts_name_the_option(bad):
    with pytest.raises((OptionError, KeyError, LookupError, ValueError)) as err:
        specframe.SpecDecoder.build(target=tiny_target(), drafter=("hybrid", {"drafters": bad}))
    assert "drafter" in str(err.value)


def test_a_step_counts_one_draft_forward_per_call_for_all_parts():
    model = tiny_target()
    prompt = [4, 9, 12, 30, 2, 17, 9, 12]
    runs: dict[Any, list[int]] = {}
    for drafter in ("ngram", ("hybrid", {"drafters": ["ngram", "recycle"]})):
        dec = specframe.SpecDecoder.build(target=specframe.TargetModel(model), drafter=drafter,
                                          policy=("chain", {"gamma": 3}))
        out = dec.generate(prompt, max_new_tokens=12, eos_token_id=None)
        runs[str(drafter)] = [s.draft_forwards for s in out.steps]
    assert all(f <= 3 for fs in runs.values() for f in fs)
    assert max(runs[str(("hybrid", {"drafters": ["ngram", "recycle"]}))]) == 3


@pytest.mark.parametrize("policy", [("talon", {"budget": "auto", "mu": "auto"}), ("chain", {"gamma": "auto"})])
def test_auto_sized_policies_run_lossless_on_merged_rows(policy):
    from specframe.testing.harness import greedy_reference

    model = tiny_target()
    dec = specframe.SpecDecoder.build(target=specframe.TargetModel(model), drafter="hybrid", policy=policy,
                                      strict=True)
    for prompt in ([4, 9, 12, 30, 2, 17, 9, 12, 30, 2], [5, 5, 5]):
        out = dec.generate(prompt, max_new_tokens=24, eos_token_id=None)
        assert out.tokens == greedy_reference(model, prompt, 24, None)
