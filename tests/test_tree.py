"""DraftTree's derived structures checked against networkx as the independent reference."""

import networkx as nx
import pytest
import torch
from hypothesis import given, strategies as st

from specframe.testing.strategies import draft_trees, maybe_broken_trees
from specframe.tree import DraftTree, InvalidTreeError


@given(draft_trees(max_nodes=64))
def test_networkx_view_is_an_arborescence_rooted_at_zero(tree):
    graph = tree.to_networkx()
    assert graph.number_of_nodes() == len(tree)
    assert nx.is_arborescence(graph)
    assert [n for n, d in graph.in_degree() if d == 0] == [0]


@given(draft_trees(max_nodes=64))
def test_ancestor_mask_matches_networkx_ancestors(tree):
    graph = tree.to_networkx()
    mask = tree.ancestor_mask()
    for i in range(len(tree)):
        expected = nx.ancestors(graph, i) | {i}
        assert set(torch.nonzero(mask[i]).flatten().tolist()) == expected


@given(draft_trees(max_nodes=64), st.integers(1, 1000))
def test_depths_and_positions_match_shortest_paths(tree, committed):
    lengths = nx.single_source_shortest_path_length(tree.to_networkx(), 0)
    assert tree.depths.tolist() == [lengths[i] for i in range(len(tree))]
    assert tree.positions(committed).tolist() == [committed - 1 + lengths[i] for i in range(len(tree))]


@given(draft_trees(max_nodes=64))
def test_paths_and_leaves_match_networkx(tree):
    graph = tree.to_networkx()
    for i in range(len(tree)):
        assert tree.path_to(i) == nx.shortest_path(graph, 0, i)
    assert sorted(tree.leaves().tolist()) == sorted(n for n in graph if graph.out_degree(n) == 0)
    assert sum(tree.width_per_depth()) == len(tree)


@given(draft_trees(max_nodes=64))
def test_generated_trees_are_valid_and_budget_is_enforced(tree):
    tree.check_valid(budget=len(tree))
    if len(tree) > 1:
        with pytest.raises(InvalidTreeError, match="over the budget"):
            tree.check_valid(budget=len(tree) - 1)


@given(draft_trees(max_nodes=40), st.data())
def test_select_keeps_an_ancestor_closed_subtree(tree, data):
    picked = data.draw(st.lists(st.integers(0, len(tree) - 1), max_size=10))
    keep = set()
    for node in picked:
        keep |= set(tree.path_to(node))
    keep.add(0)
    sub = tree.select(torch.tensor(sorted(keep)))
    sub.check_valid()
    old_paths = {tuple(tree.tokens[tree.path_to(i)].tolist()) for i in keep}
    new_paths = {tuple(sub.tokens[sub.path_to(i)].tolist()) for i in range(len(sub))}
    assert old_paths == new_paths


def _closed_subset(tree, picked):
    keep = {0}
    for node in picked:
        keep |= set(tree.path_to(node))
    return sorted(keep)


@given(draft_trees(max_nodes=40), st.data())
def test_select_keeps_node_identity_through_repeated_selects(tree, data):
    """``origins()`` maps every node of a (repeatedly) selected tree to the node of the
    original tree it is: same token, same depth, and parents map to parents."""
    assert tree.origin is None and tree.origins().tolist() == list(range(len(tree)))
    sub = tree
    for _ in range(data.draw(st.integers(1, 3), label="selects")):
        picked = data.draw(st.lists(st.integers(0, len(sub) - 1), max_size=8))
        before = sub.origins().tolist()
        keep = _closed_subset(sub, picked)
        sub = sub.select(torch.tensor(keep))
        assert sub.origins().tolist() == [before[k] for k in keep]  # composition
    origin = sub.origins().tolist()
    assert origin[0] == 0 and origin == sorted(origin)
    assert sub.tokens.tolist() == tree.tokens[origin].tolist()
    assert sub.depths.tolist() == tree.depths[origin].tolist()
    for i in range(1, len(sub)):
        assert origin[int(sub.parents[i])] == int(tree.parents[origin[i]])
    # A path of the selected tree is the same path of the original.
    for i in range(len(sub)):
        assert [origin[j] for j in sub.path_to(i)] == tree.path_to(origin[i])
    # Nodes appended after a select have no origin (-1); earlier nodes keep theirs.
    grown = sub.add_nodes(torch.tensor([0]), torch.tensor([int(sub.tokens.max()) + 1]), torch.tensor([-1.0]))
    assert grown.origins().tolist() == origin + [-1]
    grown.check_valid()


def _tree(parents, tokens, depths):
    n = len(parents)
    return DraftTree(torch.tensor(tokens), torch.tensor(parents), torch.tensor(depths),
                     torch.zeros(n), torch.full((n,), -1))


@pytest.mark.parametrize(
    "parents, tokens, depths, message",
    [
        ([-1, 1], [5, 6], [0, 1], "topological order violated at node 1"),
        ([-1, 0, 0], [5, 6, 6], [0, 1, 1], "siblings must have distinct tokens: parent 0 has token 6"),
        ([-1, 0, 1], [5, 6, 7], [0, 1, 3], "depth of node 2 is 3, expected parent depth \\+ 1 = 2"),
        ([0, 0], [5, 6], [0, 1], "node 0 must be the root"),
    ],
)
def test_check_valid_names_the_violated_invariant(parents, tokens, depths, message):
    tree = _tree(parents, tokens, depths)
    with pytest.raises(InvalidTreeError, match=message):
        tree.check_valid()


def test_non_finite_logp_is_rejected():
    tree = DraftTree.root(3).add_nodes(torch.tensor([0]), torch.tensor([4]), torch.tensor([float("-inf")]))
    with pytest.raises(InvalidTreeError, match="non-finite draft log-prob"):
        tree.check_valid()


@given(maybe_broken_trees())
def test_device_validity_flag_agrees_with_check_valid(tree):
    try:
        tree.check_valid()
        valid = True
    except InvalidTreeError:
        valid = False
    assert bool(tree.valid_flag()) == valid
