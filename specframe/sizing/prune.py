"""Host-side view of a draft tree for the auto sizer, and the cut to a chosen top-n.

The bookkeeping runs on the host over plain lists (a layer is read back once): a tree of at most
a few hundred nodes costs less in Python than a dozen tiny tensor ops per layer. Path
probabilities only decrease along a path, so the top-n nodes by calibrated path probability form
a prefix-closed tree; :func:`subtree` cuts it without :meth:`DraftTree.select`'s checks.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import replace

import torch

from specframe.tree import DraftTree

from specframe.sizing.calibration import DEPTHS, Q_EDGES, Calibration


class HostTree:
    """Host lists of a tree being scored: parents, ranks, depths, cells, calibrated log path
    probabilities. Grown layer by layer (one read per layer) or read whole (one read).

    ``run``: drafted tokens the previous step accepted. A node's calibration cell takes depth
    ``depth + run``: it extends an accepted run of that many drafted tokens, and a run that
    crossed a step boundary is as telling as one inside a tree (a copied span goes on being
    copied whether or not the last step ended in it)."""

    def __init__(self, run: int = 0) -> None:
        self.run = int(run)
        self.parents, self.ranks, self.depths = [-1], [0], [0]
        self.cells, self.cal, self.log_c = [0], [0.0], [0.0]
        self.logp: list[float] = []  # the draft's cumulative log-probs, read with the first layer

    def __len__(self) -> int:
        return len(self.parents)

    def extend(self, tree: DraftTree, calibration: Calibration) -> None:
        """Score nodes ``len(self)..`` of ``tree``; their parents must already be scored (true
        of layer-wise growth and of any topological order read whole)."""
        k, n = len(self), len(tree)
        if k >= n:
            return
        # Only what the host does not know yet is read; depths and the parents' log-probs are
        # derived here (every tensor op costs more than the arithmetic on a tiny model's step).
        first, m = len(self.logp), n - k
        if tree.has_host():  # grown in host lists: nothing to read
            lists = tree.host()
            self.logp += lists.logp[first:]
            links, ranks = lists.parents[k:], lists.ranks[k:]
        elif tree.device.type == "cpu":
            # On the CPU a read is a copy: three whole reads cost less than one concatenation
            # (or than slicing first), and a tree holds at most a few hundred nodes.
            self.logp += tree.logp.tolist()[first:]
            links, ranks = tree.parents.tolist()[k:], tree.ranks.tolist()[k:]
        else:
            # On an accelerator every read waits for the device: read once.
            host = torch.cat([tree.logp[first:].double(), tree.parents[k:].double(), tree.ranks[k:].double()]).tolist()
            self.logp += host[: n - first]
            links = [int(p) for p in host[n - first: n - first + m]]
            ranks = [int(r) for r in host[n - first + m:]]
        # cell_of inlined (it is the reference; a test holds them equal): a call per node was
        # a third of the sizer's time on a tiny model's step.
        table, logp, depths, cal = calibration.log_c(), self.logp, self.depths, self.cal
        bins, run, exp, edges, bisect_right = Calibration.BINS, self.run, math.exp, Q_EDGES, bisect.bisect_right
        for j, parent in enumerate(links):
            depth = depths[parent] + 1
            log_q = logp[k + j] - logp[parent]
            row = (0 if ranks[j] == 0 else DEPTHS) + min(depth + run, DEPTHS) - 1
            cell = row * bins + bisect_right(edges, exp(log_q) if log_q < 0.0 else 1.0)
            depths.append(depth)
            self.cells.append(cell)
            self.log_c.append(table[cell])
            cal.append(cal[parent] + table[cell])
        self.parents += links
        self.ranks += ranks

    @classmethod
    def of(cls, tree: DraftTree, calibration: Calibration, run: int = 0) -> "HostTree":
        """A whole tree, read at once."""
        host = cls(run)
        host.extend(tree, calibration)
        return host


def subtree(tree: DraftTree, keep: list[int], parents: list[int]) -> DraftTree:
    """``tree.select(keep)`` for a ``keep`` known on the host to be sorted, rooted and
    ancestor-closed, with its re-indexed ``parents``: a few gathers instead of select's checks
    and index arithmetic (on a tiny model they cost more than the choice itself). A prefix
    (a plain step, a layer-wise tree cut after its best nodes) is a slice of every field."""
    if tree.has_host() and tree.origin is None:  # lists in, lists out: the kept indices are the origins
        lists = tree.host()
        return DraftTree.from_lists([lists.tokens[i] for i in keep], parents, [lists.depths[i] for i in keep],
                                    [lists.logp[i] for i in keep], [lists.ranks[i] for i in keep], tree.device,
                                    origin=None if keep[-1] == len(keep) - 1 else list(keep))
    if keep[-1] == len(keep) - 1:
        m = len(keep)
        return replace(tree, tokens=tree.tokens[:m], parents=tree.parents[:m], depths=tree.depths[:m],
                       logp=tree.logp[:m], ranks=tree.ranks[:m], _cache={},
                       draft_probs=None if tree.draft_probs is None else tree.draft_probs[:m],
                       origin=None if tree.origin is None else tree.origin[:m])
    index = torch.tensor(keep, dtype=torch.long, device=tree.device)
    pick = lambda values: torch.index_select(values, 0, index)  # noqa: E731 (cheaper than [index])
    return replace(tree, tokens=pick(tree.tokens), parents=torch.tensor(parents, dtype=torch.long, device=tree.device),
                   depths=pick(tree.depths), logp=pick(tree.logp), ranks=pick(tree.ranks), _cache={},
                   draft_probs=None if tree.draft_probs is None else pick(tree.draft_probs),
                   # A tree never re-indexed is its own origin: the kept indices are the origins.
                   origin=index if tree.origin is None else pick(tree.origin))


def closed(keep: list[int], parents: list[int]) -> list[int]:
    """``keep`` plus any missing ancestor (a guard: the ordering already makes it closed)."""
    have = set(keep)
    for i in list(keep):
        p = parents[i]
        while p > 0 and p not in have:
            have.add(p)
            p = parents[p]
    return sorted(have)

