"""The ``suffix`` drafter (SuffixDecoding): per-request and global matching, the depth and
probability limits, eviction, options, lossless decoding under every policy, conformance."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import specframe
from specframe.drafters.suffix import SuffixDrafter, SuffixDrafterOptions
from specframe.drafters.suffix_tree import OutputCache, SuffixIndex
from specframe.options import OptionError, build_options
from specframe.testing.conformance import DrafterConformance
from specframe.testing.harness import chain_tree, greedy_reference
from specframe.testing.harness import row_probs as probs
from specframe.testing.models import tiny_model
from specframe.tree import DraftTree

V = 32


class _FakeTarget:
    """Just enough of a TargetModel for a drafter that never runs a model."""

    vocab_size = V


def make(prompt: list[int] | None = None, **options) -> SuffixDrafter:
    """A suffix drafter over a V-token vocabulary, begun on ``prompt`` if given."""
    drafter = SuffixDrafter(build_options(SuffixDrafterOptions, options, "drafter 'suffix'"), _FakeTarget())
    if prompt is not None:
        drafter.begin(torch.tensor(prompt))
    return drafter


def rows(drafter: SuffixDrafter, root: int, path: list[int]) -> list[dict[int, float]]:
    """Rows along a chain root -> path, root first."""
    out = drafter.expand(chain_tree(root, path), torch.arange(len(path) + 1))
    return [probs(r) for r in out]


def is_fallback(row: dict[int, float]) -> bool:
    return len(row) == 1 and next(iter(row.values())) < 1e-5


def generate(drafter: SuffixDrafter, prompt: list[int], output: list[int]) -> None:
    """What the engine does for one generation whose committed and emitted output is ``output``."""
    drafter.begin(torch.tensor(prompt))
    drafter.commit(torch.tensor(output))
    drafter.finish(torch.tensor(output))


# ---------------------------------------------------------------------- per request
def test_repeated_phrase_is_continued():
    phrase = [3, 9, 4, 7, 1, 8]
    drafter = make([2, 5] + phrase + [6, 0] + phrase[:3], min_token_prob=0.0)
    got = rows(drafter, phrase[2], phrase[3:5])
    assert got[0] == pytest.approx({7: 1.0})
    assert got[1] == pytest.approx({1: 1.0}) and got[2] == pytest.approx({8: 1.0})


def test_frequencies_give_several_candidates():
    drafter = make([4, 5, 4, 5, 4, 6, 4, 5, 4], max_match=1, min_token_prob=0.0)
    assert rows(drafter, 4, [])[0] == pytest.approx({5: 0.75, 6: 0.25})


def test_longest_match_wins():
    # "1 2 3" was followed by 9; the shorter "2 3" and "3" also by 7.
    drafter = make([1, 2, 3, 9, 5, 2, 3, 7, 4, 3, 7, 1, 2, 3], min_token_prob=0.0)
    assert rows(drafter, 3, [])[0] == pytest.approx({9: 1.0})


def test_commit_extends_the_request_index():
    drafter = make([1, 2, 3], min_token_prob=0.0)
    assert is_fallback(rows(drafter, 3, [])[0])
    drafter.commit(torch.tensor([4, 3]))
    assert rows(drafter, 3, [])[0] == pytest.approx({4: 1.0})


def test_depth_follows_the_match_length():
    # The root matches "7 1 2 3" (4 tokens): with factor 0.5 only depths 0 and 1 get children.
    seq = [7, 1, 2, 3, 4, 5, 6, 0, 7, 1, 2, 3]
    drafter = make(seq, max_spec_factor=0.5, min_token_prob=0.0)
    got = rows(drafter, 3, [4, 5, 6])
    assert got[0] == pytest.approx({4: 1.0}) and got[1] == pytest.approx({5: 1.0})
    assert is_fallback(got[2]) and is_fallback(got[3])
    # max_depth caps it whatever the match: depth 0 only.
    assert is_fallback(rows(make(seq, max_depth=0, min_token_prob=0.0), 3, [4])[1])


def test_min_token_prob_prunes_by_cumulative_probability():
    # After 4: 5 (p 0.5) or 6 (p 0.5); after "4 5": 8 (p 0.5) or 9 (p 0.5) -> cumulative 0.25.
    seq = [4, 5, 8, 4, 5, 9, 4, 6, 1, 4, 6, 2, 0, 4]
    drafter = make(seq, max_match=2, max_spec_factor=4.0, min_token_prob=0.3)
    got = rows(drafter, 4, [5])
    assert got[0] == pytest.approx({5: 0.5, 6: 0.5})
    assert is_fallback(got[1])  # 0.5 * 0.5 < 0.3
    assert rows(make(seq, max_match=2, max_spec_factor=4.0, min_token_prob=0.2), 4, [5])[1] == pytest.approx(
        {8: 0.5, 9: 0.5})


def test_no_match_gives_the_fallback_row():
    drafter = make([5, 6, 6, 9])
    row = drafter.expand(DraftTree.root(9), torch.tensor([0]))[0]
    assert torch.isfinite(row).sum() == 1 and int(row.argmax()) == 6
    assert float(row[6]) == pytest.approx(math.log(1e-6))
    assert not torch.isfinite(make([5, 6, 6, 9], fallback_prob=0.0).expand(DraftTree.root(9), torch.tensor([0]))).any()


# ---------------------------------------------------------------------- global
def test_global_tree_proposes_an_earlier_output():
    drafter = make(min_token_prob=0.0)
    generate(drafter, [1, 2], [10, 11, 12, 13, 14])
    drafter.begin(torch.tensor([20, 21, 10, 11]))  # a new prompt ending in the old output's start
    first, second = rows(drafter, 11, [12])[:2]  # pytest.approx refuses nested structures (pytest >= 9)
    assert first == pytest.approx({12: 1.0}) and second == pytest.approx({13: 1.0})
    assert drafter.persistent_state


def test_no_global_tree_when_disabled():
    drafter = make(min_token_prob=0.0, global_tree=False)
    generate(drafter, [1, 2], [10, 11, 12, 13, 14])
    drafter.begin(torch.tensor([20, 21, 10, 11]))
    assert is_fallback(rows(drafter, 11, [])[0])
    assert not drafter.persistent_state


def test_combination_weights_by_match_length():
    drafter = make(min_token_prob=0.0)
    generate(drafter, [0], [1, 2, 3, 5])  # global: "1 2 3" -> 5 (match 3)
    drafter.begin(torch.tensor([9, 3, 7, 1, 2, 3]))  # request: "3" -> 7 (match 1)
    assert rows(drafter, 3, [])[0] == pytest.approx({5: 0.75, 7: 0.25})


def test_eviction_keeps_at_most_max_cached_requests():
    drafter = make(min_token_prob=0.0, max_cached_requests=2)
    for first in (10, 14, 18):
        generate(drafter, [0], [first, first + 1, first + 2])
    drafter.begin(torch.tensor([1]))
    assert len(drafter.cache) == 2
    assert [o[0] for o in drafter.cache.outputs] == [14, 18]
    assert (10,) not in drafter.cache.index.table and (14,) in drafter.cache.index.table


@settings(max_examples=30, deadline=None)
@given(docs=st.lists(st.lists(st.integers(0, 4), max_size=12), max_size=6), bound=st.integers(1, 3))
def test_eviction_equals_indexing_the_kept_outputs(docs, bound):
    cache = OutputCache(3, bound)
    for doc in docs:
        cache.add(doc)
    fresh = SuffixIndex(3)
    for doc in [d for d in docs if d][-bound:]:
        fresh.count(doc, 1, 1)
    assert cache.index.table == fresh.table


# ---------------------------------------------------------------------- rows and speed
@settings(max_examples=25, deadline=None)
@given(seq=st.lists(st.integers(0, 9), min_size=1, max_size=40),
       layers=st.lists(st.lists(st.integers(0, 9), min_size=1, max_size=3), min_size=1, max_size=3),
       k=st.integers(1, 12), vocab=st.sampled_from([4, 10, 32]))
def test_expand_top_equals_the_selection_over_the_dense_rows(seq, layers, k, vocab):
    target = type("T", (), {"vocab_size": vocab})()
    drafter = SuffixDrafter(SuffixDrafterOptions(min_token_prob=0.0, max_spec_factor=8.0), target)
    drafter.begin(torch.tensor(seq))
    tree, frontier = DraftTree.root(seq[-1]), [0]
    for tokens in layers:
        nodes = torch.tensor(frontier)
        want = specframe.topk_per_row(drafter.expand(tree, nodes), k)
        for g, w in zip(drafter.expand_top(tree, nodes, k), want):
            assert torch.equal(g, w), (g, w)
        parents = torch.tensor(frontier).repeat_interleave(len(tokens))
        start = len(tree)
        tree = tree.add_nodes(parents, torch.tensor(tokens * len(frontier)), tree.logp[parents] - 1.0)
        frontier = list(range(start, len(tree)))


# ---------------------------------------------------------------------- options
@pytest.mark.parametrize(
    "options, bad",
    [
        ({"max_depth": -1}, "max_depth"),
        ({"min_match": 0}, "min_match"),
        ({"max_match": 1, "min_match": 2}, "max_match"),
        ({"max_spec_factor": 0.0}, "max_spec_factor"),
        ({"min_token_prob": 1.5}, "min_token_prob"),
        ({"max_cached_requests": 0}, "max_cached_requests"),
        ({"fallback_prob": -0.1}, "fallback_prob"),
        ({"global_tree": "yes"}, "global_tree"),
        ({"depth": 3}, "depth"),
    ],
)
def test_bad_options_name_the_option(options, bad):
    with pytest.raises(OptionError, match=bad) as info:
        build_options(SuffixDrafterOptions, options, "drafter 'suffix'")
    assert "\n" not in str(info.value)


def test_registered_and_declared():
    assert "suffix" in specframe.available()["drafters"]
    cls = specframe.get_registry().get("drafters", "suffix")
    assert cls.replay == "exact" and cls.needs_target_logits is False


# ---------------------------------------------------------------------- lossless
CASES = [("llama", 2, [5, 6, 7, 8, 9] * 4), ("gpt2", 1, [3, 4, 5] * 5)]
BUDGET = 30
MAX_NEW = 40


def _policy_options(name: str) -> dict:
    options = {"gamma": 5} if name == "chain" else {}
    fields = {f.name for f in dataclasses.fields(specframe.get_registry().get("policies", name).Options)}
    if "budget" in fields:
        options.setdefault("budget", BUDGET)
    return options


@pytest.fixture(scope="module")
def cases():
    out = []
    for arch, seed, prompt in CASES:
        model = tiny_model(arch, seed=seed, vocab_size=48, dtype=torch.float64)
        out.append((arch, model, prompt, greedy_reference(model, prompt, MAX_NEW, None)))
    return out


@pytest.mark.parametrize("policy", specframe.get_registry().names("policies"))
def test_lossless_with_every_policy(policy, cases):
    accepted = 0
    for arch, model, prompt, ref in cases:
        dec = specframe.SpecDecoder.build(target=model, drafter=("suffix", {}), policy=(policy, _policy_options(policy)))
        for _ in range(2):  # the second run also drafts from the global index
            out = dec.generate(torch.tensor(prompt), max_new_tokens=MAX_NEW, eos_token_id=None)
            assert out.tokens == ref, f"{policy} on {arch} diverged from greedy decoding"
            accepted += sum(s.accepted for s in out.steps)
    assert accepted > 0


# ---------------------------------------------------------------------- conformance
class TestSuffixConformance(DrafterConformance):
    plugin = "suffix"


class TestSuffixConformanceNoGlobal(DrafterConformance):
    plugin = ("suffix", {"global_tree": False, "min_token_prob": 0.0, "max_spec_factor": 4.0})


# ---------------------------------------------------------------------- end of generation
def test_the_global_index_holds_each_output_exactly_as_emitted(cases):
    """The engine's finish call hands over the emitted tokens, cut at max_new_tokens, not the
    last step's whole commit (which may run past the cut)."""
    _, model, prompt, _ = cases[0]
    dec = specframe.SpecDecoder.build(target=model, drafter=("suffix", {}), policy=("chain", {"gamma": 6}))
    seen = []
    for cut in (3, 5):
        out = dec.generate(torch.tensor(prompt), max_new_tokens=cut, eos_token_id=None)
        seen.append(out.tokens)
    assert [len(t) for t in seen] == [3, 5]
    assert [list(o) for o in dec.drafter.cache.outputs] == seen


def test_every_row_of_a_batch_finishes_with_its_emitted_output(cases):
    from specframe.decode.batch import generate_batch

    _, model, prompt, _ = cases[0]
    dec = specframe.SpecDecoder.build(target=model, drafter=("suffix", {}), policy=("chain", {"gamma": 4}))
    prompts = [prompt, prompt[:-1]]
    res = generate_batch(dec, prompts, max_new_tokens=4, eos_token_id=None)
    outputs = sorted(list(o) for b in dec._batch_decoders.values() for d in b._drafters for o in d.cache.outputs)
    assert outputs == sorted(o.tokens for o in res.outputs)
