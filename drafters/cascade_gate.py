"""``threshold = "auto"`` of the hybrid's cascade: ask a costlier part only where it pays.

A fixed threshold asks the model part whenever retrieval is unsure, and on a task where the
model part adds little (its guesses are no better than the copy's) it still costs its draft
time on every such step. The gate instead learns, for each later part j and each bin of the
earlier parts' best root probability, the throughput of the steps that asked part j and of
those that did not:

    rate(j, bin, asked) = (decayed sum of emitted tokens) / (decayed sum of step seconds)

and asks part j when its rate is the higher. So the part's draft time (in the step seconds) is
priced against its gain (in the tokens) on this machine, measured, as ``budget = "auto"``
prices nodes against the cost curve. A step's seconds are wall time from the previous
commit (or ``begin``) to this one: the whole step, drafting, target forward and verification.

Learning: each (part, bin) cell first tries both actions ``WARM`` times; after that every
``EXPLORE``-th decision in a cell takes the other action, so a rate that went stale (the
workload changed) is measured again. The statistics outlive a generation (the gate is the
drafter's state across requests: ``persistent_state``), and since they are wall-clock
timings the trees depend on the machine: replay is at best ``"approximate"``.
"""

from __future__ import annotations

import bisect

from specframe.clock import Clock, wall_clock

#: Lower edges of the confidence bins: the first bin, below 1e-4, holds "no candidate at all"
#: (the n-gram and suffix drafters' fallback row claims 1e-6).
BIN_EDGES = (1e-4, 0.3, 0.7, 0.95)
#: Decisions of each action a cell takes before it compares rates.
WARM = 3
#: After warming, every EXPLORE-th decision of a cell takes the action its rates reject.
EXPLORE = 8
#: Per-step decay of the token and second sums (a memory of some 30 steps per cell).
DECAY = 0.97


def confidence_bin(probability: float) -> int:
    """The bin of an earlier part's best root probability (0: no candidate)."""
    return bisect.bisect_right(BIN_EDGES, probability)


class CascadeGate:
    """Per (later part, confidence bin): decayed tokens and seconds of steps that asked the part
    and of steps that did not, and the choice between them (module docstring)."""

    def __init__(self, later_parts: int, clock: Clock = wall_clock) -> None:
        #: Where step seconds come from (a TickClock under the conformance suite).
        self.clock = clock
        cells = later_parts * (len(BIN_EDGES) + 1)
        self.tokens = [[0.0, 0.0] for _ in range(cells)]     # [skipped, asked]
        self.seconds = [[0.0, 0.0] for _ in range(cells)]
        self.tries = [[0, 0] for _ in range(cells)]
        self.decisions = [0] * cells
        self._step: list[tuple[int, int]] = []               # (cell, asked) decided this step
        self._mark: float | None = None

    def _cell(self, part: int, probability: float) -> int:
        return (part - 1) * (len(BIN_EDGES) + 1) + confidence_bin(probability)

    def rate(self, cell: int, asked: int) -> float:
        """Tokens per second of the cell's steps that took action ``asked`` (0 before any)."""
        return self.tokens[cell][asked] / self.seconds[cell][asked] if self.seconds[cell][asked] > 0 else 0.0

    def ask(self, part: int, probability: float) -> bool:
        """Whether to ask ``part`` (index >= 1 among the hybrid's parts) this step, given the
        earlier parts' best root ``probability``; the choice is remembered for :meth:`settle`."""
        cell = self._cell(part, probability)
        tries = self.tries[cell]
        if min(tries) < WARM:
            asked = int(tries[1] <= tries[0])  # alternate, asking first
        else:
            self.decisions[cell] += 1
            better = int(self.rate(cell, 1) > self.rate(cell, 0))
            asked = 1 - better if self.decisions[cell] % EXPLORE == 0 else better
        tries[asked] += 1
        self._step.append((cell, asked))
        return bool(asked)

    def start(self) -> None:
        """A generation begins: its first step is timed from here; no decision is pending."""
        self._mark, self._step = self.clock(), []

    def settle(self, emitted: int) -> None:
        """A step committed ``emitted`` tokens: fold its tokens and seconds into the cells it decided."""
        now = self.clock()
        if self._mark is not None:
            seconds = now - self._mark
            for cell, asked in self._step:
                self.tokens[cell][asked] = DECAY * self.tokens[cell][asked] + emitted
                self.seconds[cell][asked] = DECAY * self.seconds[cell][asked] + seconds
        self._mark, self._step = now, []
