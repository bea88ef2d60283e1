"""Built-in batch allocators: ``equal`` (each live sequence gets the same share) and ``shared``
(ECHO-style: the candidates of all sequences compete under one gate for one total budget)."""

from __future__ import annotations

from typing import Sequence

import torch

from specframe.batch_allocate import BatchAllocator, water_fill
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
