"""Worked examples of the methods that exist only as papers (issue 52, deliverable 3).

OPT-Tree (arXiv 2406.17276), Sequoia (arXiv 2402.12374), Token Recycling (arXiv 2408.08696) and
REST (arXiv 2311.08252) have no reference implementation that installs here, so each is checked
on a small input stated in, or derived directly from, the paper's own definitions, and the
expected outcome is computed in this file by hand or by a brute-force oracle written from the
paper, never taken from the code under test. Where the authors' repository fixes a detail the
paper leaves open (Token Recycling's tree template and update, REST's retrieval), the
repository was read at a commit named in the test. Traversal Verification's worked example is
in tests/test_traversal_verifier.py.

What already exists is not repeated: the Sequoia DP against its own recurrence over all trees
(tests/test_policy_algorithms.py), OPT-Tree's stopping rule by hand (same file), Token
Recycling's table against a literal reference (tests/test_recycle.py), the datastore's lookup
against brute force (tests/test_datastore.py).
"""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch

import specframe
from specframe.decode.engine import make_plugin
from specframe.drafters.datastore import build
from specframe.drafters.recycle import RecycleDrafter, RecycleDrafterOptions
from specframe.drafters.suffix import SuffixDrafter, SuffixDrafterOptions
from specframe.strategies.sequoia import optimal_paths, sequoia_table
from specframe.testing.synthetic import SyntheticDrafter, make_session


def build_tree(policy, drafter, budget: int, root: int = 0, **options) -> tuple[specframe.DraftTree, object]:
    """One tree of ``policy`` over ``drafter`` (checked valid), and its session."""
    plugin = make_plugin("policies", (policy, options))
    session = make_session(drafter, root_token=root)
    tree = plugin.build(session, budget)
    tree.check_valid(budget)
    return tree, session


def token_paths(tree: specframe.DraftTree) -> set[tuple[int, ...]]:
    """Each drafted node's tokens from the root's child down (the root's token excluded)."""
    tokens = tree.tokens.tolist()
    return {tuple(tokens[j] for j in tree.path_to(i)[1:]) for i in range(1, len(tree))}


def rank_to_token(tree: specframe.DraftTree) -> dict[tuple[int, ...], int]:
    """Each drafted node's rank path (sibling ranks from the root down) -> its token."""
    tokens, ranks = tree.tokens.tolist(), tree.ranks.tolist()
    return {tuple(ranks[j] for j in tree.path_to(i)[1:]): tokens[i] for i in range(1, len(tree))}


def closed_subtrees(children, n: int):
    """Every set of ``n`` nodes of a rooted candidate tree that holds each member's parent (the
    root, ``()``, implied and not counted), each once: walk a frontier, and either take its
    first node (its children join the frontier) or drop it for good."""
    def grow(frontier: list, need: int, taken: tuple):
        if need == 0:
            yield taken
            return
        if not frontier:
            return
        first, rest = frontier[0], frontier[1:]
        yield from grow(rest + list(children(first)), need - 1, taken + (first,))
        yield from grow(rest, need, taken)

    yield from grow(list(children(())), n, ())


# ---------------------------------------------------------------------------- OPT-Tree
#: OPT-Tree's draft model in the example: each drafted path's next-token distribution over a
#: vocabulary of 3, fixed and distinct (no two nodes of the example tie at a cut).
OPT_VOCAB, OPT_DEPTH = 3, 3


def opt_row(path: tuple[int, ...]) -> list[float]:
    """A fixed distribution per path (seeded by the path), rounded so ties cannot hide."""
    rng = random.Random(repr(path))
    raw = [rng.uniform(0.05, 1.0) for _ in range(OPT_VOCAB)]
    return [x / sum(raw) for x in raw]


def path_prob(path: tuple[int, ...]) -> float:
    """p-hat of a node: the product of the draft probabilities along its path (the paper's
    per-node value)."""
    return math.prod(opt_row(path[:i])[t] for i, t in enumerate(path))


