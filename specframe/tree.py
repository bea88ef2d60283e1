"""DraftTree: the one data structure every policy builds and every verifier reads.

A tree is stored as flat tensors in topological order (a parent always precedes its children),
so a whole tree goes through the target in one forward and algorithms stay vectorised.
Node 0 is the root: the last committed token, whose successor the target predicts first.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field, replace
from typing import Literal

import torch

Drafting = Literal["deterministic", "iid", "without_replacement"]
DRAFTING_MODES: tuple[str, ...] = ("deterministic", "iid", "without_replacement")


#: Largest tree whose ancestor mask is built from host lists (quadratic in Python beyond it).
HOST_MASK_NODES = 64

#: Per-node tensors that must all have shape ``[len(tree)]``.
_NODE_FIELDS = ("parents", "depths", "logp", "ranks")


def as_float32(value: float) -> float:
    """``value`` rounded to the nearest float32, as a float32 tensor stores it (what a tree's
    log-probs hold): a tree grown in host lists keeps its lists equal to its tensors."""
    return array("f", (value,))[0]


@dataclass(frozen=True)
class HostLists:
    """A tree's per-node values on the host (:meth:`DraftTree.host`), index for index."""

    tokens: list[int]
    parents: list[int]
    depths: list[int]
    logp: list[float]
    ranks: list[int]


class InvalidTreeError(ValueError):
    """A DraftTree violates one of its invariants; the message names which and where."""


