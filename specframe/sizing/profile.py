"""The target's cost curve T(n): seconds of one verification forward of n tree tokens.

How large a draft tree should be depends on how T(n) grows with n on the hardware at hand: on a
large GPU a 60-node tree costs about one decoding step, on a CPU it costs several. Hardware-aware
policies (``budget="auto"``, ``gamma="auto"``) read the curve from here.

A curve is measured for one model on one device, dtype and thread count, at a few cache lengths
(the committed context the tree attends to), and cached as JSON under
``specframe.models.gguf.cache_root()/profiles``, keyed by model (with what runs its linears),
device (a CPU's model name, a GPU's name), dtype, threads and torch version. :func:`curve_for`
returns the cached curve or measures a short one (a few seconds) and caches it; ``specframe
profile MODEL`` (:mod:`specframe.sizing.profile_command`) measures a longer one, prints it and plots it.

A curve measured while another job loads the machine is wrong in a way no later reader can see
(a T(16)/T(1) of 5.1 where the quiet machine gives 1.46 was once cached and reused). So a
measurement keeps the spread of its repetitions beside the medians, and where (host, CPU) and
when it was taken, and is cached only under :mod:`specframe.models.timing`'s spread rule: on a
busy machine :func:`curve_for` hands the run its least noisy curve uncached with one warning
line, and :func:`measure_trusted` (``specframe profile``) refuses. :func:`curve_for` logs where
and when the curve it hands a policy was measured.
"""

from __future__ import annotations

import bisect
import json
import logging
import os
import platform
import statistics
import time
import warnings
from datetime import datetime, timezone
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Callable

import torch

from specframe.models import timing
from specframe.models.cache_keys import cpu_label, model_identity, profile_command, profiles_dir, safe
# The spread rule's names, kept importable from here, where curves have always read them.
from specframe.models.timing import MAX_SPREAD, SPREAD_ENV, BusyMachineError, max_spread, relative_spread
from specframe.tree import DraftTree

#: Tree sizes (root included) and cache lengths of the short curve measured at first use.
QUICK_SIZES = (1, 2, 4, 8, 16, 32, 64)
QUICK_CACHE_LENS = (64, 512)
QUICK_REPS = timing.REPS
#: The longer curve of ``specframe profile``.
FULL_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
FULL_CACHE_LENS = (128, 512, 2048)
FULL_REPS = timing.REPS

_LOG = logging.getLogger("specframe.sizing")
#: Curve keys whose provenance this process has logged.
_SHOWN: set[str] = set()

#: One measurement per process, cache directory and key (keyed by the directory too, so that
#: pointing the cache elsewhere mid-process reads that cache, not a curve kept from the last).
_MEMO: dict[tuple[Path, str], "CostCurve"] = {}


