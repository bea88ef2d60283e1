"""Policy ``chain``: a single path of gamma greedily drafted tokens (classic speculative decoding)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specframe.interfaces import DraftSession, StepStats, TreePolicy
from specframe.options import require
from specframe.tree import DraftTree

from ._helpers import topk_children

SCHEDULES = ("constant", "heuristic")


@dataclass
class ChainOptions:
    """Options of the ``chain`` policy.

    Attributes:
        gamma: tokens drafted per step (the tree has gamma + 1 nodes with the root).
        schedule: ``constant``, or ``heuristic`` (HF assisted generation: gamma += 2 after a
            fully accepted draft, else gamma = max(1, gamma - 1)).
        max_gamma: upper bound of gamma under the heuristic schedule.
        confidence_stop: stop drafting after a token whose draft probability is below
            ``confidence_threshold`` (that token is still kept), as HF's
            ``assistant_confidence_threshold``.
        confidence_threshold: threshold of the confidence stop (HF default 0.4).
    """

    gamma: int = 4
    schedule: str = "constant"
    max_gamma: int = 32
    confidence_stop: bool = False
    confidence_threshold: float = 0.4

    def __post_init__(self) -> None:
        require(self.gamma >= 1, "gamma", f"must be >= 1, got {self.gamma}")
        require(self.schedule in SCHEDULES, "schedule", f"must be one of {SCHEDULES}, got {self.schedule!r}")
        require(self.max_gamma >= self.gamma, "max_gamma", f"must be >= gamma ({self.gamma}), got {self.max_gamma}")
        require(0.0 <= self.confidence_threshold <= 1.0, "confidence_threshold", "must be in [0, 1]")


class ChainPolicy(TreePolicy):
    """Drafts a chain: each step expands only the newest node and keeps its top-1 child."""

    name = "chain"
    Options = ChainOptions

    def __init__(self, options: ChainOptions) -> None:
        super().__init__(options)
        self.reset()

    @property
    def budget(self) -> int:
        """Largest chain the schedule can ask for, root included."""
        top = self.options.max_gamma if self.options.schedule == "heuristic" else self.options.gamma
        return top + 1

    def reset(self) -> None:
        """Restart the schedule at the configured gamma."""
        self.gamma = self.options.gamma

    def build(self, session: DraftSession, budget: int) -> DraftTree:
        """Draft up to gamma tokens greedily, one draft forward per token."""
        tree = session.new_tree()
        node = 0
        for _ in range(min(self.gamma, budget - 1)):
            logp = session.expand(tree, [node])
            values, tokens, ranks = topk_children(logp, 1)
            tree = tree.add_nodes(torch.tensor([node]), tokens[0], tree.logp[node] + values[0], ranks[0])
            node = len(tree) - 1
            if self.options.confidence_stop and float(values[0, 0].exp()) < self.options.confidence_threshold:
                break
        return tree

    def observe(self, step: StepStats) -> None:
        """Heuristic schedule: grow after a fully accepted draft, shrink otherwise."""
        if self.options.schedule != "heuristic":
            return
        if step.accepted == step.tree_size - 1:
            self.gamma = min(self.options.max_gamma, self.gamma + 2)
        else:
            self.gamma = max(1, self.gamma - 1)