@dataclass
class DraftTree:
    """A draft tree in topological order.

    Attributes:
        tokens: ``[n]`` token id of each node (node 0 = root = last committed token).
        parents: ``[n]`` parent index, ``parents[0] == -1`` and ``parents[i] < i``.
        depths: ``[n]`` depth, 0 at the root.
        logp: ``[n]`` cumulative draft log-probability of the path root -> node (0 at root).
        ranks: ``[n]`` rank of the node among its parent's candidate children by draft
            probability (0 = most likely; -1 at the root, or where unknown). Used by reports.
        draft_probs: optional ``[n, V]`` draft distribution q over the children of each node,
            needed by stochastic verifiers; rows of nodes that were never expanded are unused.
        drafting: how children were chosen: ``deterministic`` (top-k / gated), ``iid``
            (sampled i.i.d. from q) or ``without_replacement``.
        origin: optional ``[n]`` index of each node in the tree it was selected from, composed
            over repeated :meth:`select` calls (so: its index in the tree the drafter
            expanded); -1 for nodes appended after a select. None (the default): no select
            happened and every node is its own origin. Read it through :meth:`origins`.
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    logp: torch.Tensor
    ranks: torch.Tensor
    draft_probs: torch.Tensor | None = None
    drafting: Drafting = "deterministic"
    origin: torch.Tensor | None = field(default=None, repr=False)
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    # ------------------------------------------------------------------ construction
    @classmethod
    def root(cls, token: int, device: torch.device | str | None = None) -> "DraftTree":
        """A tree holding only the root node with the given token."""
        # One tensor split into its four one-element views: two ops where four tensors took four.
        tokens, parents, depths, ranks = torch.tensor([int(token), -1, 0, -1], dtype=torch.long, device=device).split(1)
        return cls(tokens=tokens, parents=parents, depths=depths,
                   logp=torch.zeros(1, dtype=torch.float32, device=device), ranks=ranks)

    @classmethod
    def from_lists(cls, tokens: list[int], parents: list[int], depths: list[int], logp: list[float],
                   ranks: list[int], device: torch.device | str | None = None,
                   origin: list[int] | None = None) -> "DraftTree":
        """A tree held as host lists, its tensors made (in two constructions) when first read:
        the CPU fast path of a policy that grows its tree on the host, where a dozen tensor ops
        per layer cost more than the drafting. :meth:`host` returns the lists for free, so a
        drafter or the engine reads none of them back. ``logp`` must hold float32 values (the
        tree's dtype), so the lists are the tensors' exact copy. The tree keeps copies: a policy
        goes on appending to its lists. ``origin``: each node's index in the tree it was cut from
        (:meth:`select`'s record; None: the tree was never re-indexed)."""
        lists = HostLists(list(tokens), list(parents), list(depths), list(logp), list(ranks))
        return _ListTree(lists, device if isinstance(device, torch.device) else torch.device(device or "cpu"), origin)

    def host(self) -> "HostLists":
        """The tree's per-node values as host lists: free for a tree built by :meth:`from_lists`,
        else read now (on an accelerator a device read, which the engine avoids by reading trees
        with its verdict)."""
        return HostLists(self.tokens.tolist(), self.parents.tolist(), self.depths.tolist(), self.logp.tolist(),
                         self.ranks.tolist())

    def has_host(self) -> bool:
        """Whether :meth:`host` is free (the tree was built from host lists)."""
        return False

    def add_nodes(
        self,
        parents: torch.Tensor,
        tokens: torch.Tensor,
        logp: torch.Tensor,
        ranks: torch.Tensor | None = None,
    ) -> "DraftTree":
        """Return a new tree with nodes appended (parents must already be in the tree).

        ``parents`` index existing nodes (``0 <= parent < len(self)``; a node added in the same
        call cannot be a parent yet: add one layer per call). ``logp`` is the new nodes'
        cumulative log-prob. ``ranks`` is each node's rank among its parent's candidates by
        draft probability (0 = most likely, ties to the lower token id as
        :func:`specframe.topk_per_row` returns them); omitted, they are -1 (unknown) and the
        report's acceptance-by-rank histogram leaves the nodes out.

        Raises :class:`InvalidTreeError` when a parent is not in the tree (CPU trees; on other
        devices the check would cost a device read, so the engine's validity check names it).
        """
        parents = _on(parents, self.parents.device, torch.long)
        if ranks is None:
            ranks = torch.full_like(parents, -1)
        return replace(
            self,
            tokens=torch.cat([self.tokens, _on(tokens, self.tokens.device, torch.long)]),
            parents=torch.cat([self.parents, parents]),
            depths=torch.cat([self.depths, self._parent_depths(parents) + 1]),
            logp=torch.cat([self.logp, _on(logp, self.logp.device, self.logp.dtype)]),
            ranks=torch.cat([self.ranks, _on(ranks, self.ranks.device, torch.long)]),
            origin=None if self.origin is None else torch.cat([self.origin, torch.full_like(parents, -1)]),
            _cache={},
        )

    def _parent_depths(self, parents: torch.Tensor) -> torch.Tensor:
        """Depths of ``parents``, refusing indices outside the tree without a device read."""
        n = len(self)
        if parents.device.type != "cpu":
            # Out-of-range indices would be a device-side assert: clamp, and let the engine's
            # validity check / check_valid (parents[i] < i) name the broken node.
            return self.depths[parents.clamp(0, n - 1)]
        try:
            return self.depths[parents]
        except IndexError:
            bad = [int(p) for p in parents.tolist() if not -n <= p < n]
            raise InvalidTreeError(
                f"add_nodes(): parent {bad[0]} is not in the tree (it has {n} nodes, indices 0..{n - 1}); "
                "parents must be added before their children, one layer per add_nodes call"
            ) from None

    def select(self, keep: torch.Tensor) -> "DraftTree":
        """Sub-tree of the nodes in ``keep`` (indices, must include 0 and be ancestor-closed).

        Nodes are re-indexed in ascending order of their old index, so topological order holds.
        The result remembers where each node came from: ``origins()[i]`` of the sub-tree is
        ``origins()[keep_sorted[i]]`` of this tree, so node identity survives any number of
        selects (a drafter maps a verified path back to the nodes it expanded).
        """
        keep = torch.unique(keep.to(self.parents.device, torch.long))  # sorted ascending
        new_index = torch.full((len(self),), -1, dtype=torch.long, device=keep.device)
        new_index[keep] = torch.arange(len(keep), device=keep.device)
        old_parents = self.parents[keep]
        parents = torch.where(old_parents >= 0, new_index[old_parents.clamp(min=0)], old_parents)
        if bool((parents[1:] < 0).any()) or int(keep[0]) != 0:
            raise InvalidTreeError("select(): the kept nodes are not ancestor-closed or miss the root")
        return replace(
            self,
            tokens=self.tokens[keep],
            parents=parents,
            depths=self.depths[keep],
            logp=self.logp[keep],
            ranks=self.ranks[keep],
            draft_probs=None if self.draft_probs is None else self.draft_probs[keep],
            origin=self.origins()[keep],
            _cache={},
        )

    # ------------------------------------------------------------------ derived views
    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def device(self) -> torch.device:
        """Device of the tree's tensors."""
        return self.tokens.device

    def origins(self) -> torch.Tensor:
        """``[n]`` long: each node's index in the tree it was selected from (see ``origin``);
        ``arange(n)`` when the tree was never re-indexed. Reads nothing from the device."""
        if self.origin is not None:
            return self.origin
        return torch.arange(len(self), dtype=torch.long, device=self.device)

    @property
    def max_depth(self) -> int:
        """Depth of the deepest node (0 for a root-only tree)."""
        return int(self.depths.max())

    def ancestor_mask(self) -> torch.Tensor:
        """``[n, n]`` bool, ``mask[i, j]`` is True iff j is i itself or an ancestor of i.

        This is the tree-attention mask: node i may attend to exactly these nodes. Built by
        pointer jumping: after round k each row holds the ancestors within 2^k steps, so
        ceil(log2(n)) rounds suffice. The round count depends only on ``len(tree)``, never on
        the tree's values, so building the mask never waits for the device.
        """
        if "anc" not in self._cache and self.has_host() and len(self) <= HOST_MASK_NODES:
            # Host parents: the rows in Python and one tensor, for a tree of a few dozen nodes
            # (a broken parent leaves it to the pointer jumping below, which tolerates it).
            parents, rows = self.host().parents, []
            for i, parent in enumerate(parents):
                if not -1 <= parent < i or (parent == -1) != (i == 0):
                    break
                row = rows[parent][:] if parent >= 0 else [False] * len(parents)
                row[i] = True
                rows.append(row)
            else:
                self._cache["anc"] = torch.tensor(rows, dtype=torch.bool, device=self.device)
        if "anc" not in self._cache:
            n = len(self)
            mask = torch.eye(n, dtype=torch.bool, device=self.device)
            rows = torch.arange(n, device=self.device)
            # The root is its own parent, so jumping past it is a no-op; the upper clamp keeps a
            # broken tree from indexing out of range before the engine checks the tree it reads.
            jump = self.parents.clamp(0, n - 1)
            mask[rows, jump] = True
            for _ in range(max(0, n - 1).bit_length()):
                mask = mask | mask[jump]
                jump = jump[jump]
            self._cache["anc"] = mask
        return self._cache["anc"]

    def positions(self, num_committed: int) -> torch.Tensor:
        """Absolute position ids: with L committed tokens (root included) the root sits at L-1."""
        return self.depths + (num_committed - 1)

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root to ``node`` inclusive."""
        path = [int(node)]
        parents = self.parents.tolist()
        while parents[path[-1]] >= 0:
            path.append(parents[path[-1]])
        return path[::-1]

    def children(self, node: int) -> torch.Tensor:
        """Indices of the children of ``node`` in tree order."""
        return torch.nonzero(self.parents == node).flatten()

    def leaves(self) -> torch.Tensor:
        """Indices of nodes without children."""
        has_child = torch.zeros(len(self), dtype=torch.bool, device=self.device)
        has_child[self.parents[1:]] = True
        return torch.nonzero(~has_child).flatten()

    def width_per_depth(self) -> list[int]:
        """Number of nodes at each depth 0..max_depth (the tree's shape)."""
        return torch.bincount(self.depths).tolist()

    # ------------------------------------------------------------------ validation
    def check_valid(self, budget: int | None = None) -> None:
        """Raise :class:`InvalidTreeError` naming the first violated invariant.

        Checks: non-empty, aligned shapes, ``len(tree) <= budget`` when given (the root
        counts, as EAGLE's ``total_token``), a single root at index 0, topological order,
        depth = parent depth + 1, distinct sibling tokens and finite log-probs. Reads the tree's
        values back to the host as it goes: the engine runs it in strict mode only, and
        otherwise to name what its check of the step's read found broken.
        """
        self._check_shapes(budget)
        problem = tree_problem(self.parents.tolist(), self.tokens.tolist(), self.depths.tolist(), None)
        if problem:
            raise InvalidTreeError(problem)
        if not bool(torch.isfinite(self.logp).all()):
            i = int(torch.nonzero(~torch.isfinite(self.logp)).flatten()[0])
            raise InvalidTreeError(f"node {i} has a non-finite draft log-prob {float(self.logp[i])}")

    def _check_shapes(self, budget: int | None) -> None:
        """The invariants the host knows without reading the device: non-empty, aligned
        shapes, within ``budget``. Anything indexing with the tree relies on them."""
        n = len(self)
        if n == 0:
            raise InvalidTreeError("tree is empty: it must contain at least the root")
        for name in _NODE_FIELDS:
            got = tuple(getattr(self, name).shape)
            if got != (n,):
                raise InvalidTreeError(f"{name} has shape {got}, expected ({n},) like tokens")
        if self.origin is not None and tuple(self.origin.shape) != (n,):
            raise InvalidTreeError(f"origin has shape {tuple(self.origin.shape)}, expected ({n},) like tokens")
        if budget is not None and n > budget:
            raise InvalidTreeError(f"tree has {n} nodes, over the budget of {budget} (root included)")

    def valid_flag(self, budget: int | None = None) -> torch.Tensor:
        """:meth:`check_valid` without reading the device: a 0-dim bool tensor on the tree's
        device, True iff every invariant holds.

        The shape and size checks need no device data, so a tree that breaks them raises
        :class:`InvalidTreeError` here at once (nothing may index with it). The value
        invariants (root, topological order, depths, distinct sibling tokens, finite log-probs)
        become the flag; when it is False, :meth:`check_valid` names the broken invariant. (The
        engine checks the value invariants on the host instead, from the tree it reads with the
        verdict: :func:`specframe.decode.read.tree_problem`.)
        """
        self._check_shapes(budget)
        n = len(self)
        parents, depths = self.parents, self.depths
        below = parents[1:]
        # Each drafted node: a parent before it, one layer above it.
        linked = (below >= 0) & (below < torch.arange(1, n, device=self.device)) \
            & (depths[1:] == depths[below.clamp(0, n - 1)] + 1)
        # Siblings with one token share the key parent * 2^32 + token (token ids are below 2^31):
        # every key must match itself only; the root's parent -1 keeps its key apart.
        key = parents * 2**32 + self.tokens
        distinct = (key[:, None] == key[None, :]).sum() == n
        return (parents[0] == -1) & (depths[0] == 0) & linked.all() & distinct & torch.isfinite(self.logp).all()

    # ------------------------------------------------------------------ export
    def to_networkx(self):
        """A ``networkx.DiGraph`` (edges parent -> child) with token, depth, score, rank attributes."""
        import networkx as nx

        graph = nx.DiGraph()
        toks, deps, logp, ranks = (t.tolist() for t in (self.tokens, self.depths, self.logp, self.ranks))
        for i in range(len(self)):
            graph.add_node(i, token=toks[i], depth=deps[i], score=logp[i], rank=ranks[i])
        for i, p in enumerate(self.parents.tolist()):
            if p >= 0:
                graph.add_edge(p, i)
        return graph

    def describe(self) -> str:
        """One-line shape summary, e.g. ``size=60 depth=7 widths=[1, 10, 14, ...]``."""
        return f"size={len(self)} depth={self.max_depth} widths={self.width_per_depth()}"


def _on(values: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """``values`` on ``device`` in ``dtype``; itself where it already is (a no-op ``to`` is
    still a dispatched op, and a tree grows one layer at a time)."""
    if values.dtype == dtype and values.device == device:
        return values
    return values.to(device, dtype)


def tree_problem(parents: list[int], tokens: list[int], depths: list[int], root: int | None) -> str:
    """The first broken value invariant of a tree given as host lists, or "" when none is:
    node 0 is the root (parent -1, depth 0, token ``root`` when given), every other node's
    parent precedes it, its depth is its parent's plus one, and siblings carry distinct tokens.
    One plain loop over the nodes (no call per node: tests/test_step_calls.py counts calls)."""
    if parents[0] != -1 or depths[0] != 0:
        return "node 0 must be the root: parents[0] == -1 and depths[0] == 0"
    if root is not None and tokens[0] != root:
        return f"root token {tokens[0]} is not the last committed token {root}"
    seen = set()
    for i in range(1, len(parents)):
        p = parents[i]
        if not 0 <= p < i:
            return f"topological order violated at node {i}: parent {p} must satisfy 0 <= parent < {i}"
        if depths[i] != depths[p] + 1:
            return f"depth of node {i} is {depths[i]}, expected parent depth + 1 = {depths[p] + 1}"
        key = (p, tokens[i])
        if key in seen:
            return f"siblings must have distinct tokens: parent {p} has token {tokens[i]} more than once"
        seen.add(key)
    return ""


def drafted_paths(tree: DraftTree, nodes: torch.Tensor | list[int]) -> list[tuple[int, ...]]:
    """The drafted tokens root -> each of ``nodes`` (the root, the last committed token,
    excluded), read once from the tree for a host-side drafter's lookups."""
    parents, tokens = tree.parents.tolist(), tree.tokens.tolist()
    out = []
    for node in torch.as_tensor(nodes).flatten().tolist():
        path: list[int] = []
        while node > 0:
            path.append(tokens[node])
            node = parents[node]
        out.append(tuple(reversed(path)))
    return out


class _ListTree(DraftTree):
    """A :class:`DraftTree` made from host lists (:meth:`DraftTree.from_lists`): its five node
    tensors are built together on first read. A copy made with ``dataclasses.replace`` is built
    from tensors and holds no lists."""

    def __init__(self, lists: HostLists | None = None, device: torch.device | None = None,
                 origin: list[int] | None = None, **fields) -> None:
        if lists is None:  # dataclasses.replace: an ordinary tree of this class
            super().__init__(**fields)
            return
        self.__dict__.update(_lists=lists, _device=device, draft_probs=None, drafting="deterministic", _cache={})
        # origin has a class-level default (None), so it cannot wait for __getattr__.
        self.__dict__["origin"] = None if origin is None else torch.tensor(origin, dtype=torch.long, device=device)

    def __getattr__(self, name: str):
        # Only reached for attributes not set yet: the node tensors of a tree still in lists.
        lists = self.__dict__.get("_lists")
        if lists is None or name not in _LIST_FIELDS:
            raise AttributeError(name)
        longs = torch.tensor([lists.tokens, lists.parents, lists.depths, lists.ranks], dtype=torch.long,
                             device=self._device)
        tokens, parents, depths, ranks = longs.unbind(0)
        self.__dict__.update(tokens=tokens, parents=parents, depths=depths, ranks=ranks,
                             logp=torch.tensor(lists.logp, dtype=torch.float32, device=self._device))
        return self.__dict__[name]

    def __len__(self) -> int:
        lists = self.__dict__.get("_lists")
        return len(lists.tokens) if lists is not None else int(self.tokens.shape[0])

    @property
    def device(self) -> torch.device:
        """Device of the tree's tensors."""
        return self.__dict__["_device"] if "_lists" in self.__dict__ else self.tokens.device

    def host(self) -> HostLists:
        """The lists the tree was made from (free), or a read for a tree made otherwise."""
        lists = self.__dict__.get("_lists")
        return lists if lists is not None else super().host()

    def has_host(self) -> bool:
        """Whether the tree holds its host lists."""
        return "_lists" in self.__dict__

    def _check_shapes(self, budget: int | None) -> None:
        """:meth:`DraftTree._check_shapes` on the lists while the tree holds them (its tensors
        not made): the same invariants, the same messages."""
        lists = self.__dict__.get("_lists")
        if lists is None:
            return super()._check_shapes(budget)
        n = len(lists.tokens)
        if n == 0:
            raise InvalidTreeError("tree is empty: it must contain at least the root")
        for name in _NODE_FIELDS:
            if len(getattr(lists, name)) != n:
                raise InvalidTreeError(f"{name} has shape ({len(getattr(lists, name))},), expected ({n},) like tokens")
        if self.origin is not None and tuple(self.origin.shape) != (n,):
            raise InvalidTreeError(f"origin has shape {tuple(self.origin.shape)}, expected ({n},) like tokens")
        if budget is not None and n > budget:
            raise InvalidTreeError(f"tree has {n} nodes, over the budget of {budget} (root included)")


_LIST_FIELDS = frozenset(("tokens", "parents", "depths", "logp", "ranks"))
_ListTree.__repr__ = lambda self: DraftTree.__repr__(self).replace("_ListTree(", "DraftTree(", 1)  # type: ignore[method-assign]
