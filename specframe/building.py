"""Layer building for tree policies: the tie-correct layer append, top-n selection and rank-path trees.

Conventions every function here follows, so that policies built from them agree on ties:

* Ordering is always "higher score first, then lower index" (lower token id inside a row,
  lower flat / pool index across rows). Identical drafter outputs therefore always give
  identical trees, and because a child's cumulative score never exceeds its parent's
  (:func:`child_scores`) while a parent always has the lower pool index, any top-n of a pool
  under this order is ancestor-closed even when a child of probability 1 ties its parent.
* Cumulative scores are kept in float64 beside the tree (the tree stores float32 log-probs),
  so gates and re-ranks do not depend on the tree's storage precision.
* Candidates with a ``-inf`` draft log-prob are never returned as selectable: callers mask
  them with :func:`torch.isfinite` before selecting.
"""

from __future__ import annotations

from typing import Sequence

import torch

from specframe.interfaces import DraftSession
from specframe.selection import top_indices
from specframe.tree import DraftTree


def child_scores(parent_scores: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Cumulative float64 scores ``[rows, k]`` of children given parents' scores ``[rows]``.

    Draft log-probs are clamped at 0: a normalised distribution never exceeds it, and the clamp
    guarantees (IEEE addition being monotone) that a child never scores above its parent, which
    is what makes top-n selections ancestor-closed.
    """
    return parent_scores.to(torch.float64)[:, None] + values.to(torch.float64).clamp(max=0.0)


def append_children(
    tree: DraftTree,
    scores: torch.Tensor,
    parents: torch.Tensor,
    flat: torch.Tensor,
    cand_scores: torch.Tensor,
    tokens: torch.Tensor,
    ranks: torch.Tensor,
) -> tuple[DraftTree, torch.Tensor, torch.Tensor]:
    """Append chosen candidates of one layer to ``tree``.

    ``parents`` are the expanded nodes (``[rows]``); ``cand_scores``, ``tokens`` and ``ranks``
    are the ``[rows, k]`` candidate grids; ``flat`` indexes the chosen candidates in the
    flattened grid, in the order they are to be appended. Returns the new tree, the extended
    float64 score vector and the new nodes' indices.
    """
    k = tokens.shape[1]
    row = flat // k
    new_scores = cand_scores.flatten()[flat]
    first = len(tree)
    tree = tree.add_nodes(
        parents[row], tokens.flatten()[flat], new_scores, ranks.flatten()[flat]
    )
    new_nodes = torch.arange(first, len(tree), device=tree.device)
    return tree, torch.cat([scores, new_scores]), new_nodes


def select_top(tree: DraftTree, scores: torch.Tensor, n_nodes: int) -> DraftTree:
    """Root plus the ``n_nodes - 1`` best-scoring other nodes, kept in tree order.

    Ancestor-closed by the module's ordering convention (see the module docstring).
    """
    if len(tree) <= n_nodes:
        return tree
    best = top_indices(scores[1:], n_nodes - 1) + 1
    keep = torch.cat([torch.zeros(1, dtype=torch.long, device=best.device), best])
    return tree.select(keep)


# ---------------------------------------------------------------------- rank-path trees
RankPath = tuple[int, ...]


def validate_rank_paths(paths: Sequence[Sequence[int]], option: str) -> tuple[RankPath, ...]:
    """Normalise rank paths to sorted tuples and check them, naming ``option`` on error.

    Valid: a non-empty list of non-empty paths of non-negative ints, no duplicates, and every
    proper prefix of a path is itself listed (the tree is ancestor-closed).
    """
    from specframe.options import require

    require(isinstance(paths, (list, tuple)) and len(paths) > 0, option,
            f"must be a non-empty list of rank paths such as [[0], [1], [0, 0]], got {paths!r}")
    out: list[RankPath] = []
    for path in paths:
        require(isinstance(path, (list, tuple)) and len(path) > 0, option,
                f"has a malformed rank path {path!r}: each path is a non-empty list of ranks")
        require(all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in path), option,
                f"has a malformed rank path {list(path)!r}: ranks must be integers >= 0")
        out.append(tuple(int(r) for r in path))
    seen = set(out)
    require(len(seen) == len(out), option, "lists a rank path more than once")
    for path in out:
        require(len(path) == 1 or path[:-1] in seen, option,
                f"has rank path {list(path)!r} but not its parent {list(path[:-1])!r}")
    return tuple(sorted(out, key=lambda p: (len(p), p)))


def build_from_rank_paths(session: DraftSession, paths: Sequence[RankPath], budget: int) -> DraftTree:
    """Draft a fixed-shape tree from rank paths sorted by (length, path), one forward per layer.

    The first ``budget - 1`` paths are used (an ancestor-closed prefix of the sorted list). A
    path whose ranked child has a ``-inf`` draft log-prob (e.g. a one-hot drafter) is dropped
    together with its descendants.
    """
    paths = list(paths)[: max(0, budget - 1)]
    tree = session.new_tree()
    scores = torch.zeros(1, dtype=torch.float64, device=tree.device)
    node_of: dict[RankPath, int] = {(): 0}
    depth = 1
    while True:
        layer = [p for p in paths if len(p) == depth and p[:-1] in node_of]
        if not layer:
            return tree
        parent_paths = sorted({p[:-1] for p in layer}, key=lambda p: node_of[p])
        parents = torch.tensor([node_of[p] for p in parent_paths], dtype=torch.long, device=tree.device)
        row_of = {p: i for i, p in enumerate(parent_paths)}
        values, tokens, ranks = session.expand_top(tree, parents, 1 + max(p[-1] for p in layer))
        cand = child_scores(scores[parents], values)
        k = values.shape[1]
        wanted = [(p, row_of[p[:-1]] * k + p[-1]) for p in layer if p[-1] < k]
        flat_all = torch.tensor([f for _, f in wanted], dtype=torch.long, device=tree.device)
        finite = torch.isfinite(cand.flatten()[flat_all]).tolist()  # one read per layer
        wanted = [w for w, ok in zip(wanted, finite) if ok]
        flat = torch.tensor([f for _, f in wanted], dtype=torch.long, device=tree.device)
        first = len(tree)
        tree, scores, _ = append_children(tree, scores, parents, flat, cand, tokens, ranks)
        node_of.update({p: first + i for i, (p, _) in enumerate(wanted)})
        depth += 1
