"""What the host needs from one verified step, read back from the device in one transfer.

On a GPU every ``int(tensor)`` waits for all queued kernels. The engine packs the verdict (the
deepest accepted node and the bonus token), the tree's finiteness flag and the tree's parents,
tokens, ranks and depths into one tensor with one ``cat`` and reads it once per step; the host
derives the rest (the accepted path, its tokens and ranks, the widths, the children of the last
accepted node) with plain loops over those lists, and checks the tree's value invariants on them
too (:func:`tree_problem`), where the device would take a dozen small kernels for what the host
does in microseconds. ``specframe.testing.reference.read_verdict`` is the plain reference that
gets the same record from a host-side verdict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from specframe.tree import DraftTree, tree_problem  # noqa: F401 (the engine's host check, re-exported)


@dataclass
class StepRead:
    """Host view of one verified step.

    Attributes:
        ok: the tree passed the engine's validity checks.
        path: accepted node indices, root first, on the tree's device.
        tokens: accepted tokens (root excluded) followed by the bonus token.
        ranks: draft rank of each accepted node (root excluded).
        widths: number of nodes at each depth.
        contiguous: the accepted nodes are 0..k-1, so the cache can be cropped, not gathered.
        children: children of the last accepted node (the root when nothing was accepted);
            0 where the accepted path ended at a leaf, so the next depth was never tested.
            -1: not read.
        problem: what :func:`tree_problem` found broken when ``ok`` is False ("" otherwise).
    """

    ok: bool
    path: torch.Tensor
    tokens: list[int]
    ranks: list[int]
    widths: list[int]
    contiguous: bool
    children: int = -1
    problem: str = ""


def read_step(tree: DraftTree, last: torch.Tensor, bonus: torch.Tensor, ok: torch.Tensor) -> StepRead:
    """One device-to-host read for the verdict ``(last, bonus)`` of ``tree`` and flag ``ok``."""
    return unpack_step(len(tree), torch.cat(pack_step(tree, last, bonus, ok)).tolist(), tree.device)


def packed_size(n: int, host: bool = False) -> int:
    """Ints in :func:`pack_step`'s record of an ``n``-node tree: flag, bonus and last accepted
    node, then the tree's parents, tokens, ranks and depths (``n`` each); ``host``: a tree held
    in host lists, whose record is the bonus and the last node only."""
    return 2 if host else 3 + 4 * n


def sends_lists(tree: DraftTree, ok: torch.Tensor | bool) -> bool:
    """Whether the step's record of ``tree`` leaves the tree out: a tree held in host lists
    (:meth:`DraftTree.has_host`) whose flag was decided on the host (``ok`` a plain bool)."""
    return isinstance(ok, bool) and tree.has_host()


def pack_step(tree: DraftTree, last: torch.Tensor, bonus: torch.Tensor, ok: torch.Tensor | bool) -> list[torch.Tensor]:
    """The step's record as the pieces of one ``cat`` (:func:`packed_size` ints in all): the
    caller concatenates the pieces of every row (and anything else the step reads) once and
    reads them in one transfer; :func:`unpack_step` parses each row's slice. ``ok`` is the
    device part of the tree's validity (its log-probs are finite). A tree held in host lists
    (:func:`sends_lists`) sends the verdict alone: the host has the rest
    (:func:`unpack_host_step`)."""
    if sends_lists(tree, ok):
        return [torch.stack((bonus, last))]
    # stack and cat promote the flag and any integer dtype to one integer dtype: no casts.
    return [torch.stack((ok, bonus, last)), tree.parents, tree.tokens, tree.ranks, tree.depths]


def unpack_step(n: int, packed: list[int], device: torch.device | str, root: int | None = None) -> StepRead:
    """The :class:`StepRead` of a host copy of :func:`pack_step`'s record for an ``n``-node tree.

    The tree's value invariants are checked first (:func:`tree_problem`, and the root token is
    ``root`` when given); a broken tree gives ``ok=False`` with the ``problem`` named and nothing
    derived. The path tensor is written to ``device`` from the host (a write, not a read).
    Raises ValueError when the tree is valid but the verdict's last node is not one of its nodes."""
    parents = packed[3 : 3 + n]
    tokens = packed[3 + n : 3 + 2 * n]
    depths = packed[3 + 3 * n : 3 + 4 * n]
    problem = _problem(bool(packed[0]), parents, tokens, depths, root)
    if problem:
        return _broken(problem)
    return _derived(parents, tokens, packed[3 + 2 * n : 3 + 3 * n], depths, packed[2], packed[1], device)


