"""Cost curves at a batch shape: T_B(n), one packed forward of B trees of n nodes each.

A sequence decoding in a batch of B pays a share of a forward of ``[B, n_max]`` rows, not the
one-row forward :mod:`specframe.sizing.profile` measures: on a CPU a 4 x 4 forward costs far less than
four 4-node forwards, so a tree that is too big alone can pay in a batch (docs/batching.md,
"budget = auto in a batch"). This module measures T_B(n) with the batched decoder's own packed
forward (:class:`~specframe.decode.kv_padded.BatchKV`), caches it beside the one-row curves (key
suffix ``_b{B}``), and gives each row its share: ``T_b(n) / b`` for the live batch size ``b``,
interpolated between the measured powers of two.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from specframe.sizing.profile import QUICK_CACHE_LENS, QUICK_REPS, QUICK_SIZES, CostCurve, _interp, _sync, balanced_tree, \
    curve_for, curve_key, keep_measured, load_cached, measure, save
from specframe.sizing.profile_command import save_plot


def measured_batches(rows: int) -> list[int]:
    """``[1, 2, 4, ..., rows]``: the batch sizes whose curves price a batch of up to ``rows``."""
    out, b = [], 1
    while b < rows:
        out.append(b)
        b *= 2
    return out + [rows]


def batch_curve_key(target: Any, batch: int, layout: str = "padded") -> str:
    """Cache key of the curve at batch ``batch`` in ``layout`` (the one-row key for 1)."""
    key = curve_key(target.model, target.device, target.dtype)
    return key if batch == 1 else f"{key}_b{batch}" + ("_flat" if layout == "flat" else "")


def _time_batch(target: Any, kv: Any, trees: list, width: int) -> float:
    """Seconds of one packed forward of ``trees``; the cache is cut back to ``width`` columns."""
    _sync(target.device)
    t0 = time.perf_counter()
    kv.tree_forward(trees)
    _sync(target.device)
    spent = time.perf_counter() - t0
    kv.keep([torch.empty(0, dtype=torch.long)] * len(trees), width)
    return spent


def measure_batch(target: Any, batch: int, sizes: tuple[int, ...] = QUICK_SIZES,
                  cache_lens: tuple[int, ...] = QUICK_CACHE_LENS, reps: int = QUICK_REPS,
                  layout: str = "padded") -> CostCurve:
    """T_B(n) of ``target`` at ``batch`` rows: median of ``reps`` packed forwards of ``batch``
    balanced ``n``-node trees (after a warm-up round), every row on a prefix of each cache
    length, in the batch cache ``layout`` (``"padded"`` or ``"flat"``). Rounds visit every
    point in turn, as :func:`~specframe.sizing.profile.measure` does."""
    from specframe.decode.kv_flat import make_batch_kv

    vocab = target.vocab_size
    usable = [c for c in cache_lens if c + max(sizes) < target.max_positions] or [1]
    trees = [balanced_tree(n, vocab) for n in sizes]
    runs: list[list[list[float]]] = [[[] for _ in sizes] for _ in usable]
    for rep in range(reps + 1):
        for i, cache_len in enumerate(usable):
            kv = make_batch_kv(target, layout, reserve=max(sizes) + 1)
            prefix = torch.arange(cache_len - 1, device=target.device) % vocab
            kv.prefill([prefix] * batch)
            width = kv.width
            _time_batch(target, kv, [trees[0]] * batch, width)  # untimed, as in profile.measure
            for j, tree in enumerate(trees):
                spent = _time_batch(target, kv, [tree] * batch, width)
                if rep:
                    runs[i][j].append(spent)
    seconds = [[statistics.median(r) for r in row] for row in runs]
    # No staircase: packed linears pad the B x n rows of the whole forward, not n.
    return CostCurve(batch_curve_key(target, batch, layout), list(sizes), usable, seconds)


def batch_curve_for(target: Any, batch: int, measure_if_missing: bool = True,
                    layout: str = "padded") -> CostCurve | None:
    """The cached curve of ``target`` at ``batch`` rows in ``layout``, else (by default) one
    measured now and cached; batch 1 is :func:`~specframe.sizing.profile.curve_for`'s one-row curve."""
    if batch == 1:
        return curve_for(target, measure_if_missing)
    curve = load_cached(batch_curve_key(target, batch, layout))
    if curve is None and measure_if_missing:
        curve = keep_measured(measure_batch(target, batch, layout=layout))
    return curve


