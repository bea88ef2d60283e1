"""A stand-in for BatchCurves that the allocator tests price batches with."""

from __future__ import annotations

from specframe.sizing.profile import CostCurve


class Curves:
    """Stand-in BatchCurves: T(n) per row at any live size from ``seconds(n)``."""

    def __init__(self, seconds) -> None:
        self.seconds = seconds

    def row_curve(self, live: int) -> CostCurve:
        sizes = list(range(1, 33))
        return CostCurve("test", sizes, [256], [[self.seconds(n) / live for n in sizes]])
