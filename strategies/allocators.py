"""Built-in batch allocators: ``equal`` (each live sequence gets the same share), ``shared``
(ECHO-style: the candidates of all sequences compete under one gate for one total budget) and
``acceptance`` (shares in proportion to each sequence's recent accepted lengths)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from specframe.decode.allocate import AllocatorOptions, BatchAllocator, water_fill
from specframe.interfaces import StepStats
from specframe.tree import DraftTree


class EqualSplit(BatchAllocator):
    """The batch budget split evenly; a sequence capped below its share gives the rest away."""

    name = "equal"

    def budgets(self, caps: Sequence[int], history: Sequence[Sequence[StepStats]], total: int) -> list[int]:
        """Round-robin shares of ``total`` under each cap."""
        return water_fill(caps, total)


class SharedBudget(BatchAllocator):
    """Every sequence drafts up to its cap; then the batch keeps the ``total`` nodes of highest
    cumulative draft probability over all trees (roots always), so a confident sequence gets
    deep trees and a hesitant one a stub. Kept sets stay ancestor-closed: a node is taken only
    after its parent, and a path's probability never grows along it."""

    name = "shared"

    def budgets(self, caps: Sequence[int], history: Sequence[Sequence[StepStats]], total: int) -> list[int]:
        """Each sequence may build up to what is left once the others have their roots."""
        return [max(1, min(cap, total - (len(caps) - 1))) for cap in caps]

    def trim(self, trees: Sequence[DraftTree], total: int) -> list[DraftTree]:
        """The global top-``total`` nodes by cumulative draft log-probability (one host read)."""
        if sum(len(t) for t in trees) <= total:
            return list(trees)
        logp = torch.cat([t.logp.double() for t in trees]).tolist()
        parents = torch.cat([t.parents for t in trees]).tolist()
        depths = torch.cat([t.depths for t in trees]).tolist()
        offsets = [0]
        for t in trees:
            offsets.append(offsets[-1] + len(t))
        candidates = [(-logp[offsets[b] + i], depths[offsets[b] + i], b, i)
                      for b, t in enumerate(trees) for i in range(1, len(t))]
        kept = [{0} for _ in trees]
        room = total - len(trees)
        for _, _, b, i in sorted(candidates):
            if room == 0:
                break
            if parents[offsets[b] + i] in kept[b]:
                kept[b].add(i)
                room -= 1
        return [t if len(k) == len(t) else t.select(torch.tensor(sorted(k), device=t.device))
                for t, k in zip(trees, kept)]


@dataclass
class AcceptanceOptions(AllocatorOptions):
    """Options of the ``acceptance`` allocator.

    Attributes:
        window: how many recent steps of a sequence estimate its acceptance.
    """

    window: int = 4


class AcceptanceShare(BatchAllocator):
    """Shares in proportion to ``1 + mean accepted length`` over each sequence's last steps
    (host statistics already read: no device read, no drafting beyond the share). A sequence
    with no history counts as average."""

    name = "acceptance"
    Options = AcceptanceOptions

    def budgets(self, caps: Sequence[int], history: Sequence[Sequence[StepStats]], total: int) -> list[int]:
        """Largest-remainder shares of ``total`` by acceptance weight, each in ``[1, cap]``."""
        window = max(1, int(self.options.window))
        means = [sum(s.accepted for s in h[-window:]) / len(h[-window:]) if h else None for h in history]
        known = [m for m in means if m is not None]
        default = sum(known) / len(known) if known else 1.0
        weights = [1.0 + (default if m is None else m) for m in means]
        shares = [1] * len(caps)
        left = total - len(caps)
        while left > 0:
            open_rows = [b for b in range(len(caps)) if shares[b] < caps[b]]
            if not open_rows:
                break
            # The row furthest below its weighted share gets the next node.
            weight = sum(weights[b] for b in open_rows)
            b = max(open_rows, key=lambda r: (weights[r] / weight) * total - shares[r])
            shares[b] += 1
            left -= 1
        return shares
