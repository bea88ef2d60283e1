"""What the host needs from one verified step, read back from the device in one transfer.

On a GPU every ``int(tensor)`` waits for all queued kernels. The engine packs the accepted
path, its tokens and ranks, the bonus token, the tree's widths, the number of children of the
last accepted node and its validity flag into one tensor and reads it once per step;
``specframe.testing.reference.read_verdict`` is the plain reference that gets the same record
from a host-side verdict.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specframe.tree import DraftTree


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
    """

    ok: bool
    path: torch.Tensor
    tokens: list[int]
    ranks: list[int]
    widths: list[int]
    contiguous: bool
    children: int = -1


def read_step(tree: DraftTree, last: torch.Tensor, bonus: torch.Tensor, ok: torch.Tensor) -> StepRead:
    """One device-to-host read for the verdict ``(last, bonus)`` of ``tree`` and flag ``ok``."""
    packed, path = pack_step(tree, last, bonus, ok)
    return unpack_step(len(tree), packed.tolist(), path)


def packed_size(n: int) -> int:
    """Ints in :func:`pack_step`'s record of an ``n``-node tree: flag, bonus, then path,
    tokens, ranks and widths (``n`` each), then the last accepted node's child count."""
    return 3 + 4 * n


def pack_step(tree: DraftTree, last: torch.Tensor, bonus: torch.Tensor,
              ok: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's record as one device tensor of :func:`packed_size` ints, and the path tensor
    (-1 padded) it lists; batched decoding concatenates the records of all sequences and reads
    them in one transfer (:func:`unpack_step` parses each slice)."""
    n = len(tree)
    on_path = tree.ancestor_mask()[last]
    # Ancestors have distinct depths, so scattering node ids by depth lists the path in order;
    # every other node lands in the spare slot n, which is dropped.
    slot = torch.where(on_path, tree.depths.clamp(0, n - 1), n)
    path = torch.full((n + 1,), -1, dtype=torch.long, device=tree.device)
    path.scatter_(0, slot, torch.arange(n, device=tree.device))
    path = path[:n]
    widths = torch.zeros(n, dtype=torch.long, device=tree.device)
    widths.scatter_add_(0, tree.depths.clamp(0, n - 1), torch.ones_like(tree.depths))
    safe = path.clamp(min=0)
    # Whether the accepted path stopped at a leaf, counted where the tree lives and read with the rest.
    children = (tree.parents == last).sum().reshape(1)
    packed = torch.cat([
        ok.reshape(1).long(), bonus.reshape(1).long(), path, tree.tokens[safe], tree.ranks[safe], widths, children,
    ])
    return packed, path


def unpack_step(n: int, packed: list[int], path: torch.Tensor) -> StepRead:
    """The :class:`StepRead` of a host copy of :func:`pack_step`'s record for an ``n``-node tree."""
    length = sum(1 for p in packed[2 : 2 + n] if p >= 0)
    nodes = packed[2 : 2 + length]
    tokens = packed[2 + n + 1 : 2 + n + length]
    ranks = packed[2 + 2 * n + 1 : 2 + 2 * n + length]
    width_list = packed[2 + 3 * n : 2 + 4 * n]
    depth = max((d for d, w in enumerate(width_list) if w), default=0)
    return StepRead(ok=bool(packed[0]), path=path[:length], tokens=tokens + [packed[1]], ranks=ranks,
                    widths=width_list[: depth + 1], contiguous=nodes == list(range(length)),
                    children=int(packed[2 + 4 * n]))