@pytest.mark.parametrize("n", [3, 5, 6])
def test_opt_tree_is_the_subtree_maximising_e_a(n):
    """OPT-Tree's objective (its method section): E(A), the expected acceptance length of a
    draft tree, is (up to the root's constant) the sum over its nodes of p-hat, the product of
    the draft probabilities on the node's path; OPT-Tree returns the n-node tree maximising
    it. Oracle: every parent-closed set of n nodes of the full candidate tree (vocabulary 3,
    depth 3: 39 candidates), scored by that sum; the greedy layers of ``opt-tree`` (threshold
    0, so it drafts every useful layer) must reach the maximum, and the very set where the maximum is unique."""
    def children(path):
        return [path + (t,) for t in range(OPT_VOCAB)] if len(path) < OPT_DEPTH else []

    scored = [(sum(path_prob(p) for p in sub), frozenset(sub)) for sub in closed_subtrees(children, n)]
    best = max(v for v, _ in scored)
    argmax = [s for v, s in scored if math.isclose(v, best, rel_tol=1e-12)]

    def rows(path):  # the drafter's row at a node: path[0] is the root's token
        return torch.tensor(opt_row(tuple(path[1:])), dtype=torch.float64).log()

    drafter = SyntheticDrafter(OPT_VOCAB, rows)
    tree, _ = build_tree("opt-tree", drafter, n + 1, threshold=0.0, max_depth=OPT_DEPTH)
    got = token_paths(tree)
    assert len(got) == n
    assert math.isclose(sum(path_prob(p) for p in got), best, rel_tol=1e-9)
    if len(argmax) == 1:
        assert got == set(argmax[0])


# ---------------------------------------------------------------------------- Sequoia
def expected_by_outcomes(paths: set[tuple[int, ...]], a: tuple[float, ...], depth: int) -> float:
    """Expected tokens per step under Sequoia's positional acceptance model, by enumerating
    verification outcomes: at each level the target accepts the draft child of rank k with
    probability a[k] (none with 1 - sum a), independently of the level; a step yields the
    accepted path plus one token from the target. Written from the model, not from the DP."""
    none = len(a)
    probs = list(a) + [1.0 - sum(a)]
    total = 0.0
    for outcome in itertools.product(range(none + 1), repeat=depth + 1):
        accepted, node = 0, ()
        for rank in outcome:
            if rank == none or node + (rank,) not in paths:
                break
            node, accepted = node + (rank,), accepted + 1
        total += math.prod(probs[r] for r in outcome) * (accepted + 1)
    return total


def test_sequoia_hand_example_depth_changes_the_shape():
    """Sequoia §3 (tree construction): with positional acceptance a = (.6, .2), a tree's
    expected tokens are F(T) = sum over its nodes of the product of a[rank] along the node's path (root: 1). By
    hand, the 4-node trees (at most 2 children a node): chain 1 + .6 + .36 + .216 = 2.176;
    two root children, the first with a child, 1 + .6 + .2 + .36 = 2.16; one child with two
    children, 1 + .6 + .36 + .12 = 2.08; two root children, the second with a child,
    1 + .6 + .2 + .12 = 1.92. So the best of depth <= 3 is the chain, and of depth <= 2 the
    2.16 tree."""
    a = (0.6, 0.2)
    table = sequoia_table(a, 4, 3)
    assert math.isclose(table.best[4, 3], 2.176) and math.isclose(table.best[4, 2], 2.16)
    assert set(optimal_paths(table, 4, 3)) == {(0,), (0, 0), (0, 0, 0)}
    assert set(optimal_paths(table, 4, 2)) == {(0,), (1,), (0, 0)}
    # The same numbers from the acceptance model itself (outcomes enumerated).
    assert math.isclose(expected_by_outcomes({(0,), (0, 0), (0, 0, 0)}, a, 3), 2.176)
    assert math.isclose(expected_by_outcomes({(0,), (1,), (0, 0)}, a, 2), 2.16)
    # And the policy drafts that shape from a drafter's ranked children.
    tree, session = build_tree("sequoia", SyntheticDrafter(8, seed=3), 4, acceptance=list(a), max_depth=2)
    assert set(rank_to_token(tree)) == {(0,), (1,), (0, 0)} and session.draft_forwards == 2


