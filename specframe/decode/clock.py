"""The step's clock: consecutive intervals of one timer, each charged to a named field of
:class:`~specframe.interfaces.StepStats`, so the fields of a step sum to its wall time by
construction (an interval is always charged to some field; none is measured twice)."""

from __future__ import annotations

import time

from specframe.interfaces import TIME_FIELDS

#: The fields a step's intervals are charged to (``StepStats`` attributes, seconds).
FIELDS = TIME_FIELDS


class StepClock:
    """``lap(field)`` charges the time since the last lap to ``field``; ``spent`` holds the sums.

    ``perf_counter`` costs about 60 ns a call, so a lap per phase (a dozen a step) is far below
    the 2% a generation's fields may miss its wall time by."""

    __slots__ = ("last", "spent")

    def __init__(self, since: float | None = None) -> None:
        # ``since``: where the previous step ended, so the time between steps is in a field too.
        self.last = time.perf_counter() if since is None else since
        self.spent = dict.fromkeys(FIELDS, 0.0)

    def lap(self, field: str) -> float:
        """Charge the time since the last lap to ``field``; returns the time now."""
        now = time.perf_counter()
        self.spent[field] += now - self.last
        self.last = now
        return now

    def charge(self, field: str, seconds: float, taken_from: str) -> None:
        """Move ``seconds`` already charged to ``taken_from`` to ``field`` (a phase that timed
        its own parts, as the build times its drafting)."""
        self.spent[field] += seconds
        self.spent[taken_from] -= seconds
