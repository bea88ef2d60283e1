"""``topk_per_row`` beside an obviously-correct reference: a full sort by (value, token id)."""

from __future__ import annotations

import math

import torch
from hypothesis import given
from hypothesis import strategies as st

import specframe

NEG = -math.inf


def reference_topk(row: list[float], k: int) -> tuple[list[float], list[int]]:
    """Higher value first, lower token id on ties; -inf entries last, by id."""
    order = sorted(range(len(row)), key=lambda i: (-row[i], i))[:k]
    return [row[i] for i in order], order


# Few distinct values (many ties) and many -inf entries (sparse rows, as an n-gram table gives).
VALUES = st.sampled_from([NEG, NEG, NEG, NEG, -3.0, -1.0, -0.5, 0.0])


@given(st.integers(1, 24).flatmap(lambda vocab: st.tuples(
    st.lists(st.lists(VALUES, min_size=vocab, max_size=vocab), min_size=1, max_size=4),
    st.integers(1, vocab))))
def test_topk_per_row_equals_the_sorting_reference(case):
    rows, k = case
    values, tokens, ranks = specframe.topk_per_row(torch.tensor(rows), k)
    for r, row in enumerate(rows):
        want_values, want_tokens = reference_topk(row, k)
        assert tokens[r].tolist() == want_tokens
        assert values[r].tolist() == want_values
    assert ranks.tolist() == [list(range(k))] * len(rows)


def test_a_sparse_row_of_a_large_vocabulary_fills_with_the_lowest_neginf_ids():
    row = torch.full((1, 49152), NEG)
    row[0, 40000], row[0, 3], row[0, 7] = -0.1, -2.0, -2.0
    values, tokens, _ = specframe.topk_per_row(row, 6)
    assert tokens.tolist() == [[40000, 3, 7, 0, 1, 2]]
    assert values[0, :3].tolist() == [row[0, 40000].item(), -2.0, -2.0] and torch.isneginf(values[0, 3:]).all()


@given(scores=st.lists(st.sampled_from([0.0, -1.0, -2.5, 3.0, -math.inf, math.inf, math.nan]) | st.floats(-5, 5),
                       max_size=40),
       k=st.integers(0, 45))
def test_host_top_indices_are_top_indices(scores, k):
    """The host twin a policy growing its tree in lists uses: the same indices, ties to the lower
    index, non-finite scores never returned."""
    from specframe.selection import top_host_indices, top_indices

    expected = top_indices(torch.tensor(scores, dtype=torch.float64), k).tolist()
    assert top_host_indices(scores, k) == expected
