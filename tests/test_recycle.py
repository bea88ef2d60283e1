"""The ``recycle`` drafter (Token Recycling): the adjacency table against a literal reference,
the accepted path winning shared tokens, expand_top against the selection over expand's rows
(ties and widths past the table's included), hot and cold start, and the engine feeding it."""

from __future__ import annotations

import math

import torch
from hypothesis import given
from hypothesis import strategies as st

import specframe
from specframe.drafters.recycle import RecycleDrafter, RecycleDrafterOptions, canonical_rows, reference_table
from specframe.decode.engine import make_plugin
from specframe.interfaces import wants_prompt_logits
from specframe.selection import topk_per_row
from specframe.testing.fixtures import tiny_target

VOCAB = 24


class _Target:
    """Just what the drafter reads of a target."""

    vocab_size = VOCAB
    device = torch.device("cpu")


def _drafter(**options) -> RecycleDrafter:
    drafter = RecycleDrafter(RecycleDrafterOptions(**options), _Target())
    drafter.begin(torch.tensor([0]))
    return drafter


def _tree(tokens: list[int], parents: list[int]) -> specframe.DraftTree:
    tree = specframe.DraftTree.root(tokens[0])
    for token, parent in zip(tokens[1:], parents[1:]):
        tree = tree.add_nodes(torch.tensor([parent]), torch.tensor([token]), tree.logp[parent:parent + 1] - 1.0)
    return tree


