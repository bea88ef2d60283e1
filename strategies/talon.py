"""Policy ``talon``: budget-driven, confidence-gated adaptive tree (TALON, arXiv 2601.07353, Alg. 2).

Each layer expands every node of the previous layer in ONE draft forward. The first
``init_layers`` layers keep the Top-K children (robust start); later layers keep every child
whose cumulative probability is at least ``mu`` times the best cumulative probability of the
whole layer (a min-p gate anchored at the layer's argmax). A layer that would overflow the
budget keeps only its best ``N - |T|`` nodes, so the tree always ends with exactly N nodes
(given a drafter with enough finite candidates). Confident drafts give deep, narrow trees;
uncertain ones give shallow, wide trees, and the number of draft forwards adapts with them.

``budget="auto"`` sizes each tree from the measured cost curve and the acceptance history and
``mu="auto"`` picks the gate online (:mod:`specframe.sizing`, docs/auto-sizing.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from specframe.building import append_children, child_scores
from specframe.interfaces import DraftSession, StepStats
from specframe.options import require
from specframe.search_space import tunable
from specframe.selection import top_host_indices, top_indices
from specframe.sizing import AUTO, AutoBudgetOptions, AutoSizedPolicy, AutoSizer, Growth, MuBandit
from specframe.tree import DraftTree, as_float32


@dataclass
class TalonOptions(AutoBudgetOptions):
    """Options of the ``talon`` policy.

    Attributes:
        budget: N, the tree size including the root (N = 60 means 59 drafted nodes), or
            ``"auto"``: each step keeps the size that maximises modelled tokens per second
            (measured cost curve, running acceptance statistics), up to ``max_budget``.
            (From :class:`AutoBudgetOptions`, with ``max_budget``.)
        mu: relative gate in (0, 1]: a candidate survives when p(u) >= mu * max p over the layer.
            Smaller mu keeps more nodes per layer (wider, shallower trees). ``"auto"``: chosen
            online by a bandit over a grid of gates (reward: tokens per modelled second).
        top_k: K, the number of nodes kept by each of the first ``init_layers`` layers (with
            ``budget="auto"``: at most the step's build cap minus one, on top of the cap, and
            only the ranks whose calibrated acceptance pays for their row).
        init_layers: how many leading layers use Top-K instead of the gate (paper: 1).
        max_budget: the largest tree ``budget="auto"`` may build.
    """

    mu: float | str = tunable(0.03, low=0.003, high=1.0, log=True)
    top_k: int = tunable(10, low=1, high=16)
    init_layers: int = tunable(1, low=0, high=3)

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.mu == AUTO or (isinstance(self.mu, (int, float)) and 0.0 < self.mu <= 1.0), "mu",
                f"must be in (0, 1] or \"auto\", got {self.mu!r}")
        require(self.top_k >= 1, "top_k", f"must be >= 1, got {self.top_k}")
        require(self.init_layers >= 0, "init_layers", f"must be >= 0, got {self.init_layers}")


class TalonPolicy(AutoSizedPolicy):
    """TALON's budget-driven adaptive tree: Top-K start, then a relative confidence gate."""

    name = "talon"
    Options = TalonOptions

    def __init__(self, options: TalonOptions) -> None:
        super().__init__(options)
        self.bandit = MuBandit() if options.mu == AUTO else None
        if self.bandit is not None and self.sizer is None:
            # The cost model also prices the bandit's rewards, so a fixed budget with mu="auto" has one.
            self.sizer = AutoSizer(options.max_budget)

    def observe(self, step: StepStats) -> None:
        """Feed the auto sizer and the mu bandit (which persists across sequences, like the
        acceptance statistics)."""
        rate = self.observed_rate(step)
        if self.bandit is not None and rate > 0.0 and step.draft_forwards:
            self.bandit.reward(rate)

    def grow(self, session: DraftSession, growth: Growth) -> DraftTree:
        """TALON's layer loop (Alg. 2) up to ``growth.nodes`` nodes. Under ``budget="auto"`` the
        root's Top-K (narrowed to the ranks that pay) come on top of the build cap: the chooser
        drops the children that do not pay, and the layers below keep the cap's room."""
        mu = self.bandit.choose() if self.bandit is not None else float(self.options.mu)
        top_k = growth.root_width(self.options.top_k)
        n_max = min(growth.budget, growth.nodes + top_k) if growth.auto else growth.nodes
        log_mu = math.log(mu)
        if session.device.type == "cpu":
            return grow_on_host(session, growth, n_max, top_k, self.options.init_layers, log_mu)
        return self.grow_tensors(session, growth, n_max, top_k, log_mu)

    def grow_tensors(self, session: DraftSession, growth: Growth, n_max: int, top_k: int,
                     log_mu: float) -> DraftTree:
        """:meth:`grow`'s layer loop over tensors (every device): :func:`grow_on_host` is its
        CPU fast path, held equal to it by tests/test_host_trees.py."""
        tree = session.new_tree()
        scores = torch.zeros(1, dtype=torch.float64, device=tree.device)
        frontier = torch.zeros(1, dtype=torch.long, device=tree.device)
        depth = 0
        while len(tree) < n_max and len(frontier):
            room = n_max - len(tree)
            initial = depth < self.options.init_layers
            keep_at_most = min(room, top_k) if initial else room
            # Only a parent's top-`keep_at_most` children can survive the final truncation,
            # so a per-row partial top-k replaces a pass over the whole vocabulary.
            values, tokens, ranks = session.expand_top(tree, frontier, keep_at_most)
            cand = child_scores(scores[frontier], values)
            flat_scores = cand.flatten()
            if not initial:
                gate = flat_scores.max() + log_mu  # anchor: best child of ALL frontier nodes
                flat_scores = torch.where(flat_scores >= gate, flat_scores, -math.inf)
            chosen = top_indices(flat_scores, keep_at_most)
            if not len(chosen):
                break  # the drafter offered no finite candidate
            # Siblings stay together: append in (parent, rank) order.
            chosen = torch.sort(chosen).values
            tree, scores, frontier = append_children(tree, scores, frontier, chosen, cand, tokens, ranks)
            depth += 1
            if growth.stop(tree, frontier, last=len(tree) >= n_max):
                break
        return tree