def unpack_host_step(tree: DraftTree, ok: bool, packed: list[int], root: int | None = None) -> StepRead:
    """:func:`unpack_step` for a tree held in host lists: ``packed`` is its two-int record
    (bonus, last node) and the tree's values come from its lists."""
    host = tree.host()
    problem = _problem(ok, host.parents, host.tokens, host.depths, root)
    if problem:
        return _broken(problem)
    return _derived(host.parents, host.tokens, host.ranks, host.depths, packed[1], packed[0], tree.device)


def read_host_verdict(verifier: Any, tree: DraftTree, ok: bool, rows: list[int], root: int | None,
                      vocab_size: int) -> StepRead:
    """The :class:`StepRead` of a tree held in host lists whose verifier decides on the host
    (``verdict_rows`` / ``verify_host``): the tree is checked first (a broken one gives
    ``ok=False`` and ``verify_host`` never sees it), then the verdict. Raises ValueError when
    the verdict names no node of the tree or a token outside the vocabulary."""
    host = tree.host()
    problem = _problem(ok, host.parents, host.tokens, host.depths, root)
    if problem:
        return _broken(problem)
    last, bonus = verifier.verify_host(host, rows)
    n = len(host.tokens)
    if not (0 <= last < n and 0 <= bonus < vocab_size):
        raise ValueError(f"returned node {last} of a {n}-node tree and bonus token {bonus} "
                         f"of a {vocab_size}-token vocabulary")
    return _derived(host.parents, host.tokens, host.ranks, host.depths, last, bonus, tree.device)


def _problem(ok: bool, parents: list[int], tokens: list[int], depths: list[int], root: int | None) -> str:
    """The first broken invariant of a tree read on the host ("" when none): its flag first."""
    return tree_problem(parents, tokens, depths, root) if ok else "a node has a non-finite draft log-prob"


def _broken(problem: str) -> StepRead:
    return StepRead(ok=False, path=torch.zeros(0, dtype=torch.long), tokens=[], ranks=[], widths=[],
                    contiguous=False, children=-1, problem=problem)


def _derived(parents: list[int], tokens: list[int], ranks: list[int], depths: list[int], last: int, bonus: int,
             device: torch.device | str) -> StepRead:
    """The accepted path, its tokens and ranks, the widths and the children of a checked tree's
    verdict ``(last, bonus)``. Raises ValueError when ``last`` is not one of its nodes."""
    n = len(parents)
    if not 0 <= last < n:
        raise ValueError(f"returned node {last} of a {n}-node tree")
    path = [last]
    node = last
    while node > 0:
        node = parents[node]
        path.append(node)
    path.reverse()
    accepted_tokens, accepted_ranks = [], []
    for node in path[1:]:
        accepted_tokens.append(tokens[node])
        accepted_ranks.append(ranks[node])
    accepted_tokens.append(bonus)
    widths = [0] * (max(depths) + 1)
    for d in depths:
        widths[d] += 1
    contiguous = path[-1] == len(path) - 1  # root-first and increasing: 0..k-1 exactly when it ends at k-1
    return StepRead(ok=True, path=torch.tensor(path, device=device), tokens=accepted_tokens, ranks=accepted_ranks,
                    widths=widths, contiguous=contiguous, children=parents.count(last))
