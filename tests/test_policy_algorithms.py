"""Each built-in policy's own algorithm against a hand-checkable example or a slow reference."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import specframe
from specframe.decode.engine import make_plugin
from specframe.options import OptionError
from specframe.testing.synthetic import SyntheticDrafter, make_session, paths_of
from specframe.selection import topk_per_row
from specframe.selection import top_indices
from specframe.strategies.sequoia import choose_size_depth, optimal_paths, sequoia_table
from specframe.strategies.static import MC_SIM_7B_63


def run(name, drafter, budget=None, root=0, **opts):
    """(tree, session, drafted paths without the root token) for one build."""
    policy = make_plugin("policies", (name, opts))
    session = make_session(drafter, root_token=root)
    tree = policy.build(session, budget or policy.max_budget)
    tree.check_valid(budget or policy.max_budget)
    return tree, session, [p[1:] for p in paths_of(tree, range(len(tree)))]


def rank_paths(tree) -> set[tuple[int, ...]]:
    """Each drafted node's path of recorded sibling ranks (the static-tree notation)."""
    return {tuple(int(tree.ranks[j]) for j in tree.path_to(i)[1:]) for i in range(1, len(tree))}


def table_drafter(rows: dict, vocab: int, default=None) -> SyntheticDrafter:
    """Rows given as probabilities per drafted path (root token excluded); others uniform."""
    def source(path):
        probs = rows.get(path[1:], default if default is not None else [1.0] * vocab)
        return torch.tensor(probs, dtype=torch.float64).log()
    return SyntheticDrafter(vocab, source)


def ranked(row: list[float]) -> list[int]:
    """Tokens by descending log-prob, lower id first on ties (the documented tie rule)."""
    return sorted(range(len(row)), key=lambda w: (-row[w], w))


# ---------------------------------------------------------------------------- helpers
@given(rows=st.integers(1, 6), vocab=st.integers(1, 40), k=st.integers(1, 45),
       levels=st.integers(1, 4), seed=st.integers(0, 2**31 - 1), inf_rate=st.sampled_from((0.0, 0.5)))
def test_topk_per_row_matches_a_sorted_reference(rows, vocab, k, levels, seed, inf_rate):
    gen = torch.Generator().manual_seed(seed)
    logp = torch.randint(levels, (rows, vocab), generator=gen).float()
    logp[torch.rand(rows, vocab, generator=gen) < inf_rate] = -math.inf
    values, tokens, ranks = topk_per_row(logp, k)
    for r in range(rows):
        row = logp[r].tolist()
        expect = ranked(row)[: min(k, vocab)]
        assert tokens[r].tolist() == expect
        assert values[r].tolist() == [row[w] for w in expect]
        assert ranks[r].tolist() == list(range(len(expect)))


def test_top_indices_prefers_lower_index_on_ties_and_skips_inf():
    scores = torch.tensor([-1.0, 0.0, -1.0, -math.inf, 0.0, -2.0], dtype=torch.float64)
    assert top_indices(scores, 4).tolist() == [1, 4, 0, 2]
    assert top_indices(scores, 10).tolist() == [1, 4, 0, 2, 5]


# ---------------------------------------------------------------------------- EAGLE
def eagle_reference(drafter, root, N, K, D):
    """EAGLE-2/3 topK_genrate written literally over Python lists (slow).

    Pool entries are (score, path) in pool order; TopK over pool entries breaks score ties by
    pool order, per-row TopK by lower token id. Always drafts D + 1 layers.
    """
    pool: list[tuple[float, tuple]] = []

    def children(parent_score, path):
        row = drafter.row((root,) + path).tolist()
        return [(parent_score + row[w], path + (w,)) for w in ranked(row)[:K] if row[w] != -math.inf]

    def topk(entries, k):  # entries: list of pool indices
        return sorted(entries, key=lambda i: (-pool[i][0], i))[:k]

    pool += children(0.0, ())
    frontier = topk(list(range(len(pool))), K)
    for _ in range(D):
        start = len(pool)
        for i in frontier:
            pool += children(*pool[i])
        frontier = topk(list(range(start, len(pool))), K)
    return {pool[i][1] for i in topk(list(range(len(pool))), N - 1)} | {()}


