"""The ``ngram`` drafter: suffix matching, options, incremental index, and lossless decoding."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import specframe
from specframe.drafters.ngram import NgramDrafter, NgramDrafterOptions, reference_distribution
from specframe.options import OptionError, build_options
from specframe.testing.fixtures import is_builtin
from specframe.testing.harness import chain_tree
from specframe.testing.harness import row_probs as probs
from specframe.testing.models import tiny_model
from specframe.tree import DraftTree

V = 32


class _FakeTarget:
    """Just enough of a TargetModel for a drafter that never runs a model."""

    vocab_size = V


def make(prompt: list[int], **options) -> NgramDrafter:
    """An ngram drafter over a V-token vocabulary that has begun on ``prompt``."""
    drafter = NgramDrafter(build_options(NgramDrafterOptions, options, "drafter 'ngram'"), _FakeTarget())
    drafter.begin(torch.tensor(prompt))
    return drafter


def root_row(drafter: NgramDrafter, root: int) -> torch.Tensor:
    """Draft log-probs at the root of a fresh tree."""
    return drafter.expand(DraftTree.root(root), torch.tensor([0]))[0]


# ---------------------------------------------------------------------- matching
def test_longest_suffix_wins():
    # After "1 2 3" the 3-gram says 9; the shorter suffixes "2 3" and "3" also saw 7.
    drafter = make([1, 2, 3, 9, 5, 2, 3, 7, 4, 3, 7, 1, 2, 3])
    assert probs(root_row(drafter, 3)) == pytest.approx({9: 1.0})


def test_shorter_suffix_used_when_longer_unseen():
    # "8 2 3" never occurred, "2 3" did (followed by 9 then 7).
    drafter = make([1, 2, 3, 9, 5, 2, 3, 7, 8, 2, 3])
    assert probs(root_row(drafter, 3)) == pytest.approx({9: 0.5, 7: 0.5})


def test_frequency_weighting_gives_several_candidates():
    drafter = make([4, 5, 4, 5, 4, 6, 4, 5, 4], max_ngram=1)
    p = probs(root_row(drafter, 4))
    assert p == pytest.approx({5: 0.75, 6: 0.25})
    # Matched rows are normalised distributions.
    assert sum(p.values()) == pytest.approx(1.0)


def test_recency_weighting_prefers_recent_continuations():
    seq = [4, 5, 4, 5, 4, 5, 4, 6, 4]
    plain = probs(root_row(make(seq, max_ngram=1), 4))
    recent = probs(root_row(make(seq, max_ngram=1, decay=0.5), 4))
    assert plain[5] > plain[6]
    assert recent[6] > recent[5]
    # Occurrences of 5 sit at ages 7, 5, 3 (from the end), 6 at age 1: weights 0.5**age.
    w5, w6 = 0.5**7 + 0.5**5 + 0.5**3, 0.5**1
    assert recent == pytest.approx({5: w5 / (w5 + w6), 6: w6 / (w5 + w6)})


def test_max_ngram_limits_the_context_used():
    seq = [1, 2, 3, 9, 5, 2, 3, 7, 4, 3, 7, 1, 2, 3]
    # With max_ngram=1 only "3" is used: it was followed by 9, 7, 7.
    assert probs(root_row(make(seq, max_ngram=1), 3)) == pytest.approx({9: 1 / 3, 7: 2 / 3})
    # With max_ngram=2, "2 3" was followed by 9 and 7.
    assert probs(root_row(make(seq, max_ngram=2), 3)) == pytest.approx({9: 0.5, 7: 0.5})


def test_min_ngram_rejects_short_matches_and_falls_back():
    # Only the unigram "3" matches (followed by 7); min_ngram=2 refuses it.
    seq = [3, 7, 3, 7, 3, 2, 5, 3]
    assert probs(root_row(make(seq, min_ngram=1), 3)) == pytest.approx({7: 2 / 3, 2: 1 / 3})
    row = root_row(make(seq, min_ngram=2, max_ngram=3, fallback_prob=1e-4), 3)
    # Fallback: one finite entry, the most frequent committed token (3), at log(fallback_prob).
    assert probs(row) == pytest.approx({3: 1e-4})


def test_fallback_row_when_nothing_matches():
    drafter = make([5, 6, 6, 9])  # 9 never occurred before the end: no continuation known
    row = root_row(drafter, 9)
    assert torch.isfinite(row).sum() == 1
    assert int(row.argmax()) == 6  # the most frequent token
    assert float(row[6]) == pytest.approx(math.log(1e-6))
    assert row.shape == (V,)


def test_fallback_ties_go_to_the_lower_id():
    assert int(root_row(make([7, 4, 7, 4, 11]), 11).argmax()) == 4


def test_commit_updates_the_index():
    drafter = make([1, 2, 3])
    assert torch.isfinite(root_row(drafter, 3)).sum() == 1  # fallback only: 3 is new
    drafter.commit(torch.tensor([4, 3]))  # committed: 1 2 3 4 3 -> "3" was followed by 4
    assert probs(root_row(drafter, 3)) == pytest.approx({4: 1.0})
    drafter.commit(torch.tensor([5, 1, 2, 3]))  # "1 2 3" was followed by 4
    assert probs(root_row(drafter, 3)) == pytest.approx({4: 1.0})


def test_commit_refreshes_lookups_of_the_same_suffix():
    drafter = make([1, 2, 3, 4, 3], max_ngram=1)
    assert probs(root_row(drafter, 3)) == pytest.approx({4: 1.0})
    drafter.commit(torch.tensor([5, 3]))  # now "3" was followed by 4 and 5
    assert probs(root_row(drafter, 3)) == pytest.approx({4: 0.5, 5: 0.5})


def test_begin_forgets_the_previous_generation():
    drafter = make([1, 2, 3, 4, 3])
    drafter.begin(torch.tensor([8, 9, 3]))
    assert torch.isfinite(root_row(drafter, 3)).sum() == 1


def test_tree_paths_are_context():
    # Committed text ends in 3; path 3 -> 1 -> 2 makes the query "... 1 2", seen before 5, 7, 5
    # (a lone "2" was also followed by 9, so the unigram would give a different answer).
    drafter = make([1, 2, 5, 6, 1, 2, 7, 0, 2, 9, 1, 2, 5, 3])
    tree = chain_tree(3, [1, 2])
    rows = drafter.expand(tree, torch.tensor([0, 1, 2]))
    assert probs(rows[2]) == pytest.approx({5: 2 / 3, 7: 1 / 3})
    # The depth-1 node (token 1) sees suffix "5 3 1" -> "3 1" unseen -> "1" (followed by 2 x3).
    assert probs(rows[1]) == pytest.approx({2: 1.0})
    # Sibling branches get their own contexts within one expand.
    tree = tree.add_nodes(torch.tensor([0]), torch.tensor([6]), torch.tensor([-1.0]))
    rows = drafter.expand(tree, torch.tensor([2, 3]))
    assert probs(rows[0]) == pytest.approx({5: 2 / 3, 7: 1 / 3})
    assert probs(rows[1]) == pytest.approx({1: 1.0})  # "6" was followed by 1


def test_tree_tokens_are_not_indexed_as_occurrences():
    # The path contains "4 4"; only committed text counts, so "4" has no known continuation.
    drafter = make([1, 2, 4])
    rows = drafter.expand(chain_tree(4, [4]), torch.tensor([1]))
    assert torch.isfinite(rows[0]).sum() == 1 and float(rows[0].max()) < -10


def test_short_context_does_not_wrap_around():
    # 7 committed tokens, max_ngram=8: the whole committed text is the query's prefix, so the
    # bigram "1 2" (followed by 4) wins over the unigram "2" (followed by 4 and 1).
    drafter = make([3, 1, 2, 4, 2, 1, 2], max_ngram=8)
    assert probs(root_row(drafter, 2)) == pytest.approx({4: 1.0})


def test_rows_never_all_neg_inf_and_shape_matches_target_vocab():
    drafter = make([0, 1, 2])
    tree = chain_tree(2, [30, 31])
    rows = drafter.expand(tree, torch.tensor([0, 1, 2]))
    assert rows.shape == (3, V) and rows.dtype == torch.float32
    assert bool(torch.isfinite(rows).any(dim=1).all())
    assert not bool(torch.isnan(rows).any()) and bool((rows <= 0).all())


@given(
    seq=st.lists(st.integers(0, 3), min_size=1, max_size=40),
    path=st.lists(st.integers(0, 3), max_size=4),
    max_ngram=st.integers(1, 4),
    min_ngram=st.integers(1, 4),
    decay=st.sampled_from([1.0, 0.9, 0.5]),
    split=st.integers(0, 40),
)
def test_index_agrees_with_literal_scan(seq, path, max_ngram, min_ngram, decay, split):
    """Fast incremental index == slow scan of the committed text, whatever the commit chunks."""
    min_ngram = min(min_ngram, max_ngram)
    split = max(1, min(split, len(seq)))
    drafter = make(seq[:split], max_ngram=max_ngram, min_ngram=min_ngram, decay=decay)
    if split < len(seq):
        drafter.commit(torch.tensor(seq[split:]))
    row = drafter.expand(chain_tree(seq[-1], path), torch.tensor([len(path)]))[0]
    ref = reference_distribution(seq, path, max_ngram, min_ngram, decay)
    if ref is None:
        assert torch.isfinite(row).sum() == 1
        assert float(row.max()) == pytest.approx(math.log(1e-6))
    else:
        assert probs(row) == pytest.approx(ref[1], rel=1e-5)


# ---------------------------------------------------------------------- options
@pytest.mark.parametrize(
    "options, bad",
    [
        ({"min_ngram": 0}, "min_ngram"),
        ({"max_ngram": 1, "min_ngram": 2}, "max_ngram"),
        ({"decay": 0.0}, "decay"),
        ({"decay": 1.5}, "decay"),
        ({"fallback_prob": 0.0}, "fallback_prob"),
        ({"max_ngram": "3"}, "max_ngram"),
        ({"ngram": 3}, "ngram"),
    ],
)
def test_bad_options_name_the_option(options, bad):
    target = tiny_model(vocab_size=V)
    with pytest.raises(OptionError, match=bad):
        specframe.SpecDecoder.build(target=target, drafter=("ngram", options))


def test_registered():
    assert "ngram" in specframe.available()["drafters"]


# ---------------------------------------------------------------------- lossless
# Tiny float64 models whose greedy output (from these repetitive prompts) falls into loops, so
# the n-gram drafter's guesses are actually accepted.
CASES = [("llama", 2, [5, 6, 7, 8, 9] * 4), ("gpt2", 1, [3, 4, 5] * 5)]
POLICY_OPTIONS = {"chain": {"gamma": 5}}
BUDGET = 30  # smaller than the default 60 to keep the file fast; trees still branch


def _policy_options(name: str) -> dict:
    """Options for a built-in ``name``: the overrides above, plus a smaller budget where there is one."""
    options = dict(POLICY_OPTIONS.get(name, {}))
    if not is_builtin("policies", name):
        return {}  # a third party's policy: its declared defaults
    fields = {f.name for f in dataclasses.fields(specframe.get_registry().get("policies", name).Options)}
    if "budget" in fields:
        options.setdefault("budget", BUDGET)
    return options
MAX_NEW = 48


def _greedy(model, prompt: list[int]) -> list[int]:
    ids = torch.tensor([prompt])
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW, do_sample=False,
        eos_token_id=None, pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist()


@pytest.fixture(scope="module")
def cases():
    """(model, prompt, reference greedy continuation) per case, built once."""
    out = []
    for arch, seed, prompt in CASES:
        model = tiny_model(arch, seed=seed, vocab_size=48, dtype=torch.float64)
        out.append((arch, model, prompt, _greedy(model, prompt)))
    return out


@pytest.mark.parametrize("policy", specframe.get_registry().names("policies"))
def test_lossless_with_every_policy(policy, cases):
    accepted = 0
    for arch, model, prompt, ref in cases:
        dec = specframe.SpecDecoder.build(
            target=model, drafter=("ngram", {}), policy=(policy, _policy_options(policy)),
        )
        out = dec.generate(torch.tensor(prompt), max_new_tokens=MAX_NEW, eos_token_id=None)
        print(f"ngram x {policy} on {arch}: tau={out.tau:.2f} delta={out.delta:.2f} steps={len(out.steps)}")
        assert out.tokens == ref, f"{policy} on {arch} diverged from greedy decoding"
        accepted += sum(s.accepted for s in out.steps)
    # The drafter must actually contribute, or this test would pass with any junk drafter.
    assert accepted > 0


def test_lossless_with_eos_and_options(cases):
    arch, model, prompt, ref = cases[0]
    eos = ref[20]
    dec = specframe.SpecDecoder.build(
        target=model, drafter=("ngram", {"max_ngram": 4, "min_ngram": 2, "decay": 0.8}),
        policy=("chain", {"gamma": 3}),
    )
    out = dec.generate(torch.tensor(prompt), max_new_tokens=MAX_NEW, eos_token_id=eos)
    assert out.tokens == ref[: ref.index(eos) + 1]
    assert out.stopped_at_eos


@given(
    seq=st.lists(st.integers(0, 9), min_size=1, max_size=40),
    layers=st.lists(st.lists(st.integers(0, 9), min_size=1, max_size=3), min_size=1, max_size=3),
    k=st.integers(1, 12), vocab=st.sampled_from([4, 10, 32]), max_ngram=st.integers(1, 3),
)
def test_expand_top_equals_the_selection_over_the_dense_rows(seq, layers, k, vocab, max_ngram):
    """The sparse fast path against the slow obvious one: topk_per_row over ``expand``'s rows,
    with ties (frequency counts), ids beyond the vocabulary, k above the finite count and
    above the vocabulary."""
    target = type("T", (), {"vocab_size": vocab})()
    drafter = NgramDrafter(NgramDrafterOptions(max_ngram=max_ngram), target)
    drafter.begin(torch.tensor(seq))
    tree, frontier = DraftTree.root(seq[-1]), [0]
    for tokens in layers:
        nodes = torch.tensor(frontier)
        want = specframe.topk_per_row(drafter.expand(tree, nodes), k)
        got = drafter.expand_top(tree, nodes, k)
        for g, w in zip(got, want):
            assert g.shape == w.shape and torch.equal(g, w), (g, w)
        parents = torch.tensor(frontier).repeat_interleave(len(tokens))
        start = len(tree)
        tree = tree.add_nodes(parents, torch.tensor(tokens * len(frontier)), tree.logp[parents] - 1.0)
        frontier = list(range(start, len(tree)))


@given(counts=st.lists(st.integers(1, 60), min_size=1, max_size=40),
       ages=st.lists(st.integers(0, 200), min_size=40, max_size=40), decay=st.sampled_from([1.0, 0.9, 0.5]))
def test_ranked_rows_are_torchs_log_softmax_in_float32(counts, ages, decay):
    """The plain-float ranking equals the tensor computation it replaced (float64 log-sum-exp,
    rounded once to float32), value for value and in the same order."""
    drafter = make([1, 2, 3], decay=decay)
    logw = [math.log(c) + a * math.log(decay) for c, a in zip(counts, ages)]
    toks = list(range(len(logw)))
    w = torch.tensor(logw, dtype=torch.float64)
    want = (w - torch.logsumexp(w, 0)).float().tolist()
    pairs = sorted((-v, t) for v, t in zip(want, toks))
    assert drafter._rank(toks, logw) == ([-v for v, _ in pairs], [t for _, t in pairs])
