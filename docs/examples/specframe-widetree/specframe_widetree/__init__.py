"""specframe-widetree: the ``widetree`` tree policy of the tutorial (docs/tutorial-policy.md)."""

from dataclasses import dataclass

import torch

import specframe
from specframe.options import require
from specframe.search_space import tunable


@dataclass
class WideTreeOptions(specframe.AutoBudgetOptions):
    """Options of ``widetree``: ``budget`` = tree size with the root, or ``"auto"`` (sized each step,
    up to ``max_budget``); ``width`` = nodes per layer."""

    budget: int | str = tunable(32, low=4, high=64, log=True)   # `specframe tune` searches these
    width: int = tunable(8, low=1, high=16)

    def __post_init__(self) -> None:
        super().__post_init__()  # AutoBudgetOptions checks the budget and max_budget
        require(self.width >= 1, "width", f"must be >= 1, got {self.width}")


class WideTreePolicy(specframe.AutoSizedPolicy):
    """Each layer keeps the ``width`` best children of the whole frontier (a beam) until the budget is spent."""

    name = "widetree"
    Options = WideTreeOptions

    def grow(self, session, growth):
        budget = growth.nodes                                                 # N, or this step's build cap
        tree = session.new_tree()
        frontier = torch.zeros(1, dtype=torch.long, device=tree.device)    # start at the root
        while len(tree) < budget:
            logp = session.expand(tree, frontier)                             # ONE draft forward per layer
            k = min(self.options.width, budget - len(tree))
            values, tokens, ranks = specframe.topk_per_row(logp, k)           # per-row top-k, tie rule kept
            scores = tree.logp[frontier, None].double() + values.double().clamp(max=0)   # cumulative log-prob
            best = specframe.top_indices(scores.flatten(), k)                 # finite only; ties: lower row, token
            if len(best) == 0:                                                # never draft a -inf token
                break
            rows = best // values.shape[1]
            tree = tree.add_nodes(frontier[rows], tokens.flatten()[best], scores.flatten()[best],
                                  ranks=ranks.flatten()[best])
            frontier = torch.arange(len(tree) - len(best), len(tree), device=tree.device)
            if growth.stop(tree, frontier, last=len(tree) >= budget):      # "auto": would a layer pay?
                break
        return tree


@specframe.hookimpl
def register_tree_policies(register):
    """Called by specframe's plugin manager: register this package's policies."""
    register(WideTreePolicy)