def test_eagle_hand_example():
    # Root: p = .5 .3 .15 .05 -> top-2 {0, 1}. Children of 0: .45 (0,0) .025 (0,1);
    # children of 1: .12 (1,0) .12 (1,1) (a tie: lower token first). Pool by p:
    # (0,) .5 > (0,0) .45 > (1,) .3 > (1,0) .12 = (1,1) .12 > (0,1) .025.
    rows = {(): [0.5, 0.3, 0.15, 0.05], (0,): [0.9, 0.05, 0.03, 0.02], (1,): [0.4, 0.4, 0.1, 0.1]}
    expected = {4: {(0,), (0, 0), (1,)}, 5: {(0,), (0, 0), (1,), (1, 0)},
                6: {(0,), (0, 0), (1,), (1, 0), (1, 1)}, 7: {(0,), (0, 0), (1,), (1, 0), (1, 1), (0, 1)}}
    for budget, paths in expected.items():
        tree, session, got = run("eagle", table_drafter(rows, 4), budget=budget, top_k=2, depth=1)
        assert set(got) == paths | {()}
        assert session.draft_forwards == 2
        assert got == sorted(got, key=len), "re-ranked nodes must stay in pool (layer-major) order"


# Budgets up to the policy's own N = 60: a larger engine limit does not raise it (the
# reference, which takes the limit as N, would then keep more nodes).
@given(vocab=st.integers(2, 128), top_k=st.integers(1, 6), depth=st.integers(0, 4), budget=st.integers(2, 60),
       mode=st.sampled_from(("random", "ties", "one_hot")), temperature=st.sampled_from((0.1, 1.0, 10.0)),
       seed=st.integers(0, 2**31 - 1))
def test_eagle_matches_reference(vocab, top_k, depth, budget, mode, temperature, seed):
    drafter = SyntheticDrafter(vocab, mode=mode, temperature=temperature, levels=2, seed=seed)
    tree, session, got = run("eagle", drafter, budget=budget, top_k=top_k, depth=depth)
    assert set(got) == eagle_reference(drafter, 0, budget, top_k, depth)
    # D + 1 forwards, except that layers deeper than N - 1 cannot be kept and are skipped.
    assert session.draft_forwards == min(depth + 1, budget - 1)


# ---------------------------------------------------------------------------- static
def test_static_default_is_eagle1_mc_sim_7b_63():
    drafter = SyntheticDrafter(64, temperature=2.0, seed=5)
    tree, session, paths = run("static", drafter)
    assert len(tree) == 26 and tree.width_per_depth() == [1, 4, 8, 8, 3, 2]
    assert session.draft_forwards == 5
    # The rank path of every node (from the recorded ranks) is exactly EAGLE's list.
    assert rank_paths(tree) == set(MC_SIM_7B_63) and len(MC_SIM_7B_63) == 25
    # And each node's token is that rank in its parent's row.
    for i in range(1, len(tree)):
        parent_path = paths[int(tree.parents[i])]
        assert int(tree.tokens[i]) == ranked(drafter.row((0,) + parent_path).tolist())[int(tree.ranks[i])]


def test_static_custom_choices_budget_and_one_hot():
    choices = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]]
    drafter = SyntheticDrafter(32, seed=2)
    tree, session, _ = run("static", drafter, choices=choices)
    assert tree.width_per_depth() == [1, 3, 3, 1] and session.draft_forwards == 3
    # A smaller engine budget keeps the first paths in (length, path) order.
    tree, session, _ = run("static", drafter, budget=5, choices=choices)
    assert tree.width_per_depth() == [1, 3, 1] and session.draft_forwards == 2
    # Ranks with a -inf draft log-prob are dropped with their descendants.
    tree, _, _ = run("static", SyntheticDrafter(32, mode="one_hot", seed=2), choices=choices)
    assert tree.width_per_depth() == [1, 1, 1, 1]


# ---------------------------------------------------------------------------- OPT-Tree
def test_opt_tree_stops_when_the_gain_is_at_most_the_threshold():
    flat = [0.5, 0.3, 0.2]
    # n = 3. Layer 1: .5 .3 .2, Esub = 1.0 (gain 1.0 > .5, go on). Layer 2 best children:
    # .25 .15 .15, Esub = .5 + .3 + .25 = 1.05 (gain .05 <= .5: stop after 2 forwards).
    tree, session, paths = run("opt-tree", table_drafter({}, 3, flat), budget=4, threshold=0.5)
    assert session.draft_forwards == 2 and set(paths) == {(), (0,), (1,), (0, 0)}
    # With threshold .04 the .05 gain continues; layer 3 adds nothing to the best 3 (gain 0).
    tree, session, paths = run("opt-tree", table_drafter({}, 3, flat), budget=4, threshold=0.04)
    assert session.draft_forwards == 3 and set(paths) == {(), (0,), (1,), (0, 0)}
    tree, session, _ = run("opt-tree", table_drafter({}, 3, flat), budget=4, max_depth=1)
    assert session.draft_forwards == 1 and tree.width_per_depth() == [1, 3]


