"""Batch allocators: how batched decoding splits one node budget across the live sequences.

A :class:`BatchAllocator` is a plugin kind of its own, registered through the
``register_batch_allocators`` hook (the built-ins ``equal`` and ``shared`` live in
``specframe.strategies.allocators`` and register exactly as a third party would). Each step the
batch engine asks it for every live sequence's build budget, lets each policy build its tree,
then hands the trees to :meth:`BatchAllocator.trim`, which must return trees whose sizes sum to
at most the batch budget (the engine checks this and names the allocator if not).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

from specframe.interfaces import StepStats
from specframe.options import build_options, describe_options
from specframe.tree import DraftTree


@dataclass
class AllocatorOptions:
    """Options every allocator takes.

    Attributes:
        budget: nodes (roots included) of all trees of one step together; None = no batch-wide
            limit (every sequence builds up to its policy's own budget).
    """

    budget: int | None = None


@dataclass
class StepAccount:
    """One step's tokens and seconds: what an allocator that models the step expects of it, or
    what it measured.

    Attributes:
        tokens: tokens the step emits over all its rows (their bonus tokens included).
        target_time: the target forward.
        build_time: drafting and building every row's tree.
        overhead_time: the rest of the step (verification, host read, bookkeeping).
    """

    tokens: float
    target_time: float
    build_time: float = 0.0
    overhead_time: float = 0.0

    @property
    def step_time(self) -> float:
        """The whole step."""
        return self.target_time + self.build_time + self.overhead_time


class BatchAllocator(ABC):
    """Splits one step's node budget across the live sequences of a batch."""

    name: ClassVar[str] = ""
    Options: ClassVar[type] = AllocatorOptions
    #: Whether the allocator prices the batch: the batch decoder then hands it the target's cost
    #: curves at the batch shape (:meth:`price_batch`) before the first step of a generation.
    wants_batch_curve: ClassVar[bool] = False

    def __init__(self, options: Any) -> None:
        self.options = options

    def price_batch(self, curves: Any, layout: str) -> None:
        """Take the target's :class:`~specframe.decode.batch_curves.BatchCurves` (every live
        batch size up to the generation's width) and the batch cache ``layout`` (``"padded"``
        or ``"flat"``); called only when :attr:`wants_batch_curve` is set. Default: ignore."""

    def total(self, caps: Sequence[int]) -> int:
        """This step's batch budget: the ``budget`` option, or the sum of the sequences' caps."""
        budget = getattr(self.options, "budget", None)
        return sum(caps) if budget is None else int(budget)

    @abstractmethod
    def budgets(self, caps: Sequence[int], history: Sequence[Sequence[StepStats]], total: int) -> list[int]:
        """The build budget of each live sequence, each in ``[1, caps[b]]``.

        ``caps[b]``: the most nodes sequence b's tree may have (its policy's budget, or the room
        left in its context); ``history[b]``: its steps so far; ``total`` >= ``len(caps)``;
        ``len(caps)``: the live batch size. A budget of 1 switches the sequence's speculation
        off for the step: it is not built (no policy call, no draft forward) and verifies its
        root alone, as a plain decoding step.
        """

    def prediction(self) -> StepAccount | None:
        """What the allocator expects of the step its last :meth:`budgets` call decided, for the
        batch decoder to record beside what the step measured (docs/load.md); None (the
        default): it makes no prediction."""
        return None

    def observe_step(self, measured: StepAccount) -> None:
        """What the step its last :meth:`budgets` call decided measured (``overhead_time``: the
        step less its forward and its trees' building), for an allocator that calibrates its
        model. Default: ignore."""

    def trim(self, trees: Sequence[DraftTree], total: int) -> list[DraftTree]:
        """The trees to verify, sizes summing to at most ``total`` (default: as built)."""
        return list(trees)


def water_fill(caps: Sequence[int], total: int) -> list[int]:
    """``total`` nodes dealt one at a time round-robin to the rows below their cap: an equal
    split that hands a capped row's share to the others. Every row gets at least 1."""
    shares = [1] * len(caps)
    left = total - len(caps)
    while left > 0:
        open_rows = [b for b, cap in enumerate(caps) if shares[b] < cap]
        if not open_rows:
            break
        for b in open_rows[:left]:
            shares[b] += 1
        left -= min(left, len(open_rows))
    return shares


def allocator_classes() -> dict[str, type]:
    """Every registered allocator class by name (through the plugin registry's hook)."""
    from specframe.plugins import PluginError, get_registry

    found: dict[str, type] = {}

    def register(cls: type) -> None:
        name = getattr(cls, "name", "")
        if not name:
            raise PluginError(f"allocator class {cls.__qualname__} has no `name`")
        if name in found and found[name] is not cls:
            raise PluginError(f"allocator name {name!r} registered twice "
                              f"({found[name].__qualname__}, {cls.__qualname__})")
        found[name] = cls

    get_registry().pm.hook.register_batch_allocators(register=register)
    return found


def make_allocator(spec: Any) -> BatchAllocator:
    """An allocator from a name, ``(name, {options})`` or an instance."""
    if isinstance(spec, BatchAllocator):
        return spec
    name, values = (spec, {}) if isinstance(spec, str) else (spec[0], dict(spec[1] or {}))
    classes = allocator_classes()
    if name not in classes:
        raise ValueError(f"unknown allocator {name!r}; available allocators: {', '.join(sorted(classes))}")
    cls = classes[name]
    return cls(build_options(cls.Options, values, f"allocator {name!r}"))


def check_allocation(allocator: BatchAllocator, caps: Sequence[int], history: Sequence[Sequence[StepStats]],
                     total: int, build: Any) -> list[DraftTree]:
    """One allocation step checked against the rules the batch engine enforces (for an
    allocator's own tests; ``tests/test_batch.py`` runs it on every registered allocator).

    ``build(b, budget)``: a valid tree of at most ``budget`` nodes for row b (a stand-in for the
    policy). Raises AssertionError naming the broken rule; returns the trimmed trees.
    """
    name = allocator.name
    budgets = allocator.budgets(caps, history, total)
    assert len(budgets) == len(caps), f"allocator {name!r}: {len(budgets)} budgets for {len(caps)} sequences"
    for b, (budget, cap) in enumerate(zip(budgets, caps)):
        assert 1 <= budget <= cap, f"allocator {name!r}: budget {budget} of sequence {b} outside [1, {cap}]"
    built = [build(b, budget) for b, budget in enumerate(budgets)]
    trees = allocator.trim(built, total)
    assert len(trees) == len(built), f"allocator {name!r}: trim returned {len(trees)} trees for {len(built)}"
    size = sum(len(t) for t in trees)
    assert size <= total, f"allocator {name!r}: {size} nodes kept, over the batch budget {total}"
    for b, (tree, before) in enumerate(zip(trees, built)):
        tree.check_valid(len(before))
        assert int(tree.tokens[0]) == int(before.tokens[0]), f"allocator {name!r}: sequence {b} lost its root"
    return trees


def describe_allocators() -> list[tuple[str, str, str]]:
    """``(name, module, options with their defaults)`` of every registered batch allocator, by
    name: what ``specframe plugins`` lists."""
    return [(name, cls.__module__, ", ".join(f"{n}: {t} = {d!r}" for n, t, d in describe_options(cls.Options)) or "-")
            for name, cls in sorted(allocator_classes().items())]
