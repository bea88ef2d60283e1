"""The public route to ``budget = "auto"`` for any tree policy (docs/auto-sizing.md, "The public route").

A policy inherits :class:`AutoSizedPolicy`, takes :class:`AutoBudgetOptions` (or a subclass) and
implements ``grow(session, growth)``: build a tree of at most ``growth.nodes`` nodes, calling
``growth.stop(tree, new_nodes)`` after each layer. The base's :meth:`AutoSizedPolicy.build` does
the rest: a fixed budget hands ``grow`` the budget and a check that never stops; ``"auto"`` skips
drafting in dry spells, hands ``grow`` the step's build cap and a real check, and prunes the tree
to the top-n that pays.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import Any

from specframe.interfaces import DraftSession, StepStats, TreePolicy
from specframe.options import BudgetOptions, require
from specframe.search_space import tunable
from specframe.tree import DraftTree

from specframe.sizing.growth import Growth
from specframe.sizing.sizer import AutoSizer

AUTO = "auto"


def check_size_option(value: Any, option: str, minimum: int) -> None:
    """``value`` must be an int >= ``minimum`` or ``"auto"`` (an :class:`~specframe.options.OptionError`
    naming ``option`` otherwise)."""
    if isinstance(value, str):
        require(value == AUTO, option, f"must be an int or \"auto\", got {value!r}")
    else:
        require(value >= minimum, option, f"must be >= {minimum}, got {value} (or \"auto\")")


def auto_top_k(top_k: int, cap: int) -> int:
    """Width of a frontier under a build cap: a quarter of the cap (at most ``top_k``), so a
    small tree keeps room for depth instead of spending everything on one layer."""
    return min(top_k, max(1, cap // 4))


@dataclass
class AutoBudgetOptions(BudgetOptions):
    """:class:`~specframe.options.BudgetOptions` whose budget may also be ``"auto"``.

    Attributes:
        budget: N, the tree size including the root, or ``"auto"``: each step keeps the size
            that maximises modelled tokens per second, up to ``max_budget``.
        max_budget: the largest tree ``budget="auto"`` may build.
    """

    # The search draws fixed sizes; "auto" stays what an arm may give.
    budget: int | str = tunable(60, low=2, high=64, log=True)
    max_budget: int = 64

    def __post_init__(self) -> None:
        check_size_option(self.budget, "budget", 2)
        require(self.max_budget >= 2, "max_budget", f"must be >= 2, got {self.max_budget}")


class AutoSizedPolicy(TreePolicy):
    """Base of the policies whose size may be ``"auto"``.

    Subclasses implement :meth:`grow`; :meth:`build` runs the sizer around it. ``self.sizer``
    is an :class:`AutoSizer` under ``budget="auto"`` (None for a fixed size); a subclass may
    create one for a fixed size too (to price a bandit's rewards): it then only observes.
    Options must provide ``budget`` and ``max_budget`` (:class:`AutoBudgetOptions`), or the
    subclass overrides :attr:`auto_size` and :attr:`max_budget`."""

    sizer: AutoSizer | None = None

    def __init__(self, options: Any) -> None:
        super().__init__(options)
        self.sizer = AutoSizer(self.max_budget) if self.auto_size else None

    @property
    def auto_size(self) -> bool:
        """Whether the size is ``"auto"``."""
        return self.options.budget == AUTO

    @property
    def max_budget(self) -> int:
        """N, or ``max_budget`` under ``budget="auto"``."""
        return self.options.max_budget if self.options.budget == AUTO else int(self.options.budget)

    def build(self, session: DraftSession, budget: int) -> DraftTree:
        """Build with :meth:`grow`: the whole ``budget`` for a fixed size; under ``"auto"`` the
        step's build cap, then keep the top-n nodes that maximise modelled tokens per second."""
        if not self.auto_size:
            tree = self.grow(session, Growth(budget, budget))
            return tree if self.sizer is None else self.sizer.prune(tree, session, choose=False)
        skipped = self.sizer.skip(session)
        if skipped is not None:
            return skipped  # a plain step in a dry spell
        self.sizer.begin()
        nodes = min(int(budget), self.sizer.cap)
        tree = self.grow(session, Growth(nodes, budget, self.sizer, session))
        return self.sizer.prune(tree, session)

    @abstractmethod
    def grow(self, session: DraftSession, growth: Growth) -> DraftTree:
        """Draft a tree of at most ``growth.nodes`` nodes (root included), calling
        ``growth.stop(tree, new_nodes)`` after each layer and stopping when it says so."""

    def attach(self, target: Any) -> None:
        """Auto sizes read the target's cost curve (measured and cached on first use)."""
        if self.sizer is not None:
            self.sizer.attach(target)

    @property
    def wants_batch_curve(self) -> bool:
        """Auto sizes price a batched step at the batch shape (docs/batching.md)."""
        return self.sizer is not None

    def price_batch(self, curve: Any) -> None:
        """Price trees with ``curve`` (one row's share of a batched forward) from now on."""
        if self.sizer is not None:
            self.sizer.curve = curve

    def reset(self) -> None:
        """Per-sequence state goes; acceptance statistics persist (same pair)."""
        if self.sizer is not None:
            self.sizer.reset()

    def observe(self, step: StepStats) -> None:
        """Feed the auto sizer."""
        self.observed_rate(step)

    def observed_rate(self, step: StepStats) -> float:
        """Feed the auto sizer; the step's modelled token rate (0 without a sizer)."""
        return 0.0 if self.sizer is None else self.sizer.observe(step)