def test_opt_tree_confident_drafter_goes_deep_until_gain_falls():
    # Rows .9 .05 .05, n = 3. Esub (best 3 over everything drafted): layer 1 -> 1.0 (gain 1.0);
    # layer 2 adds .81 -> .9 + .81 + .05 = 1.76 (gain .76); layer 3 adds .729 -> 2.439 (gain
    # .679); layer 4's best .6561 < .729 leaves Esub unchanged (gain 0 <= .5): stop after 4
    # forwards. The tree is the chain .9, .81, .729.
    tree, session, paths = run("opt-tree", table_drafter({}, 3, [0.9, 0.05, 0.05]), budget=4)
    assert session.draft_forwards == 4
    assert set(paths) == {(), (0,), (0, 0), (0, 0, 0)}


# ---------------------------------------------------------------------------- Sequoia
def ordered_trees(m: int, depth: int, width: int):
    """All ordered trees of exactly m nodes, depth <= depth, <= width children per node."""
    if m == 1:
        yield ()
        return
    if depth == 0:
        return
    yield from forests(m - 1, depth - 1, width, width)


def forests(n: int, depth: int, width: int, slots: int):
    if n == 0:
        yield ()
        return
    if slots == 0:
        return
    for first in range(1, n + 1):
        for tree in ordered_trees(first, depth, width):
            for rest in forests(n - first, depth, width, slots - 1):
                yield (tree,) + rest


def expected_tokens(tree, a) -> float:
    return 1.0 + sum(a[k] * expected_tokens(child, a) for k, child in enumerate(tree))


def paths_value(paths, a) -> float:
    return 1.0 + sum(math.prod(a[r] for r in p) for p in paths)


@given(a=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=4).filter(lambda a: sum(a) <= 1.0))
def test_sequoia_dp_matches_brute_force(a):
    a = tuple(a)
    table = sequoia_table(a, 7, 4)
    for m in range(1, 8):
        for depth in range(0, 5):
            values = [expected_tokens(t, a) for t in ordered_trees(m, depth, len(a))]
            best = max(values) if values else -math.inf
            assert math.isclose(table.best[m, depth], best, rel_tol=1e-12, abs_tol=1e-12) or (
                best == -math.inf and table.best[m, depth] == -math.inf)
            if values:
                paths = optimal_paths(table, m, depth)
                assert len(paths) == m - 1 and max((len(p) for p in paths), default=0) <= depth
                assert math.isclose(paths_value(paths, a), best, rel_tol=1e-12, abs_tol=1e-12)


def test_sequoia_hardware_aware_choice_hand_example():
    # a = (.8,): only chains. E[tokens] for a chain of depth d = sum .8^i, i = 0..d.
    # Cost (d * 1 + 10 + 2 (m - 1)) / E: d=1 13/1.8=7.22, d=2 16/2.44=6.56, d=3 19/2.952=6.44,
    # d=4 22/3.3616=6.54 -> m = 4, d = 3.
    table = sequoia_table((0.8,), 8, 6)
    times = tuple(10.0 + 2.0 * (m - 1) for m in range(1, 9))
    assert choose_size_depth(table, 8, 6, 1.0, times) == (4, 3)
    tree, session, paths = run("sequoia", SyntheticDrafter(16, seed=1), budget=8, acceptance=[0.8],
                               max_depth=6, draft_time=1.0, target_times=list(times))
    assert rank_paths(tree) == {(0,), (0, 0), (0, 0, 0)} and session.draft_forwards == 3


def test_sequoia_builds_the_dp_shape_and_respects_budget():
    policy = make_plugin("policies", "sequoia")
    for budget in (2, 10, 60):
        shape = policy.shape(budget)
        assert len(shape) == budget - 1
        tree, _, _ = run("sequoia", SyntheticDrafter(64, seed=4), budget=budget)
        assert rank_paths(tree) == set(shape)


