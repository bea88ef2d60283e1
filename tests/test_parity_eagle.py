"""Parity of the ``static`` policy with EAGLE-1's reference, eagle-llm 1.2.1 (SafeAILab/EAGLE):
the reference is the oracle.

For the same draft rows, a tree of rank paths (EAGLE's ``mc_sim_7b_63``, the policy's default,
and generated ones) gives:

- the same nodes, parents, depths and leaf paths as EAGLE's static tree buffers
  (``eagle.model.utils.generate_tree_buffers``: attention mask, position ids, retrieve indices);
- the same token at every node as EAGLE's top-k tree: its draft loop (``topK_genrate``: top-10
  of every expanded row, the next layer's inputs picked by the draft-side buffers of
  ``eagle.model.utils_c``) followed by ``generate_candidates``, with each row's logits taken
  from the same synthetic drafter.

Skipped, naming the package, where eagle-llm is not installed (``scripts/install_parity.sh``); a failure
instead under ``SPECFRAME_REQUIRE_PARITY=1``, as CI runs it.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specframe.decode.engine import make_plugin
from specframe.strategies.static import MC_SIM_7B_63
from specframe.testing import parity
from specframe.testing.synthetic import SyntheticDrafter, make_session

eagle_utils = parity.reference("eagle.model.utils", "eagle-llm (EAGLE-1's reference)")
eagle_draft_utils = parity.reference("eagle.model.utils_c", "eagle-llm (EAGLE-1's reference)")
eagle_choices = parity.reference("eagle.model.choices", "eagle-llm (EAGLE-1's reference)")

TOPK = 10  # EAGLE-1's sparse tree reads the top 10 of every row (eagle/model/utils.py TOPK)


def specframe_tree(choices: list[list[int]], drafter: SyntheticDrafter, root: int):
    """``static`` over ``choices``: ``{rank path: (token, parent's rank path, depth)}``."""
    policy = make_plugin("policies", ("static", {"choices": [list(c) for c in choices]}))
    tree = policy.build(make_session(drafter, root_token=root), policy.max_budget)
    out = {}
    for i in range(1, len(tree)):
        path = tuple(int(tree.ranks[j]) for j in tree.path_to(i)[1:])
        out[path] = (int(tree.tokens[i]), path[:-1], len(path))
    return out


def eagle_tokens(choices: list[list[int]], drafter: SyntheticDrafter, root: int) -> list[int]:
    """EAGLE-1's tree tokens, root first, in its (length, path) order: its draft loop with the
    synthetic drafter's rows standing in for the draft head's logits."""
    draft = eagle_draft_utils.generate_tree_buffers(choices, device="cpu")
    rows = [()]  # the drafted path behind each row of this layer's logits
    tops = []
    for select in draft["tree_indices"]:
        logits = torch.stack([drafter.row((root,) + p) for p in rows])
        top = torch.topk(logits, TOPK, dim=-1).indices
        tops.append(top)
        flat = top.view(-1).tolist()
        rows = [rows[q // TOPK] + (flat[q],) for q in select.tolist()]
    tops.append(torch.topk(torch.stack([drafter.row((root,) + p) for p in rows]), TOPK, dim=-1).indices)
    verify = eagle_utils.generate_tree_buffers(choices, device="cpu")
    _, _, tree_candidates = eagle_utils.generate_candidates(
        (torch.cat(tops), None), verify["tree_indices"], verify["retrieve_indices"], torch.tensor([[root]]), None)
    return tree_candidates[0].tolist()


def check(choices: list[list[int]], drafter: SyntheticDrafter, root: int = 0) -> None:
    """The static policy's tree over ``choices`` is EAGLE-1's (module docstring)."""
    ordered = sorted((tuple(c) for c in choices), key=lambda c: (len(c), c))
    position = {c: i + 1 for i, c in enumerate(ordered)}  # EAGLE's node index; the root is 0
    position[()] = 0
    ours = specframe_tree(choices, drafter, root)
    assert set(ours) == set(ordered)
    buffers = eagle_utils.generate_tree_buffers(choices, device="cpu")
    mask = buffers["tree_attn_mask"][0, 0]
    n = len(ordered) + 1
    want = torch.zeros(n, n)
    want[0, 0] = 1
    for path in ordered:  # each node sees itself and its ancestors
        for k in range(len(path) + 1):
            want[position[path], position[path[:k]]] = 1
    assert torch.equal(mask, want)
    assert buffers["tree_position_ids"].tolist() == [0] + [ours[c][2] for c in ordered]
    leaves = {c for c in ordered if not any(o[: len(c)] == c and len(o) > len(c) for o in ordered)}
    retrieved = {tuple(i for i in row if i >= 0) for row in buffers["retrieve_indices"].tolist()}
    assert retrieved == {tuple(position[c[:k]] for k in range(len(c) + 1)) for c in leaves}
    for path in ordered:
        assert position[ours[path][1]] == position[path[:-1]]
    tokens = eagle_tokens(choices, drafter, root)
    assert tokens == [root] + [ours[c][0] for c in ordered]


def test_the_default_tree_is_eagle1s_mc_sim_7b_63():
    assert sorted(map(tuple, eagle_choices.mc_sim_7b_63)) == sorted(MC_SIM_7B_63)
    for seed in range(3):
        check(eagle_choices.mc_sim_7b_63, SyntheticDrafter(64, temperature=2.0, seed=seed), root=seed)


@st.composite
def rank_trees(draw) -> list[list[int]]:
    """Closed sets of rank paths (every prefix listed), ranks below EAGLE's top 10."""
    paths = {(draw(st.integers(0, 3)),)}
    for _ in range(draw(st.integers(0, 12))):
        parent = draw(st.sampled_from(sorted(paths)))
        if len(parent) < 4:
            paths.add(parent + (draw(st.integers(0, TOPK - 1)),))
    closed = {p[:k] for p in paths for k in range(1, len(p) + 1)}
    return [list(p) for p in sorted(closed)]


def eagle1_drafts(choices: list[list[int]]) -> bool:
    """Whether EAGLE-1's draft loop builds this tree. Its draft-side buffers (``utils_c``)
    number the inputs of each layer as if the parents of the nodes that have children were
    the first of the previous layer's expanded nodes, and it needs a node with children; other
    trees get tokens from the wrong rows there (a limitation of the reference, not compared)."""
    paths = {tuple(c) for c in choices}
    expanded = sorted((p for p in paths if any(q[:-1] == p for q in paths)), key=lambda p: (len(p), p))
    if not expanded:
        return False
    for depth in range(2, max(len(p) for p in expanded) + 1):
        rows = [p for p in expanded if len(p) == depth - 1]
        parents = list(dict.fromkeys(p[:-1] for p in expanded if len(p) == depth))
        if parents != rows[: len(parents)]:
            return False
    return True


@settings(max_examples=40, deadline=None)
@given(choices=rank_trees().filter(eagle1_drafts), seed=st.integers(0, 2**31 - 1))
def test_generated_trees_match_eagle1(choices, seed):
    check(choices, SyntheticDrafter(32, seed=seed))


def test_eagle1_misdrafts_a_tree_its_buffers_do_not_number():
    """The limitation above, shown: the third layer's input is meant to be (0, 1, 0) but EAGLE-1
    feeds the top child of (0, 0) instead, so its last token comes from another row."""
    choices = [[0], [0, 0], [0, 0, 0], [0, 1], [0, 1, 0], [0, 1, 0, 0]]
    assert not eagle1_drafts(choices)
    drafter = SyntheticDrafter(32, seed=0)
    ours = specframe_tree(choices, drafter, 0)
    tokens = eagle_tokens(choices, drafter, 0)
    assert tokens[:6] == [0] + [ours[c][0] for c in [(0,), (0, 0), (0, 1), (0, 0, 0), (0, 1, 0)]]
    top_of = torch.topk(drafter.row((0,) + tuple(ours[c][0] for c in [(0,), (0, 0), (0, 0, 0)])), 1).indices
    assert tokens[6] == int(top_of) != ours[(0, 1, 0, 0)][0]
