"""The clock a time-aware plugin reads, and a deterministic one to put in its place.

A drafter whose decisions read the wall clock (the hybrid's cascade with ``threshold =
"auto"`` times each step) draws different trees on every run, so properties that compare two
instances fed the same calls cannot hold for it. Such a drafter declares ``uses_clock`` and
takes its clock through ``Drafter.set_clock``; the conformance suite gives every drafter it
builds a :class:`TickClock`, under which the same calls make the same decisions.
"""

from __future__ import annotations

import time
from typing import Callable

#: A source of seconds (``time.perf_counter`` is the default everywhere).
Clock = Callable[[], float]

#: The wall clock: monotonic seconds.
wall_clock: Clock = time.perf_counter


class TickClock:
    """A clock whose every reading is ``tick`` seconds after the previous one (the first is 0).

    Two instances read the same number of times return the same readings, so a drafter under
    test decides the same way however fast the machine runs the test.
    """

    def __init__(self, tick: float = 0.01) -> None:
        if not tick > 0:
            raise ValueError(f"tick must be > 0 seconds, got {tick!r}")
        self.tick = float(tick)
        self.readings = 0

    def __call__(self) -> float:
        """The next reading."""
        now = self.readings * self.tick
        self.readings += 1
        return now