@st.composite
def _verified_trees(draw, ties: bool = False):
    """A random tree of few distinct tokens (shared tokens), its logits and an accepted path."""
    n = draw(st.integers(1, 9))
    parents = [-1] + [draw(st.integers(0, i - 1)) for i in range(1, n)]
    tokens = [draw(st.integers(0, 5)) for _ in range(n)]
    seed = draw(st.integers(0, 2**16))
    logits = torch.randn(n, VOCAB, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    if ties:
        logits = logits.round()  # many equal logits, inside and across the top k
    path, u = [], draw(st.integers(0, n - 1))
    while u >= 0:
        path.append(u)
        u = parents[u]
    return tokens, parents, logits, path[::-1]


def _row(drafter: RecycleDrafter, token: int) -> dict[int, float]:
    ids, logp = drafter.ids[token], drafter.logp[token]
    return {int(i): float(v) for i, v in zip(ids, logp) if math.isfinite(float(v))}


@given(steps=st.lists(_verified_trees(), min_size=1, max_size=3), k=st.integers(1, 6))
def test_table_equals_the_literal_reference(steps, k):
    drafter = _drafter(k=k, fallback_prob=0.0)
    for tokens, parents, logits, path in steps:
        drafter.commit(torch.tensor([1]), torch.tensor(path), tree=_tree(tokens, parents), target_logits=logits)
    want = reference_table([(t, lg, p) for t, _, lg, p in steps], k)
    for token in range(VOCAB):
        got = _row(drafter, token)
        assert got.keys() == want.get(token, {}).keys(), f"token {token}"
        for nxt, value in got.items():
            assert math.isclose(value, want[token][nxt], abs_tol=1e-5), f"token {token} -> {nxt}"


def test_the_accepted_path_wins_a_shared_token():
    drafter = _drafter(k=2)
    # Token 3 at node 1 (rejected) and node 2 (accepted); node 1's later index would win alone.
    tree = _tree([5, 3, 3], [-1, 0, 0])
    logits = torch.full((3, VOCAB), -5.0)
    logits[1, 7] = logits[2, 9] = 5.0
    drafter.commit(torch.tensor([3, 1]), torch.tensor([0, 2]), tree=tree, target_logits=logits)
    assert max(_row(drafter, 3), key=_row(drafter, 3).get) == 9
    drafter.commit(torch.tensor([3, 1]), torch.tensor([0, 1]), tree=tree, target_logits=logits)
    assert max(_row(drafter, 3), key=_row(drafter, 3).get) == 7


def test_the_prompt_writes_rows_and_the_later_position_wins():
    drafter = RecycleDrafter(RecycleDrafterOptions(k=1), _Target())
    logits = torch.full((3, VOCAB), -5.0)
    logits[0, 4] = logits[1, 6] = logits[2, 8] = 5.0
    drafter.begin(torch.tensor([2, 1, 2, 9]), target_logits=logits)
    assert _row(drafter, 2).keys() == {8} and _row(drafter, 1).keys() == {6}
    fallback = _row(drafter, 9)  # never written: the fallback, the token itself
    assert fallback.keys() == {9} and math.isclose(fallback[9], math.log(1e-6), rel_tol=1e-6)
    assert all(not math.isfinite(float(v)) for v in _drafter(fallback_prob=0.0).logp[9])


@given(steps=st.lists(_verified_trees(ties=True), min_size=0, max_size=2), k=st.integers(1, 6),
       width=st.integers(1, 12), nodes=st.lists(st.integers(0, 8), min_size=1, max_size=5))
def test_expand_top_equals_the_selection_over_expand(steps, k, width, nodes):
    drafter = _drafter(k=k)
    for tokens, parents, logits, path in steps:
        drafter.commit(torch.tensor([1]), torch.tensor(path), tree=_tree(tokens, parents), target_logits=logits)
    tree = _tree(list(range(9)), [-1] + list(range(8)))
    index = torch.tensor(nodes)
    want = topk_per_row(drafter.expand(tree, index), width)
    got = drafter.expand_top(tree, index, width)
    for name, g, w in zip(("values", "ids", "ranks"), got, want):
        assert torch.equal(g, w), f"{name}: {g} vs {w}"


def test_a_vocabulary_narrower_than_the_stored_width_drafts_valid_rows():
    small = type("_Small", (_Target,), {"vocab_size": 12})()
    drafter = RecycleDrafter(RecycleDrafterOptions(k=4), small)
    drafter.begin(torch.tensor([0]))
    tree = _tree([3, 5, 7], [-1, 0, 1])
    logits = torch.randn(3, 12, generator=torch.Generator().manual_seed(3))
    drafter.commit(torch.tensor([5]), torch.tensor([0, 1]), tree=tree, target_logits=logits)
    assert int(drafter.ids.max()) < 12, "a row names an id outside the vocabulary"
    index = torch.tensor([0, 1, 2])
    want = topk_per_row(drafter.expand(tree, index), 12)
    for name, g, w in zip(("values", "ids", "ranks"), drafter.expand_top(tree, index, 12), want):
        assert torch.equal(g, w), f"{name}: {g} vs {w}"


def test_canonical_rows_orders_ties_by_id_and_fills_the_lowest_free_ids():
    ids = torch.tensor([[5, 2, 7, 1]])
    logp = torch.tensor([[-1.0, -1.0, -math.inf, -0.5]])
    got_ids, got_logp = canonical_rows(ids, logp, 5, VOCAB)
    assert got_ids.tolist() == [[1, 2, 5, 0, 3]]
    assert got_logp.tolist() == [[-0.5, -1.0, -1.0, -math.inf, -math.inf]]


def test_hot_start_keeps_the_table_and_cold_start_empties_it():
    target = specframe.TargetModel(tiny_target())
    prompt = [4, 9, 12, 30, 2, 17, 9, 12]
    for cold in (False, True):
        dec = specframe.SpecDecoder.build(target=target, drafter=("recycle", {"cold_start": cold}), policy="talon")
        assert dec.drafter.persistent_state is (not cold)
        dec.generate(prompt, max_new_tokens=12, eos_token_id=None)
        learned = dec.drafter.logp.clone()
        dec.drafter.begin(torch.tensor([7]))
        assert torch.equal(dec.drafter.logp, learned) is (not cold)


def test_the_engine_feeds_every_tree_node_the_last_step_included():
    model = tiny_target()
    dec = specframe.SpecDecoder.build(target=specframe.TargetModel(model), drafter="recycle",
                                      policy=("talon", {"budget": 8}))
    views = []
    prompt = [4, 9, 12, 30, 2]
    out = dec.generate(prompt, max_new_tokens=10, eos_token_id=None, on_step=views.append)
    last = views[-1]
    committed = prompt + out.tokens[: len(out.tokens) - last.stats.emitted]
    ref = specframe.TargetModel(model)
    ref.reset()
    ref.causal_forward(torch.tensor(committed[:-1]))
    logits = ref.tree_forward(last.tree.tokens, last.tree.positions(len(committed)), last.tree.ancestor_mask()).logits[0]
    path = last.path
    token = int(last.tree.tokens[path[-1]])  # the deepest accepted node was written last
    want = torch.topk(torch.log_softmax(logits[path[-1]], -1), 8)
    row = _row(dec.drafter, token)
    assert row.keys() == set(want.indices.tolist())
    assert all(math.isclose(row[i], v, abs_tol=1e-5) for i, v in zip(want.indices.tolist(), want.values.tolist()))


@given(seed=st.integers(0, 2**16), rows=st.integers(1, 5), k=st.integers(1, 8), blocks=st.integers(1, 80),
       ties=st.booleans())
def test_blockwise_top_k_equals_torch_topk(seed, rows, k, blocks, ties):
    from specframe.drafters.recycle import BLOCK, top_k

    logits = torch.randn(rows, blocks * BLOCK + (seed % 2), generator=torch.Generator().manual_seed(seed))
    if ties:
        logits = (logits * 4).round()
    values, ids = top_k(logits, k)
    want = torch.topk(logits, k, dim=-1)
    assert torch.equal(values, want.values)
    assert torch.equal(logits.gather(1, ids), values) and all(len(set(r)) == k for r in ids.tolist())
    if not ties:
        assert torch.equal(ids, want.indices)


def test_without_prompt_rows_the_prefill_skips_the_prompts_logits_and_the_table_learns_only_from_steps():
    target = specframe.TargetModel(tiny_target())
    calls = []
    forward = target.causal_forward
    target.causal_forward = lambda *a, **kw: calls.append(kw.get("last_logits_only")) or forward(*a, **kw)
    prompt = [4, 9, 12, 30, 2, 17]
    for rows in (True, False):
        dec = specframe.SpecDecoder.build(target=target, drafter=("recycle", {"prompt_rows": rows}), policy="talon")
        assert wants_prompt_logits(dec.drafter) is rows
        seen = []
        begin = dec.drafter.begin
        dec.drafter.begin = lambda ids, **kw: seen.append(kw["target_logits"]) or begin(ids, **kw)
        out = dec.generate(prompt, max_new_tokens=6, eos_token_id=None)
        assert calls[-1] is (not rows) and (seen[0] is None) is (not rows)
        if not rows:  # a prompt token no step's tree held keeps its fallback row
            held = {int(t) for t in prompt[-1:] + out.tokens}
            untouched = [t for t in prompt[:-1] if t not in held]
            fresh = RecycleDrafter(RecycleDrafterOptions(), target)
            fresh.begin(torch.tensor([0]))
            assert untouched and all(_row(dec.drafter, t) == _row(fresh, t) for t in untouched)


def test_a_hybrid_asks_for_prompt_logits_only_for_a_part_that_reads_them():
    target = specframe.TargetModel(tiny_target())
    ask = lambda parts: wants_prompt_logits(make_plugin("drafters", ("hybrid", {"drafters": parts}), target))  # noqa: E731
    assert ask(["ngram", "recycle"]) and not ask(["ngram", ["recycle", {"prompt_rows": False}]])
    assert not ask(["ngram"])