@pytest.mark.parametrize("a", [(0.6, 0.2), (0.45, 0.3, 0.1), (0.9,)])
def test_sequoia_tree_maximises_the_acceptance_model_over_all_trees(a):
    """Sequoia's objective (§3, tree construction) taken at its word: over every set of m - 1
    rank paths closed under parents (rank gaps allowed, width <= len(a), depth <= 3), the expected tokens of the
    acceptance model, by enumerated outcomes, peak at the DP's value, and the DP's tree attains
    it. Independent of the DP's recurrence (the other test in test_policy_algorithms.py checks
    the DP against that recurrence)."""
    depth = 3

    def children(path):
        return [path + (r,) for r in range(len(a))] if len(path) < depth else []

    table = sequoia_table(a, 7, depth)
    for m in range(2, 8):
        values = [expected_by_outcomes(set(s), a, depth) for s in closed_subtrees(children, m - 1)]
        if not values:  # no tree of m nodes fits (width len(a), depth 3): the DP says so too
            assert table.best[m, depth] == -math.inf
            continue
        best = max(values)
        assert math.isclose(table.best[m, depth], best, rel_tol=1e-12)
        assert math.isclose(expected_by_outcomes(set(optimal_paths(table, m, depth)), a, depth), best, rel_tol=1e-12)


# ---------------------------------------------------------------------------- Token Recycling
#: Token Recycling's draft-tree template "2.2.2", 80 rank paths, as the authors ship it:
#: Luowaterbi/TokenRecycling, model/recycling/tree_template_.py at commit
#: 1b4c05cc642d111f12c61d4a99950d737121d9fe (read with fetch).
TR_TEMPLATE = (
    [[r] for r in range(8)]
    + [[0, r] for r in range(8)] + [[1, r] for r in range(4)] + [[2, r] for r in range(3)]
    + [[3, 0], [3, 1], [4, 0], [5, 0], [6, 0], [7, 0]]
    + [[0, 0, r] for r in range(8)] + [[0, 1, 0], [0, 1, 1], [0, 1, 2], [0, 2, 0], [0, 2, 1]]
    + [[0, 3, 0], [0, 4, 0], [0, 5, 0], [0, 6, 0], [0, 7, 0], [1, 0, 0], [1, 0, 1], [1, 1, 0]]
    + [[2, 0, 0], [3, 0, 0], [4, 0, 0], [5, 0, 0]]
    + [[0, 0, 0, r] for r in range(5)] + [[0, 0, 1, 0], [0, 0, 1, 1], [0, 0, 2, 0], [0, 0, 3, 0]]
    + [[0, 0, 4, 0], [0, 1, 0, 0], [0, 2, 0, 0], [1, 0, 0, 0], [2, 0, 0, 0], [3, 0, 0, 0]]
    + [[0, 0, 0, 0, 0], [0, 0, 0, 0, 1], [0, 0, 0, 0, 2], [0, 0, 0, 1, 0], [0, 0, 0, 2, 0]]
    + [[0, 0, 1, 0, 0], [0, 1, 0, 0, 0], [1, 0, 0, 0, 0]]
    + [[0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 1], [0, 0, 0, 1, 0, 0]]
)
TR_VOCAB, TR_K = 24, 8


class _Target:
    """What the drafter reads of a target: the vocabulary and the device."""

    vocab_size = TR_VOCAB
    device = torch.device("cpu")


def top_ids(logits: torch.Tensor, k: int = TR_K) -> list[int]:
    """The target's top-k next tokens at one position, best first (distinct random logits)."""
    return sorted(range(len(logits)), key=lambda t: -float(logits[t]))[:k]


def bfs_draft(matrix: dict[int, list[int]], root: int) -> dict[tuple[int, ...], int]:
    """Token Recycling's draft (the paper's BFS over the matrix; the repository's ``prepare_data_input_ids``): layer by
    layer, the template node with rank path (r1..rd) gets ``matrix[token of (r1..rd-1)][rd]``."""
    out: dict[tuple[int, ...], int] = {(): root}
    for path in sorted(map(tuple, TR_TEMPLATE), key=lambda p: (len(p), p)):
        out[path] = matrix[out[path[:-1]]][path[-1]]
    del out[()]
    return out