@dataclass
class CostCurve:
    """Median seconds of a target forward of ``sizes[j]`` tree tokens at ``cache_lens[i]``.

    Attributes:
        key: what the curve belongs to (model, device, dtype, threads, torch version).
        sizes: tree sizes n, ascending (root included: n = 1 is a plain decoding step).
        cache_lens: committed tokens already in the KV cache, ascending.
        seconds: ``seconds[i][j]`` = T(sizes[j]) at ``cache_lens[i]``.
        padded_to: row counts the target pads a forward up to (the buckets of MKL-packed
            linears, :func:`padded_rows`); a size between two of them costs what the next one
            costs, so the curve is read as a staircase there instead of interpolated. Empty:
            every size is interpolated.
        spread: ``spread[i][j]``: the interquartile range of the repetitions behind
            ``seconds[i][j]`` over their median (empty: not recorded, a curve cached before).
        measured: where and when: ``at`` (UTC, ISO 8601), ``host``, ``cpu``, ``threads``,
            ``reps`` (empty: not recorded).

    Raises:
        ValueError: the fields do not make a curve (:meth:`problem`), in one line naming
            the field and its value: a repeated size would divide by zero and a short row
            index past its end deep inside the interpolation.
    """

    key: str
    sizes: list[int]
    cache_lens: list[int]
    seconds: list[list[float]]
    padded_to: list[int] = field(default_factory=list)
    spread: list[list[float]] = field(default_factory=list)
    measured: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        problem = self.problem(self.sizes, self.cache_lens, self.seconds, self.padded_to)
        if problem:
            raise ValueError(f"cost curve {self.key!r}: {problem}")

    @staticmethod
    def problem(sizes: Any, cache_lens: Any, seconds: Any, padded_to: Any = ()) -> str | None:
        """What makes these fields no curve (one line naming the field and its value), or None:
        sizes strictly ascending integers >= 1, cache lengths strictly ascending integers >= 0
        (interpolation divides by the gaps), one row of seconds per cache length and one finite
        time > 0 per size in each, padded_to strictly ascending integers >= 1 or empty."""
        if not CostCurve._ascending_ints(sizes, 1):
            return f"sizes must be strictly ascending integers >= 1, got {sizes!r}"
        if not CostCurve._ascending_ints(cache_lens, 0):
            return f"cache_lens must be strictly ascending integers >= 0, got {cache_lens!r}"
        if not CostCurve._ascending_ints(padded_to, 1, allow_empty=True):
            return f"padded_to must be strictly ascending integers >= 1 (or empty), got {padded_to!r}"
        if not isinstance(seconds, (list, tuple)) or len(seconds) != len(cache_lens):
            count = len(seconds) if isinstance(seconds, (list, tuple)) else repr(seconds)
            return f"seconds must hold one row per cache length ({len(cache_lens)}), got {count}"
        for i, row in enumerate(seconds):
            if not isinstance(row, (list, tuple)) or len(row) != len(sizes):
                return f"seconds[{i}] must hold one time per size ({len(sizes)}), got {row!r}"
            for j, t in enumerate(row):
                # The chained comparison is False for NaN as well as for <= 0 and infinity.
                if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t < float("inf"):
                    return f"seconds[{i}][{j}] must be a finite time > 0, got {t!r}"
        return None

    @staticmethod
    def _ascending_ints(values: Any, lowest: int, allow_empty: bool = False) -> bool:
        """Whether ``values`` is a list (or tuple) of ints >= ``lowest``, each above the one before."""
        if not isinstance(values, (list, tuple)) or (not values and not allow_empty):
            return False
        if any(isinstance(v, bool) or not isinstance(v, int) for v in values):
            return False
        return all(v >= lowest for v in values) and all(a < b for a, b in zip(values, values[1:]))

    def noise(self) -> float:
        """The median over the points of :attr:`spread` (0.0 when not recorded)."""
        values = [v for row in self.spread for v in row]
        return statistics.median(values) if values else 0.0

    def provenance(self) -> str:
        """Where and when the curve was measured, in words (one line)."""
        m = self.measured
        if not m:
            return "measured at an unrecorded time and place (cached before specframe recorded them)"
        return (f"measured {m.get('at', '?')} on {m.get('host', '?')} ({m.get('cpu', '?')}, "
                f"{m.get('threads', '?')} threads, {m.get('reps', '?')} reps, spread {100 * self.noise():.0f}%)")

    def time(self, n: int, cache_len: int | None = None) -> float:
        """T(n) in seconds at ``cache_len`` (None: the shortest measured), interpolated linearly
        in n and in the cache length, extrapolated linearly beyond the measured ranges."""
        return self._at(self.seconds, n, cache_len)

    def _at(self, rows: list[list[float]], n: int, cache_len: int | None) -> float:
        """``rows`` (one per cache length) interpolated at size ``n`` and ``cache_len``."""
        n = self.priced_size(n)
        at_n = [_interp(self.sizes, row, n) for row in rows]
        if cache_len is None or len(at_n) == 1:
            return max(at_n[0], 0.0)
        return max(_interp(self.cache_lens, at_n, cache_len), 0.0)

    def priced_size(self, n: int) -> int:
        """The row count a forward of ``n`` tree tokens really runs: the next of
        :attr:`padded_to` (when it was measured), else ``n``: MKL-packed linears run 5-7 tokens as
        8, and read as a line those sizes look a third cheaper than they are (docs/auto-sizing.md)."""
        i = bisect.bisect_left(self.padded_to, n)
        if i < len(self.padded_to) and self.padded_to[i] in self.sizes:
            return self.padded_to[i]
        return n

    @cached_property
    def _fitted(self) -> list[list[float]]:
        """The measured grid's :func:`isotonic_grid` fit (derived, so not part of the JSON)."""
        return isotonic_grid(self.seconds)

    def times(self, n_max: int, cache_len: int | None = None) -> list[float]:
        """``[T(1), ..., T(n_max)]`` from the least-squares fit of the measured grid that never
        decreases in size or in cache length (:func:`isotonic_grid`): a larger tree or a longer
        cache never costs less, and a measured dip is noise that would make a size chooser jump
        to it. A running maximum would lift every later size to a noisy peak before it, and a fit
        per cache length alone lets one slow T(1) pool with T(2) and price the second token at
        nothing (both seen on real curves: docs/auto-sizing.md, "The cost curve")."""
        out: list[float] = []
        for n in range(1, n_max + 1):
            out.append(max(self._at(self._fitted, n, cache_len), out[-1] if out else 0.0))
        return out

    def ratios(self, cache_len: int | None = None) -> list[float]:
        """T(n) / T(1) at the measured sizes."""
        base = self.time(1, cache_len)
        return [self.time(n, cache_len) / base for n in self.sizes]

    def to_json(self) -> str:
        """The curve as JSON (what the cache file holds)."""
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str, source: str | Path | None = None) -> "CostCurve":
        """Inverse of :meth:`to_json`. ``source`` (the file, say) leads the message of the
        ``ValueError`` raised for text that is not a valid curve; callers reading a file a user
        named should pass it."""
        where = f"cost curve {source}" if source is not None else "cost curve"
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"{where}: not JSON ({err})") from None
        if not isinstance(raw, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(raw).__name__}")
        known = {"key", "sizes", "cache_lens", "seconds", "padded_to", "spread", "measured"}
        missing = sorted(known - {"padded_to", "spread", "measured"} - set(raw))  # older curves lack them
        if missing:
            raise ValueError(f"{where}: missing field(s) {', '.join(missing)}")
        if set(raw) - known:
            raise ValueError(f"{where}: unknown field(s) {', '.join(sorted(set(raw) - known))}")
        if not isinstance(raw["key"], str):
            raise ValueError(f"{where}: key must be a string, got {raw['key']!r}")
        problem = cls.problem(raw["sizes"], raw["cache_lens"], raw["seconds"], raw.get("padded_to", []))
        if not isinstance(raw.get("measured", {}), dict) or not isinstance(raw.get("spread", []), list):
            problem = "measured must be an object and spread a list"
        if problem:
            raise ValueError(f"{where}: {problem}")
        return cls(**raw)

    @classmethod
    def synthetic(cls, fn: Callable[[int], float], sizes: tuple[int, ...] = QUICK_SIZES) -> "CostCurve":
        """A curve with T(n) = ``fn(n)`` (tests and projections)."""
        return cls("synthetic", list(sizes), [0], [[float(fn(n)) for n in sizes]])


