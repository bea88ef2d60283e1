"""When requests arrive: a seeded Poisson process, or a file of arrival times."""

from __future__ import annotations

import random
from pathlib import Path


def poisson_arrivals(rate: float, count: int, seed: int) -> list[float]:
    """``count`` arrival times (seconds) of a Poisson process of ``rate`` requests per second:
    the first at 0, then exponential gaps drawn from ``seed`` (the same for every arm)."""
    if rate <= 0 or count < 1:
        raise ValueError(f"need rate > 0 and count >= 1, got rate={rate!r}, count={count!r}")
    rng = random.Random(f"specframe-load-{seed}")  # a string seed: the same stream on every platform
    times, now = [0.0], 0.0
    for _ in range(count - 1):
        now += rng.expovariate(rate)
        times.append(now)
    return times


def read_arrivals(path: str | Path) -> list[float]:
    """Arrival times from a file: one number of seconds per line (blank lines and ``#``
    comments skipped), non-decreasing. The error names the file and line."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"arrivals file {str(path)!r} does not exist (give 'poisson' or a file of seconds, one per line)")
    times: list[float] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"{path}:{number}: {text!r} is not a number of seconds") from None
        if value < 0 or (times and value < times[-1]):
            raise ValueError(f"{path}:{number}: {value} is negative or earlier than the line before")
        times.append(value)
    if not times:
        raise ValueError(f"{path}: no arrival times")
    return times


def file_arrivals(times: list[float], rate: float, count: int) -> list[float]:
    """``count`` arrivals following the file's pattern at ``rate`` requests per second: its
    times scaled so that their mean gap is ``1 / rate``, the pattern repeating (one mean gap
    after its last arrival) when the file has fewer than ``count``."""
    n = len(times)
    span = times[-1] - times[0]
    if n == 1 or span == 0:  # one request, or bursts of n: n requests every n / rate seconds
        return [(i // n) * n / rate for i in range(count)]
    gap = span / (n - 1)
    scale = 1.0 / (rate * gap)
    return [((times[i % n] - times[0]) + (i // n) * (span + gap)) * scale for i in range(count)]


def arrival_times(kind: str, rate: float, count: int, seed: int) -> list[float]:
    """The arrivals of one cell: ``kind`` is ``"poisson"`` or a file path."""
    if kind == "poisson":
        return poisson_arrivals(rate, count, seed)
    return file_arrivals(read_arrivals(kind), rate, count)
