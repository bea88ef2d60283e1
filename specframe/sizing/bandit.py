"""The ``mu = "auto"`` gate chooser: a discounted UCB bandit over a grid of TALON gates."""

from __future__ import annotations

import math


class MuBandit:
    """Discounted UCB over a grid of TALON gates; reward = emitted tokens per modelled second.

    No prior knowledge of the pair: every mu is tried once, then the arm with the best
    discounted mean plus an exploration bonus (scaled to the rewards seen) is played. The
    discount lets the choice follow a change of text (prose to code) within a few hundred steps.
    """

    GRID = (0.01, 0.03, 0.1, 0.3, 1.0)

    def __init__(self, grid: tuple[float, ...] = GRID, discount: float = 0.98, bonus: float = 0.5) -> None:
        self.grid = tuple(grid)
        self.discount = discount
        self.bonus = bonus
        self.count = [0.0] * len(self.grid)
        self.total = [0.0] * len(self.grid)
        self.arm = 0

    def choose(self) -> float:
        """The gate for the next tree."""
        count = self.count
        if 0.0 in count:
            self.arm = count.index(0.0)  # every gate is tried once first
        else:
            means = [t / c for t, c in zip(self.total, count)]
            width = self.bonus * (max(means) or 1.0) * math.sqrt(math.log(max(sum(count), 1.0)))
            ucb = [mean + width / math.sqrt(c) for mean, c in zip(means, count)]
            self.arm = ucb.index(max(ucb))  # ties: the first (smallest) gate
        return self.grid[self.arm]

    def reward(self, value: float) -> None:
        """Credit the last chosen gate with ``value``."""
        self.count = [c * self.discount for c in self.count]
        self.total = [t * self.discount for t in self.total]
        self.count[self.arm] += 1.0
        self.total[self.arm] += value

    @property
    def best(self) -> float:
        """The gate with the best discounted mean so far."""
        means = [t / c if c else -1.0 for t, c in zip(self.total, self.count)]
        return self.grid[max(range(len(self.grid)), key=lambda i: means[i])]

