"""specframe-widetree: the ``widetree`` tree policy of the tutorial (docs/tutorial-policy.md)."""

from dataclasses import dataclass

import torch

import specframe
from specframe.options import require


@dataclass
class WideTreeOptions:
    """Options of ``widetree``: ``budget`` = tree size with the root, ``width`` = nodes per layer."""

    budget: int = 32
    width: int = 8

    def __post_init__(self) -> None:
        require(self.budget >= 1, "budget", f"must be >= 1, got {self.budget}")
        require(self.width >= 1, "width", f"must be >= 1, got {self.width}")


class WideTreePolicy(specframe.TreePolicy):
    """Each layer keeps the ``width`` best children of the whole frontier (a beam) until the budget is spent."""

    name = "widetree"
    Options = WideTreeOptions

    def build(self, session, budget):
        tree = session.new_tree()
        frontier = torch.zeros(1, dtype=torch.long, device=tree.device)    # start at the root
        budget = min(budget, self.budget)
        while len(tree) < budget:
            logp = session.expand(tree, frontier)                             # ONE draft forward per layer
            scores = tree.logp[frontier, None].double() + logp.double().clamp(max=0)   # cumulative log-prob
            k = min(self.options.width, budget - len(tree), scores.numel())
            best = torch.topk(scores.flatten(), k)
            keep = torch.isfinite(best.values)                                # never draft a -inf token
            if not bool(keep.any()):
                break
            flat, vocab = best.indices[keep], logp.shape[-1]
            tree = tree.add_nodes(frontier[flat // vocab], flat % vocab, best.values[keep])
            frontier = torch.arange(len(tree) - len(flat), len(tree), device=tree.device)
        return tree


@specframe.hookimpl
def register_tree_policies(register):
    """Called by specframe's plugin manager: register this package's policies."""
    register(WideTreePolicy)
