"""The [load] table of an experiment file, with the ``specframe load`` options over it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from specframe.options import build_options


@dataclass
class LoadSettings:
    """What one ``specframe load`` run serves.

    Attributes:
        rates: offered request rates (requests per second), one cell per rate and arm.
        requests: requests per cell; they take the data file's questions in order, cycling.
        max_live: the most sequences decoding at once; later arrivals wait in a queue.
        arrivals: ``"poisson"`` (seeded exponential gaps) or the path of a file of arrival
            times (seconds, one per line), rescaled to each rate.
        seed: the Poisson process's seed (every arm serves the same arrivals).
        slo_tpot_ms: the TPOT objective of ``goodput`` (milliseconds per token); None: no goodput.
        rounds: how many times each rate's arms are served, taking turns with the order rotated
            every round, so that machine drift hits every arm alike; a (rate, arm)'s figures
            pool its rounds. More rounds extend a finished run (the rounds on disk are kept).
    """

    rates: list = field(default_factory=list)
    requests: int = 28
    max_live: int = 8
    arrivals: str = "poisson"
    seed: int = 0
    slo_tpot_ms: float | None = None
    rounds: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.rates, (list, tuple)) or not self.rates:
            raise ValueError(f"rates must be a non-empty list of requests per second, got {self.rates!r}")
        bad = [r for r in self.rates if isinstance(r, bool) or not isinstance(r, (int, float))
               or not math.isfinite(r) or r <= 0]
        if bad:
            raise ValueError(f"rates must be positive numbers (requests per second); bad: {bad}")
        self.rates = sorted(float(r) for r in self.rates)
        for key in ("requests", "max_live", "rounds"):
            if int(getattr(self, key)) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)!r}")
        if self.slo_tpot_ms is not None and not float(self.slo_tpot_ms) > 0:
            raise ValueError(f"slo_tpot_ms must be > 0 milliseconds, got {self.slo_tpot_ms!r}")

    def describe(self) -> dict:
        """What a cell's figures depend on besides its rate and arm (resume checks it)."""
        return {"requests": self.requests, "max_live": self.max_live, "arrivals": self.arrivals, "seed": self.seed}


def parse_rates(text: str) -> list[float]:
    """``"0.5,1,2"`` as numbers; a ValueError names the bad entry."""
    out = []
    for part in text.split(","):
        try:
            out.append(float(part))
        except ValueError:
            raise ValueError(f"--rates: {part.strip()!r} is not a number (give e.g. --rates 0.5,1,2)") from None
    return out


def load_settings(table: Mapping[str, Any], overrides: Mapping[str, Any]) -> LoadSettings:
    """The file's [load] table with the command line's options (those not None) over it."""
    values = {**dict(table), **{k: v for k, v in overrides.items() if v is not None}}
    return build_options(LoadSettings, values, "[load]")