def isotonic(values: list[float]) -> list[float]:
    """The non-decreasing sequence nearest ``values`` in least squares (pool adjacent
    violators): a run that dips is replaced by its mean."""
    blocks: list[list[float]] = []  # [mean, count]
    for v in values:
        blocks.append([float(v), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            mean, count = blocks.pop()
            blocks[-1] = [(blocks[-1][0] * blocks[-1][1] + mean * count) / (blocks[-1][1] + count),
                          blocks[-1][1] + count]
    return [mean for mean, count in blocks for _ in range(int(count))]


def isotonic_grid(rows: list[list[float]], tol: float = 1e-12, max_rounds: int = 1000) -> list[list[float]]:
    """The grid nearest ``rows`` in least squares that is non-decreasing along every row and
    every column (Dykstra's alternating projections: :func:`isotonic` on the rows, then on the
    columns, each undoing its own last correction, which converges to the exact projection
    onto both constraints at once, where plain alternation stops at some point of the
    intersection). One row is :func:`isotonic`."""
    x = [list(map(float, r)) for r in rows]
    if len(x) <= 1:
        return [isotonic(r) for r in x]
    n_rows, n_cols = len(x), len(x[0])
    scale = max(1.0, max(abs(v) for r in x for v in r))
    p = [[0.0] * n_cols for _ in range(n_rows)]  # correction of the row step
    q = [[0.0] * n_cols for _ in range(n_rows)]  # correction of the column step
    for _ in range(max_rounds):
        y = [isotonic([a + b for a, b in zip(xr, pr)]) for xr, pr in zip(x, p)]
        p = [[a + b - c for a, b, c in zip(xr, pr, yr)] for xr, pr, yr in zip(x, p, y)]
        cols = [isotonic([y[i][j] + q[i][j] for i in range(n_rows)]) for j in range(n_cols)]
        new = [[cols[j][i] for j in range(n_cols)] for i in range(n_rows)]
        q = [[a + b - c for a, b, c in zip(yr, qr, nr)] for yr, qr, nr in zip(y, q, new)]
        moved = max(abs(a - b) for nr, xr in zip(new, x) for a, b in zip(nr, xr))
        x = new
        if moved <= tol * scale:
            break
    return x


def _interp(xs: list[int], ys: list[float], x: float) -> float:
    """Piecewise-linear interpolation, extended linearly past both ends."""
    if len(xs) == 1:
        return ys[0]
    j = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[j - 1], xs[j], ys[j - 1], ys[j]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


# ---------------------------------------------------------------------- keys and the cache
def model_label(model: Any) -> str:
    """A readable model name plus a hash of its config (weights do not change the cost), and
    ``-native<build>`` / ``-onednn`` / ``-mkl`` when :func:`~specframe.models.packed_linear.pack_linears` replaced its
    linears (the native kernel with its build's digest: a new build times differently),
    ``-bf16-amx`` / ``-bf16-avx512-bf16`` for :mod:`specframe.models.bf16_linear`'s (no mark:
    the model's own linears), ``-gqa`` when its attention is :mod:`specframe.models.attention`'s
    and ``-exact`` for the exact forward (all change it)."""
    from specframe.models.linears import linears_label
    from specframe.models.native_gemm import extension_name
    from specframe.models.packed_linear import linear_kernel

    label, kernel = linears_label(model), linear_kernel(model)
    if kernel == "native":
        kernel += extension_name().rsplit("_", 1)[-1][:8]
    return model_identity(model, safe(label) if label.startswith("bf16-") else kernel)


def curve_key(model: Any, device: torch.device, dtype: torch.dtype, threads: int | None = None) -> str:
    """Cache key: model (with its linears, :func:`model_label`), device (a CPU's model name, a
    GPU's name), dtype, torch threads and torch version."""
    threads = torch.get_num_threads() if threads is None else threads
    dev = device.type if device.index is None else f"{device.type}{device.index}"
    if device.type == "cuda":
        dev += "-" + safe(torch.cuda.get_device_name(device))
    elif device.type == "cpu":
        dev += "-" + cpu_label()
    return "_".join([model_label(model), dev, str(dtype).replace("torch.", ""), f"t{threads}",
                     "torch" + safe(torch.__version__)])


def cache_dir() -> Path:
    """Where curves are cached: ``specframe.models.gguf.cache_root() / "profiles"``."""
    return profiles_dir()


def load_cached(key: str) -> CostCurve | None:
    """The cached curve of ``key``, or None (a damaged file counts as absent)."""
    where = cache_dir()
    if (where, key) in _MEMO:
        return _MEMO[where, key]
    path = where / f"{key}.json"
    try:
        curve = CostCurve.from_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError):
        return None
    _MEMO[where, key] = curve
    return curve


def save(curve: CostCurve) -> Path:
    """Write ``curve`` to the cache (atomically) and return the file."""
    where = cache_dir()
    path = where / f"{curve.key}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    # one temporary name per process: two processes sharing the cache (parallel test workers,
    # two runs) may write the same file at once, and each must rename a whole file of its own
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    tmp.write_text(curve.to_json(), encoding="utf-8")
    tmp.replace(path)
    _MEMO[where, curve.key] = curve
    return path


# ---------------------------------------------------------------------- measuring
def balanced_tree(n: int, vocab: int, fanout: int = 4) -> DraftTree:
    """An n-node tree of the given fan-out (breadth first): a typical verification workload."""
    parents = [-1] + [(i - 1) // fanout for i in range(1, n)]
    depths = [0] * n
    for i in range(1, n):
        depths[i] = depths[parents[i]] + 1
    return DraftTree(tokens=torch.tensor([(7 * i + 1) % vocab for i in range(n)]),
                     parents=torch.tensor(parents), depths=torch.tensor(depths),
                     logp=torch.zeros(n), ranks=torch.zeros(n, dtype=torch.long))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(target: Any, sizes: tuple[int, ...] = QUICK_SIZES, cache_lens: tuple[int, ...] = QUICK_CACHE_LENS,
            reps: int = QUICK_REPS) -> CostCurve:
    """Measure T(n) of ``target`` (a :class:`~specframe.models.target.TargetModel`): median of ``reps``
    repetitions after one warm-up, for each size on top of each cache length; a repetition of a
    forward shorter than :data:`~specframe.models.timing.MIN_SAMPLE_SECONDS` is the mean of as
    many forwards as fill it (:func:`~specframe.models.timing.sample`).

    Cache lengths beyond the model's positions are skipped. Leaves the target's cache reset.
    """
    device, vocab = target.device, target.vocab_size
    usable = [c for c in cache_lens if c + max(sizes) < target.max_positions] or [1]
    trees = [balanced_tree(n, vocab) for n in sizes]
    # Every round visits every cache length and, within it, every size in turn, so a change of
    # load on a shared machine hits all points alike instead of bending the curve (or tilting
    # one cache length against another); round 0 is a warm-up. The prefix is rebuilt per visit.
    runs = [[[] for _ in sizes] for _ in usable]
    for rep in range(reps + 1):
        for i, cache_len in enumerate(usable):
            target.reset()
            if cache_len > 1:
                target.causal_forward(torch.arange(cache_len - 1, device=device) % vocab)
            # Untimed: right after the prefill the first small forward ran slower than the next
            # (its size was always the first, so T(1) read high and every ratio to it low).
            _time_tree(target, trees[0], cache_len)
            for j, tree in enumerate(trees):
                if rep:
                    runs[i][j].append(timing.sample(lambda: _time_tree(target, tree, cache_len)))
                else:
                    _time_tree(target, tree, cache_len)
    seconds = [[statistics.median(r) for r in row] for row in runs]
    target.reset()
    return CostCurve(curve_key(target.model, device, target.dtype), list(sizes), usable, seconds,
                     padded_rows(target.model), [[relative_spread(r) for r in row] for row in runs],
                     where_and_when(device, reps))


def where_and_when(device: torch.device, reps: int) -> dict:
    """:attr:`CostCurve.measured` of a measurement taken now on ``device``."""
    what = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_label()
    return {"at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "host": platform.node(),
            "cpu": what, "threads": torch.get_num_threads(), "reps": reps}


def measure_until_quiet(target: Any, sizes: tuple[int, ...] = QUICK_SIZES,
                        cache_lens: tuple[int, ...] = QUICK_CACHE_LENS, reps: int = QUICK_REPS,
                        tries: int = timing.TRIES, budget: float = timing.TRY_SECONDS) -> timing.Measured[CostCurve]:
    """:func:`measure`, again while its spread is wider than :func:`max_spread`, up to ``tries``
    times in all, none begun after ``budget`` seconds (:func:`~specframe.models.timing.until_quiet`,
    a progress line before each new try): the first quiet curve, else the least noisy one."""
    return timing.until_quiet(lambda: measure(target, sizes, cache_lens, reps), CostCurve.noise,
                              f"cost curve {curve_key(target.model, target.device, target.dtype)}", tries, budget)


def measure_trusted(target: Any, sizes: tuple[int, ...] = QUICK_SIZES, cache_lens: tuple[int, ...] = QUICK_CACHE_LENS,
                    reps: int = QUICK_REPS, tries: int = timing.TRIES) -> CostCurve:
    """:func:`measure_until_quiet`'s quiet curve, or :class:`BusyMachineError` in one line
    (nothing is cached): what ``specframe profile``, whose job is to cache a curve, runs (all
    ``tries``, however long: a full curve can take a minute on a quiet machine)."""
    got = measure_until_quiet(target, sizes, cache_lens, reps, tries, budget=float("inf"))
    if not got.quiet:
        raise BusyMachineError(f"cost curve {got.value.key} not kept: the machine is busy (its repetitions spread by "
                               f"{timing.percent(got.value.noise())} in {timing.tries_text(got.tries)}, at most "
                               f"{timing.percent(max_spread())} is trusted)", profile_hint(target.model))
    return got.value


def for_this_run(got: timing.Measured[CostCurve], target: Any) -> CostCurve:
    """Hand out a curve timed on a busy machine for this process only (uncached), with one
    warning line: its spread and the ``specframe profile`` command that measures it later."""
    curve = _MEMO[cache_dir(), got.value.key] = got.value
    warnings.warn(timing.busy_line(f"cost curve {curve.key}", curve.noise(), got.tries,
                                   "its least noisy measurement", profile_hint(target.model)),
                  timing.BusyMachineWarning, stacklevel=3)
    return curve


def profile_hint(model: Any) -> str:
    """The ``specframe profile`` command that measures ``model``'s curve with its linears."""
    from specframe.models.linears import linears_label
    from specframe.models.packed_linear import linear_kernel

    return profile_command(model, linear_kernel(model), linears_label(model))


def padded_rows(model: Any) -> list[int]:
    """The row counts ``model``'s linears pad a forward up to (the buckets of
    :class:`~specframe.models.packed_linear.PackedLinear`), or ``[]`` when they take any count."""
    from specframe.models.packed_linear import PackedLinear

    layer = next((m for m in model.modules() if isinstance(m, PackedLinear)), None)
    return [] if layer is None else list(layer.buckets)


def _time_tree(target: Any, tree: DraftTree, cache_len: int) -> float:
    """Seconds of one forward of ``tree`` whose root sits at position ``cache_len - 1``; the
    cache is cut back to the prefix afterwards."""
    device = target.device
    tokens, mask = tree.tokens.to(device), tree.ancestor_mask().to(device)
    positions = tree.positions(cache_len).to(device)
    prefix = target.cache_len
    _sync(device)
    start = time.perf_counter()
    target.tree_forward(tokens, positions, mask, max_position=cache_len - 2 + len(tree))
    _sync(device)
    spent = time.perf_counter() - start
    target.keep(prefix, torch.empty(0, dtype=torch.long), contiguous=True)  # back to the prefix
    return spent


def curve_for(target: Any, measure_if_missing: bool = True) -> CostCurve | None:
    """The cached curve of ``target`` for the current threads, else (by default) a short one
    measured now and cached; on a busy machine the measurement serves this run only
    (:func:`for_this_run`) and nothing is raised. None when absent and ``measure_if_missing``
    is False."""
    key = curve_key(target.model, target.device, target.dtype)
    curve = load_cached(key)
    if curve is not None and not curve.padded_to:
        padded = padded_rows(target.model)
        if padded:  # a curve cached before the staircase was kept (its key already names the kernel)
            curve = _MEMO[cache_dir(), key] = replace(curve, padded_to=padded)
    if curve is None and measure_if_missing:
        got = measure_until_quiet(target)
        curve = keep_measured(got.value) if got.quiet else for_this_run(got, target)
    if curve is not None and curve.key not in _SHOWN:
        _SHOWN.add(curve.key)
        _LOG.info("cost curve %s: %s", curve.key, curve.provenance())
    return curve


def keep_measured(curve: CostCurve) -> CostCurve:
    """Cache a curve just measured (:func:`save`); a read-only cache still keeps it for this
    process, so it is not measured again."""
    try:
        save(curve)
    except OSError:
        _MEMO[cache_dir(), curve.key] = curve
    return curve