def test_token_recycling_drafts_the_template_from_the_adjacency_matrix_and_updates_it():
    """Token Recycling (its method section): the adjacency matrix holds, for every token, the target's top-k
    (k = 8) next tokens; a step drafts the static template breadth first from the last token;
    after verification every tree position's top-k *replaces* its token's row (the
    repository's ``adj_matrix[input_ids] = topk(logits, 8)``,
    evaluation/inference_recycling.py at 1b4c05c); the next step drafts from the new matrix.
    One full round on a vocabulary of 24: the matrix, the two drafts and every updated row are
    computed here from the logits alone."""
    gen = torch.Generator().manual_seed(52)
    drafter = RecycleDrafter(RecycleDrafterOptions(k=TR_K, prompt_rows=False), _Target())
    drafter.begin(torch.tensor([0]))
    # Initialization: one write of every token's row (as after a warm-up), distinct logits.
    first = torch.randn(TR_VOCAB, TR_VOCAB, generator=gen, dtype=torch.float64)
    drafter.update(torch.arange(TR_VOCAB), first, torch.arange(TR_VOCAB))
    matrix = {t: top_ids(first[t]) for t in range(TR_VOCAB)}

    tree, _ = build_tree("static", drafter, len(TR_TEMPLATE) + 1, root=5, choices=TR_TEMPLATE)
    assert rank_to_token(tree) == bfs_draft(matrix, 5)

    # Verification: the target's logits at every one of the 81 positions; accepted: root ->
    # (0,) -> (0, 0), whose bonus token roots the next draft.
    logits = torch.randn(len(tree), TR_VOCAB, generator=gen, dtype=torch.float64)
    node_of = {p: i for i, p in enumerate([()] + sorted(rank_to_token(tree), key=lambda p: (len(p), p)))}
    assert all(tuple(int(tree.ranks[j]) for j in tree.path_to(i)[1:]) == p for p, i in node_of.items())
    path = [node_of[()], node_of[(0,)], node_of[(0, 0)]]
    drafter.commit(tree.tokens[path], torch.tensor(path), tree=tree, target_logits=logits.float())

    tokens = tree.tokens.tolist()
    writers = {t: [i for i in range(len(tree)) if tokens[i] == t] for t in set(tokens)}
    updated = dict(matrix)
    for t, nodes in writers.items():
        row = [int(x) for x in drafter.ids[t, :TR_K]]
        on_path = [i for i in nodes if i in path]
        if len(nodes) == 1:  # the paper's rule, unambiguous: the row is replaced
            assert row == top_ids(logits[nodes[0]])
        elif on_path:  # specframe's choice among several writers: the accepted one (docs/parity.md)
            assert row == top_ids(logits[on_path[-1]])
        else:  # the repository's duplicate write leaves the winner unspecified: any writer's
            assert row in [top_ids(logits[i]) for i in nodes]
        updated[t] = row
    for t in set(range(TR_VOCAB)) - set(tokens):  # tokens not in the tree keep their rows
        assert [int(x) for x in drafter.ids[t, :TR_K]] == matrix[t]

    bonus = top_ids(logits[path[-1]], 1)[0]
    tree2, _ = build_tree("static", drafter, len(TR_TEMPLATE) + 1, root=bonus, choices=TR_TEMPLATE)
    assert rank_to_token(tree2) == bfs_draft(updated, bonus)


# ---------------------------------------------------------------------------- REST
REST_VOCAB = 16
#: A corpus for REST's retrieval. The context ends ``1 2 3``: four documents continue ``1 2 3``
#: (continuations 4 5 6 | 4 5 6 | 4 5 8 | 4 9 6 | 6 7 8 | 6 7 9 over six occurrences), one holds
#: only the shorter ``2 3`` (then 10: a longer match wins, so it must not count), one only ``3``.
REST_DOCS = [
    [1, 2, 3, 4, 5, 6, 0, 0],
    [11, 1, 2, 3, 4, 5, 6, 12, 0],
    [1, 2, 3, 4, 5, 8, 0, 0],
    [1, 2, 3, 4, 9, 6, 0, 0, 1, 2, 3, 6, 7, 8, 0],
    [13, 1, 2, 3, 6, 7, 9, 0],
    [9, 2, 3, 10, 11, 12, 13],
    [5, 3, 11, 12, 13, 14, 15],
]
REST_CONTEXT = [14, 1, 2, 3]


def rest_trie(docs: list[list[int]], context: list[int], span: int, long: int) -> dict[tuple[int, ...], int]:
    """REST's retrieval and draft construction (§3) by brute force: the longest suffix of
    ``context`` (at most ``span`` tokens) that occurs in the corpus, every occurrence's next
    ``long`` tokens inside its document, and the trie of those continuations weighted by how
    many of them pass through each node (the authors' DraftRetriever ``search``, src/lib.rs at
    FasterDecoding/REST 50a5fc1, does the same over entries joined with no separator)."""
    for m in range(min(span, len(context)), 0, -1):
        suffix = context[-m:]
        conts = [doc[i + m : i + m + long] for doc in docs for i in range(len(doc) - m) if doc[i : i + m] == suffix]
        if conts:
            weights: dict[tuple[int, ...], int] = {}
            for cont in conts:
                for j in range(1, len(cont) + 1):
                    weights[tuple(cont[:j])] = weights.get(tuple(cont[:j]), 0) + 1
            return {(): len(conts), **weights}
    return {}


