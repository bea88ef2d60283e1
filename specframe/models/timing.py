"""Timings a busy machine cannot pass off as the machine's: the spread rule that cost curves
(:mod:`specframe.sizing.profile`) and the ``"auto"`` linear-kernel choice
(:mod:`specframe.models.packed_linear`) share before either is cached.

A timing taken while another job loads the machine is wrong in a way no later reader can see (a
T(16)/T(1) of 5.1 where the quiet machine gives 1.46 was once cached; a kernel choice made in a
busy minute picked the kernel that is 1.5x slower on the quiet machine). So every timing keeps the
spread of its repetitions, and only one whose spread is at most :func:`max_spread` is cached.

The rule has to fit the measurement, or a quiet machine fails it by chance: a forward of the
shipped tiny target takes about a millisecond, and single forwards that short spread by 15-30% on
a shared VM from timer and scheduler noise alone. So each repetition (:func:`sample`) runs the
work again until it has taken at least :data:`MIN_SAMPLE_SECONDS` (the floor in absolute time)
and reports the mean, and the spread is the interquartile range over the median, which a stray
slow repetition does not move. Even so, the tiny target's 4-12 ms forwards at 2 threads spread by
9-29% on a quiet 2-core VM (3 of 10 ``specframe profile demo-target`` runs refused), because two
threads meet at every op and one late wake-up costs a few hundred microseconds. So the spread
does not count the first :data:`IGNORED_SPREAD_SECONDS` of the interquartile range: a cost curve
is never read finer than the engine's own time around a forward (1-2 ms a step), while a
concurrent job still spreads a tiny forward by its whole length.

A timing that spreads too wide is taken again, up to :data:`TRIES` times in all and for at most
:data:`TRY_SECONDS`, with a progress line (:func:`until_quiet`). If the machine stays busy, the
caller uses the least noisy one for this run only, caches nothing and says so in one
:class:`BusyMachineWarning` line; only ``specframe profile``, whose whole job is to cache a
curve, refuses with :class:`BusyMachineError`.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable, Generic, TypeVar

#: Widest spread of repetitions a timing may have to be cached: the interquartile range over
#: the median (of a curve: the median of that over its points; of a kernel choice: the widest
#: kernel's). On a quiet 2-core machine SmolLM2's points spread by a few percent; a concurrent
#: job spreads them by tens of percent (223% was seen).
MAX_SPREAD = 0.15
#: Environment variable overriding :data:`MAX_SPREAD` (``inf`` accepts any timing: the test
#: suite, whose tiny models' sub-millisecond forwards say nothing about the machine).
SPREAD_ENV = "SPECFRAME_CURVE_MAX_SPREAD"
#: Shortest repetition, in seconds: work shorter than this is run again within the repetition and
#: averaged, so a scheduler tick or a timer's granularity is a small part of it. 20 ms is several
#: scheduler time slices and less than one SmolLM2-135M forward on a 2-core CPU (about 30 ms:
#: those run once per repetition, as before).
MIN_SAMPLE_SECONDS = 0.02
#: Interquartile range, in seconds, that the spread does not count (:func:`relative_spread`):
#: finer than any reader of a timing resolves (the engine spends 1-2 ms a step around its
#: forwards), and the whole spread of a quiet tiny-target curve.
IGNORED_SPREAD_SECONDS = 0.001
#: Most runs of the work in one repetition (a bound, should a clock stand still).
MAX_RUNS_PER_SAMPLE = 1000
#: Repetitions of a timing: a few more than a median needs, so that the quartiles of the spread
#: rule are not the second-lowest and second-highest of five.
REPS = 9
#: Timings taken in all before a busy machine's best one is used for the run only ...
TRIES = 3
#: ... and seconds of trying after which no new try begins: a machine busy that long is not
#: likely to turn quiet for one more try (a demo on a busy 2-core machine once ran 2 min 48 s
#: before its second try refused the curve).
TRY_SECONDS = 60.0

T = TypeVar("T")


class BusyMachineError(RuntimeError):
    """A timing spread wider than :func:`max_spread` in every try: the machine is busy. Its
    message ends with :attr:`fix`.

    Attributes:
        what: what was refused, and the spread.
        fix: what to do about it (another job is loading the machine, so nothing in an
            experiment file is at fault): run ``command`` again when the machine is quiet.
    """

    def __init__(self, what: str, command: str = "specframe profile MODEL") -> None:
        self.what, self.command = what, command
        self.fix = (f"another job is loading the machine, not a fault of the experiment: run `{command}` when it "
                    f"is quiet (`uptime` shows the load), or set {SPREAD_ENV}=0.3 to accept a wider spread")
        super().__init__(f"{what}: {self.fix}")

    def __reduce__(self) -> tuple:
        # Rebuilt from its own arguments (the message alone is not one): it crosses Ray's and
        # the sweep's process boundaries.
        return type(self), (self.what, self.command)


class BusyMachineWarning(UserWarning):
    """A timing was used for this run only, uncached, because the machine was busy (one line)."""


def max_spread() -> float:
    """:data:`MAX_SPREAD`, or ``$SPECFRAME_CURVE_MAX_SPREAD``."""
    return float(os.environ.get(SPREAD_ENV) or MAX_SPREAD)


def relative_spread(times: list[float]) -> float:
    """The interquartile range of ``times`` (seconds), less :data:`IGNORED_SPREAD_SECONDS`, over
    their median (0.0 for fewer than two, or a range within the ignored part)."""
    if len(times) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(times, n=4, method="inclusive")
    return max(0.0, q3 - q1 - IGNORED_SPREAD_SECONDS) / statistics.median(times)


def sample(once: Callable[[], float], floor: float = MIN_SAMPLE_SECONDS) -> float:
    """One repetition: ``once()`` (which runs the work and returns the seconds it took) called
    until the seconds add up to ``floor``, and their mean."""
    total, runs = 0.0, 0
    while runs == 0 or (total < floor and runs < MAX_RUNS_PER_SAMPLE):
        total += once()
        runs += 1
    return total / runs


def tries_text(tries: int) -> str:
    """A count of tries as the messages write it: ``"1 try"``, ``"3 tries"``."""
    return f"{tries} try" if tries == 1 else f"{tries} tries"


def percent(spread: float) -> str:
    """A spread as the messages write it: ``"23%"``."""
    return f"{100 * spread:.0f}%"


@dataclass(frozen=True)
class Measured(Generic[T]):
    """What :func:`until_quiet` returns: the timing handed on, whether it is quiet enough to
    cache, and how many tries it took."""

    value: T
    quiet: bool
    tries: int


def until_quiet(measure: Callable[[], T], noise: Callable[[T], float], what: str,
                tries: int = TRIES, budget: float = TRY_SECONDS) -> Measured[T]:
    """``measure()`` again while ``noise`` of its result is wider than :func:`max_spread`, up to
    ``tries`` times in all, none begun after ``budget`` seconds of trying (a machine that stays
    busy that long will not turn quiet for one more try), with one progress line (stderr)
    before each new try. Returns the first quiet result, else the least noisy one (nothing is
    raised)."""
    best, start = None, time.monotonic()  # not perf_counter: the tests fake that one
    for attempt in range(1, tries + 1):
        result = measure()
        if best is None or noise(result) < noise(best):
            best = result
        if noise(result) <= max_spread():
            return Measured(result, True, attempt)
        if attempt == tries or time.monotonic() - start > budget:
            return Measured(best, False, attempt)
        print(f"specframe: {what}: repetitions spread by {percent(noise(result))} (at most "
              f"{percent(max_spread())} is trusted; is another job running?): measuring again "
              f"({attempt + 1} of {tries})", file=sys.stderr, flush=True)
    raise ValueError(f"tries must be at least 1, got {tries}")


def busy_line(what: str, spread: float, tries: int, uses: str, command: str) -> str:
    """The one warning line of a timing used uncached: what, its spread, what the run uses
    instead and the command that measures it on a quiet machine."""
    return (f"{what} timed on a busy machine (its repetitions spread by {percent(spread)} in {tries_text(tries)}, "
            f"at most {percent(max_spread())} is trusted): this run uses {uses} and caches nothing; "
            f"to measure it when the machine is quiet: {command}")