# ---------------------------------------------------------------------------- options
BAD_OPTIONS = [
    ("talon", {"mu": 0.0}, "mu"), ("talon", {"mu": 1.5}, "mu"), ("talon", {"budget": 1}, "budget"),
    ("talon", {"top_k": 0}, "top_k"), ("talon", {"init_layers": -1}, "init_layers"),
    ("eagle", {"budget": 1}, "budget"), ("eagle", {"top_k": 0}, "top_k"), ("eagle", {"depth": -1}, "depth"),
    ("opt-tree", {"budget": 0}, "budget"), ("opt-tree", {"threshold": -0.1}, "threshold"),
    ("opt-tree", {"max_depth": 0}, "max_depth"),
    ("sequoia", {"budget": 1}, "budget"), ("sequoia", {"acceptance": [1.2]}, "acceptance"),
    ("sequoia", {"acceptance": [0.6, 0.6]}, "acceptance"), ("sequoia", {"acceptance": []}, "acceptance"),
    ("sequoia", {"max_depth": 0}, "max_depth"), ("sequoia", {"target_times": [1.0, -2.0]}, "target_times"),
    ("static", {"choices": []}, "choices"), ("static", {"choices": [[0, 1]]}, "choices"),
    ("static", {"choices": [[0], [-1]]}, "choices"), ("static", {"choices": [[0], []]}, "choices"),
    ("static", {"choices": [[0], [0]]}, "choices"), ("static", {"choices": [["a"]]}, "choices"),
    ("static", {"choices": "nope"}, "choices"), ("static", {"choices": [[0], [1.5]]}, "choices"),
    ("talon", {"mu": "high"}, "mu"), ("talon", {"bugdet": 60}, "budget"),
]


@pytest.mark.parametrize("name,options,option", BAD_OPTIONS)
def test_bad_options_name_the_option(name, options, option):
    with pytest.raises(OptionError, match=f"'{option}'|{option}"):
        make_plugin("policies", (name, options))


def test_bad_options_fail_through_the_public_api():
    from specframe.testing.models import tiny_model

    with pytest.raises(OptionError, match="'mu'.*\\(0, 1\\]"):
        specframe.SpecDecoder.build(target=tiny_model(vocab_size=32), policy=("talon", {"mu": 0}))


# ---------------------------------------------------------------------------- engine
@pytest.mark.parametrize("name", ["talon", "eagle", "static", "opt-tree", "sequoia"])
def test_exact_draft_always_gets_its_first_token_accepted(name):
    # With a draft identical to the target, the root's top-ranked child (kept by every one of
    # these policies) is the target's argmax, so every step accepts >= 1 drafted token —
    # unless the draft's cache went stale across steps (e.g. a re-indexed tree at commit).
    from specframe.testing.models import tiny_model

    model = tiny_model("llama", seed=3, vocab_size=64, hidden=32, layers=2)
    dec = specframe.SpecDecoder.build(target=model, drafter=("model", {"model": copy.deepcopy(model)}),
                                      policy=name, verifier="greedy")
    out = dec.generate(torch.tensor([[5, 17, 9, 33, 2, 40]]), max_new_tokens=20, eos_token_id=None)
    assert all(s.accepted >= 1 for s in out.steps), [s.accepted for s in out.steps]


# ---------------------------------------------------------------------------- chain
@pytest.mark.parametrize("opts", [{"gamma": 4}, {"gamma": "auto"}, {"gamma": 4, "sample": True, "seed": 1}],
                         ids=["fixed", "auto", "sampled"])
def test_chain_stops_before_a_row_with_no_finite_entry(opts):
    """A drafter with nothing to offer after token 2 (all -inf) ends the chain there, as talon,
    eagle and static stop: no -inf node is drafted (the engine refuses such a tree)."""
    vocab = 4
    nothing = [0.0] * vocab  # log(0) = -inf everywhere
    drafter = table_drafter({(): [0.0, 0.0, 1.0, 0.0], (2,): nothing, (2, 0): nothing}, vocab, default=nothing)
    tree, _session, paths = run("chain", drafter, budget=5, **opts)
    assert paths == [(), (2,)]
    assert torch.isfinite(tree.logp).all()
    if opts.get("sample"):
        assert tree.draft_probs.shape == (2, vocab) and not tree.draft_probs[1].any()


def test_chain_with_nothing_to_draft_is_a_plain_step():
    drafter = table_drafter({}, 4, default=[0.0] * 4)
    tree, _session, paths = run("chain", drafter, budget=5, gamma=4)
    assert paths == [()]