def rest_drafter(tmp_path, docs: list[list[int]] = REST_DOCS, **options) -> SuffixDrafter:
    """The ``suffix`` drafter reading only a datastore of ``docs`` (no global tree, no
    probability floor: REST keeps the heaviest trie nodes, whatever their weight), begun on
    :data:`REST_CONTEXT` (distinct tokens, so the request's own tree matches nothing)."""
    build(docs, list, tmp_path, "ids", vocab_size=REST_VOCAB)

    class Target:
        vocab_size = REST_VOCAB
        device = torch.device("cpu")

    drafter = SuffixDrafter(SuffixDrafterOptions(datastore=str(tmp_path), global_tree=False, min_token_prob=0.0,
                                                 **options), Target())
    drafter.begin(torch.tensor(REST_CONTEXT))
    return drafter


def test_rest_retrieves_the_longest_suffix_and_weights_the_trie_by_counts(tmp_path):
    """REST §3, retrieval (exact match of the longest suffix of the context, longest first)
    and draft construction (the candidates' trie, each node weighted by its frequency among
    the retrieved continuations; the heaviest nodes drafted). By hand: ``1 2 3`` (3 tokens) is the longest
    match; its 6 continuations give weights (4) 4, (4 5) 3, (4 5 6) 2, (6) 2, (6 7) 2, and 1 for
    the rest; ``2 3 10`` and ``3 11`` are shorter matches and never count. Each trie node's
    drafted probability is its weight over the 6 continuations, and a policy keeping the 5
    heaviest nodes drafts exactly those 5 (no tie at the cut)."""
    trie = rest_trie(REST_DOCS, REST_CONTEXT, span=16, long=3)
    assert trie[()] == 6 and trie[(4,)] == 4 and trie[(4, 5)] == 3 and trie[(6, 7)] == 2
    assert (10,) not in trie and (11,) not in trie
    # A match of 3 drafts at most 3 tokens (max_spec_factor 1): the trie's depth, long = 3.
    drafter = rest_drafter(tmp_path)
    assert drafter.draft().match_len == 3
    for path, weight in trie.items():
        assert math.isclose(drafter.cumulative(path), weight / 6, rel_tol=1e-6), path
        if path and len(path) < 3:  # the row's candidates are the trie node's children, no others
            assert set(drafter.ranked(path)[1]) == {p[-1] for p in trie if len(p) == len(path) + 1 and p[:-1] == path}
    assert set(drafter.ranked(())[1]) == {4, 6}
    heaviest = sorted((p for p in trie if p), key=lambda p: -trie[p])[:5]
    assert trie[heaviest[-1]] > max(trie[p] for p in trie if p and p not in heaviest)
    tree, _ = build_tree("opt-tree", drafter, 6, root=REST_CONTEXT[-1], threshold=0.0, max_depth=3)
    assert token_paths(tree) == set(heaviest)


def test_rest_deviation_rematch_after_each_drafted_token(tmp_path):
    """A deliberate difference, pinned (docs/parity.md): REST builds one trie from one
    retrieval, so a node where every retrieved continuation ends has no children; specframe's
    datastore source re-matches the longest suffix of context + drafted tokens at every node
    (as its suffix trees do), so it drafts on from a shorter match. Corpus: ``1 2 3 4`` ending a
    document, and ``7 4 5 0``. REST's trie (continuations inside their document) is the single
    node (4); specframe, after drafting 4, finds ``1 2 3 4`` with no continuation, falls back to
    the match ``4`` and drafts 5, then 0 (each probability 1; 3 tokens after a match of 3)."""
    docs = [[1, 2, 3, 4], [7, 4, 5, 0]]
    assert rest_trie(docs, REST_CONTEXT, span=16, long=10) == {(): 1, (4,): 1}
    drafter = rest_drafter(tmp_path, docs)
    assert drafter.draft().match_len == 3 and drafter.draft().tokens == [4, 5, 0]
    assert drafter.ranked((4,))[1] == [5] and math.isclose(drafter.cumulative((4, 5)), 1.0)