@dataclass
class BatchCurves:
    """The curves of one target at the measured batch sizes, and each row's share at any size.

    Attributes:
        curves: batch size -> T_B curve (same sizes and cache lengths for B > 1).
    """

    curves: dict[int, CostCurve] = field(default_factory=dict)

    @classmethod
    def for_target(cls, target: Any, rows: int, layout: str = "padded") -> "BatchCurves":
        """Curves at :func:`measured_batches` ``(rows)`` in ``layout``, cached or measured now."""
        return cls({b: batch_curve_for(target, b, layout=layout) for b in measured_batches(rows)})

    def row_curve(self, live: int) -> CostCurve:
        """What one of ``live`` rows pays: ``T_live(n) / live``. A size not measured is
        interpolated linearly in the batch size between the measured sizes around it (past
        the largest: extrapolated along the last two), on the grid of the upper one."""
        if live in self.curves:
            curve = self.curves[live]
        else:
            sizes = sorted(self.curves)
            above = [b for b in sizes if b > live]
            hi = above[0] if above else sizes[-1]
            lo = max(b for b in sizes if b < hi) if len(sizes) > 1 else hi
            curve = self._between(lo, hi, live)
        return self._share(curve, live)

    def _between(self, lo: int, hi: int, live: int) -> CostCurve:
        """The curve at ``live`` rows from those at ``lo`` and ``hi`` (read at ``hi``'s points)."""
        a, b = self.curves[lo], self.curves[hi]
        seconds = [[t if lo == hi else _interp([lo, hi], [a.time(n, c), t], live)
                    for n, t in zip(b.sizes, row)] for c, row in zip(b.cache_lens, b.seconds)]
        return CostCurve(f"{b.key}@{live}", list(b.sizes), list(b.cache_lens), seconds)

    @staticmethod
    def _share(curve: CostCurve, live: int) -> CostCurve:
        """``curve`` with every time divided by ``live``: one row's share of the forward (a
        batch of one keeps its curve, staircase included)."""
        if live == 1:
            return curve
        return CostCurve(f"{curve.key}_row", list(curve.sizes), list(curve.cache_lens),
                         [[t / live for t in row] for row in curve.seconds])


# ---------------------------------------------------------------------- specframe profile --batch
def profile_batches(target: Any, batches: tuple[int, ...], sizes: tuple[int, ...], cache_lens: tuple[int, ...],
                    reps: int, plot_path: Path | None = None,
                    layout: str = "padded") -> tuple[dict[int, CostCurve], dict[int, Path], Path]:
    """Measure and cache ``target``'s curve at every batch size (1: the one-row curve) in the
    batch cache ``layout``, and plot each row's share; returns the curves, their cache files
    and the plot."""
    curves, paths = {}, {}
    for b in batches:
        curve = measure(target, sizes, cache_lens, reps) if b == 1 else \
            measure_batch(target, b, sizes, cache_lens, reps, layout)
        curves[b], paths[b] = curve, save(curve)
    png = plot_row_shares(curves, plot_path or paths[batches[0]].with_suffix(".batch.png"))
    return curves, paths, png


def format_row_shares(curves: dict[int, CostCurve]) -> str:
    """One row's share ``T_B(n) / B`` in ms at the shortest cache length, one column per batch
    size, and its ratio to the one-row forward where batch 1 was measured."""
    batches = sorted(curves)
    first = curves[batches[0]]
    head = "    n  " + "  ".join(f"{f'B={b} ms/row':>12}" for b in batches)
    lines = [f"row share T_B(n) / B at cache {first.cache_lens[0]}", head]
    for n in first.sizes:
        cells = []
        for b in batches:
            share = curves[b].time(n, first.cache_lens[0]) / b
            ratio = "" if 1 not in curves or b == 1 else f" ({share / curves[1].time(n, first.cache_lens[0]):.2f}x)"
            cells.append(f"{1e3 * share:>12.3f}{ratio}")
        lines.append(f"{n:>5}  " + "  ".join(cells))
    return "\n".join(lines)


def plot_row_shares(curves: dict[int, CostCurve], path: Path) -> Path:
    """Plot ``T_B(n) / B`` (ms, shortest cache) against n, one line per batch size, to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for b in sorted(curves):
        curve = curves[b]
        ax.plot(curve.sizes, [1e3 * curve.time(n, curve.cache_lens[0]) / b for n in curve.sizes],
                marker="o", label=f"B = {b}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tree tokens n per row (root included)")
    ax.set_ylabel("one row's share of the forward (ms)")
    return save_plot(fig, ax, curves[min(curves)].key, path)