def grow_on_host(session: DraftSession, growth: Growth, n_max: int, top_k: int, init_layers: int,
                 log_mu: float) -> DraftTree:
    """TALON's layer loop (:meth:`TalonPolicy.grow_tensors`) over host lists, for the CPU: each
    layer is a few dozen candidates, which Python scores, gates and ranks in microseconds where
    a dozen tensor ops cost tens each. The same tree, node for node: cumulative scores in float64
    (a double), a child's draft log-prob clamped at 0, the gate anchored at the layer's best,
    the best ``keep`` finite candidates by score then index, appended in (parent, rank) order."""
    tokens, parents, depths, logp, ranks = [session.root_token], [-1], [0], [0.0], [-1]
    scores, frontier = [0.0], [0]
    tree = DraftTree.from_lists(tokens, parents, depths, logp, ranks, session.device)
    depth = 0
    while len(tokens) < n_max and frontier:
        room = n_max - len(tokens)
        keep_at_most = min(room, top_k) if depth < init_layers else room
        rows, _ = session.expand_top_lists(tree, frontier, keep_at_most)
        k = len(rows[0][0])
        cand = [scores[node] + min(value, 0.0) for node, (values, _, _) in zip(frontier, rows) for value in values]
        if depth >= init_layers:
            gate = math.nan if any(c != c for c in cand) else max(cand) + log_mu  # torch's max keeps a NaN
            cand = [c if c >= gate else -math.inf for c in cand]
        chosen = sorted(top_host_indices(cand, keep_at_most))
        if not chosen:
            break  # the drafter offered no finite candidate
        first = len(tokens)
        for flat in chosen:
            row, j = divmod(flat, k)
            parent = frontier[row]
            tokens.append(rows[row][1][j])
            parents.append(parent)
            depths.append(depths[parent] + 1)
            logp.append(as_float32(cand[flat]))
            ranks.append(rows[row][2][j])
            scores.append(cand[flat])
        frontier = list(range(first, len(tokens)))
        tree = DraftTree.from_lists(tokens, parents, depths, logp, ranks, session.device)
        depth += 1
        if growth.stop(tree, frontier, last=len(tokens) >= n_max):
            break
    return tree

