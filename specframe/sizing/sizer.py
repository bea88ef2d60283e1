"""The auto sizer: chooses each step's tree size from the cost curve and the acceptance history.

The expected accepted length of a tree is the sum of the calibrated path probabilities of its
drafted nodes (the product of ``c`` along each path, :mod:`.calibration`). A tree of n nodes
yields ``1 + E(n)`` tokens per step and costs what :mod:`.cost` models; the chooser keeps the top-n
nodes by calibrated path probability (a prefix-closed tree, :mod:`.prune`), n maximising the
rate (n = 1: root only, a plain step). :mod:`.growth` keeps the built trees near that size.
docs/auto-sizing.md has the argument.
"""

from __future__ import annotations

import math
import time
from typing import Any

from specframe.interfaces import DraftSession, StepStats
from specframe.tree import DraftTree

from specframe.sizing.calibration import Calibration, RankAcceptance
from specframe.sizing.cost import CostModel
from specframe.sizing.growth import GrowthControl
from specframe.sizing.prune import HostTree, closed, subtree


class AutoSizer(CostModel, GrowthControl):
    """Chooses each step's tree size from the cost curve and the acceptance history.

    The engine-facing protocol, in a step's order: :meth:`skip` (a plain step in a dry spell),
    :meth:`begin`, the policy's layers with :func:`~specframe.sizing.stop_growing` after each,
    :meth:`prune`, and after verification :meth:`observe`. :class:`~specframe.sizing.AutoSizedPolicy`
    runs it for a policy."""

    def __init__(self, max_size: int, start_cap: int = 8) -> None:
        CostModel.__init__(self, max_size)
        GrowthControl.__init__(self, start_cap)
        self.calibration = Calibration()
        self.ranks = RankAcceptance()
        self.run = 0  # drafted tokens the last verified step of this sequence accepted
        self._host: HostTree | None = None  # the tree being grown
        self._grown: DraftTree | None = None  # ... as last scored
        self._last: dict[str, Any] | None = None

    def reset(self) -> None:
        """New generation: the per-sequence state goes; what was learned about the pair stays."""
        self._last = None
        self._host = self._grown = None
        self.run = 0

    # ------------------------------------------------------------------ growing
    def begin(self) -> None:
        """A build starts: layer timing runs from here, scoring from the root."""
        self._layer_start = time.perf_counter()
        self._layers = 0
        self._guesses = []
        self._host = HostTree(self.run)
        self._grown = None

    def grown(self, tree: DraftTree) -> HostTree:
        """Host view of the tree being grown, extended by the nodes added since the last call."""
        if self._host is None:
            self._host = HostTree(self.run)
        self._host.extend(tree, self.calibration)
        self._grown = tree
        return self._host

    # ------------------------------------------------------------------ choosing
    def prune(self, tree: DraftTree, session: DraftSession, choose: bool = True) -> DraftTree:
        """Keep the top-n nodes by calibrated path probability, n maximising the modelled rate
        (``choose=False``: keep the whole tree, only record it for :meth:`observe`)."""
        if self._layer_start is not None and len(tree) > 1:
            self.layer_done()  # the last layer ends here (growing loops skip the useless check)
        host = self._host if self._grown is tree and self._host is not None else HostTree.of(tree, self.calibration, self.run)
        self._host = self._grown = None
        self._layer_start = None
        n = len(host)
        # Stable and reversed: equal path probabilities keep index order (the smaller index first).
        order = sorted(range(1, n), key=host.cal.__getitem__, reverse=True)
        context = getattr(session, "context_len", None)
        m, steady = self._best_sizes(host, order, session.draft_time, context)
        m = m if choose else n
        self.kept.append(steady)
        # A dry spell: drafting does not pay for itself in steady state (even if this step's
        # sunk draft is worth verifying).
        self.dry = self.dry + 1 if steady == 1 else 0
        keep = closed(sorted([0] + order[: m - 1]), host.parents)
        index = {old: new for new, old in enumerate(keep)}
        self._last = {"parents": [index[host.parents[i]] if i else -1 for i in keep],
                      "ranks": [host.ranks[i] for i in keep], "cells": [host.cells[i] for i in keep],
                      "context": context}
        if len(keep) == n:
            return tree
        return subtree(tree, keep, self._last["parents"])

    def _best_sizes(self, host: HostTree, order: list[int], sunk: float, context: int | None) -> tuple[int, int]:
        """The sizes m that maximise the modelled rate of the top-m tree (``order``: nodes by
        calibrated path probability), ties to the smaller tree: this step's, where the draft
        time ``sunk`` is spent and only the target's cost depends on the size, and the steady
        state's, where a size also costs the draft layers it needs (one forward per depth level
        of its top-m). One pass; :meth:`rates` with :meth:`_layer_costs` is the reference."""
        table, scale = self._curve_table(len(order) + 1, context)
        cal, depths, exp = host.cal, host.depths, math.exp
        over, per_node = self.overhead - self.node_overhead, self.node_overhead
        expected, deepest, drafts = 0.0, 0, 0.0
        best_now = best_steady = -1.0
        m_now = m_steady = 1
        for m in range(1, len(order) + 2):
            if m > 1:
                i = order[m - 2]
                expected += exp(cal[i])
                if depths[i] > deepest:
                    deepest = depths[i]
                    drafts = self.draft_seconds(deepest)
            t = scale * table[m - 1] + over + per_node * m
            now, steady = (1.0 + expected) / (t + sunk), (1.0 + expected) / (t + drafts)
            if now > best_now:
                best_now, m_now = now, m
            if steady > best_steady:
                best_steady, m_steady = steady, m
        return m_now, m_steady

    def _layer_costs(self, order: list[int], depths: list[int]) -> list[float]:
        """Draft seconds of the top-m trees, m = 1..n: :meth:`draft_seconds` of their depth."""
        deepest, out = 0, [0.0]
        for i in order:
            deepest = max(deepest, depths[i])
            out.append(self.draft_seconds(deepest))
        return out

    # ------------------------------------------------------------------ learning
    def observe(self, step: StepStats) -> float:
        """Learn from one verified step; returns its modelled rate (tokens per second)."""
        last, self._last = self._last, None
        self.run = step.accepted
        if last is None or len(last["parents"]) != step.tree_size:
            return 0.0
        self._learn_acceptance(last, step.accepted_ranks)
        self._check_guesses(step.accepted)
        return self.observe_timing(step.tree_size, last["context"], step)

    def _learn_acceptance(self, last: dict[str, Any], accepted_ranks: list[int]) -> None:
        """Walk the accepted path by ranks; every child of a path node was tried."""
        parents, ranks, cells = last["parents"], last["ranks"], last["cells"]
        children: dict[int, list[int]] = {}
        for i in range(1, len(parents)):
            children.setdefault(parents[i], []).append(i)
        node, tried, ok = 0, [], []
        depth = 0
        while True:
            kids = children.get(node, [])
            nxt = None
            if depth < len(accepted_ranks):
                match = [k for k in kids if ranks[k] == accepted_ranks[depth]]
                if len(match) != 1:
                    return  # ranks do not identify the path (unknown ranks): learn nothing
                nxt = match[0]
            tried += [cells[k] for k in kids]
            ok += [k == nxt for k in kids]
            if node == 0:
                self.ranks.record([ranks[k] for k in kids], None if nxt is None else ranks[nxt])
            if nxt is None:
                break
            node, depth = nxt, depth + 1
        self.calibration.record(tried, ok)
