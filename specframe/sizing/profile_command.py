"""``specframe profile``: load a target as the command does, measure its cost curve, cache it,
print it as a table and plot it (the curve itself and its cache live in
:mod:`specframe.sizing.profile`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from specframe.sizing.profile import (FULL_CACHE_LENS, FULL_REPS, FULL_SIZES, CostCurve, measure_trusted,
                                      save)


def format_table(curve: CostCurve) -> str:
    """T(n) in ms and T(n)/T(1) per cache length, one row per size."""
    head = "    n  " + "  ".join(f"{f'L={c} ms':>11} {'x T(1)':>7}" for c in curve.cache_lens)
    lines = [f"cost curve {curve.key}", curve.provenance(), head]
    for j, n in enumerate(curve.sizes):
        cells = [f"{1e3 * row[j]:>11.3f} {row[j] / row[0]:>7.2f}" for row in curve.seconds]
        lines.append(f"{n:>5}  " + "  ".join(cells))
    return "\n".join(lines)


def plot(curve: CostCurve, path: Path) -> Path:
    """Plot T(n)/T(1) against n (one line per cache length) to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for i, cache_len in enumerate(curve.cache_lens):
        row = curve.seconds[i]
        ax.plot(curve.sizes, [t / row[0] for t in row], marker="o", label=f"cache {cache_len}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tree tokens n (root included)")
    ax.set_ylabel("T(n) / T(1)")
    return save_plot(fig, ax, curve.key, path)


def save_plot(fig: Any, ax: Any, title: str, path: Path) -> Path:
    """Title (a curve's key, small), grid and legend on ``ax``; ``fig`` written to ``path`` (PNG)
    and closed. The cost-curve plots' shared finish."""
    import matplotlib.pyplot as plt

    ax.set_title(title, fontsize=7)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def parse_ints(text: str | None, default: tuple[int, ...]) -> tuple[int, ...]:
    """``"1,2,4"`` -> ``(1, 2, 4)`` sorted, ``None`` -> ``default``; sizes must be >= 1."""
    if not text:
        return default
    values = sorted({int(v) for v in text.split(",") if v.strip()})
    if not values or values[0] < 1:
        raise ValueError(f"expected comma-separated integers >= 1, got {text!r}")
    return tuple(values)


def load_profiled_target(name: str, dtype: str = "float32", device: str | None = None,
                         threads: int | None = None, packed_linears: bool | str = False,
                         linears: str = "float32", exact: bool = False) -> Any:
    """Load ``name`` (path, hub id or shipped name) as the :class:`~specframe.models.target.TargetModel`
    whose curves :func:`profile_model` measures: ``threads`` torch threads (None keeps the
    current setting), ``device`` None / ``"auto"`` = CUDA when available, ``packed_linears``
    as [target] packed_linears (True or ``"auto"``: the fastest kernel here), ``linears`` as
    [target] linears (``"bf16"``: :mod:`specframe.models.linears`), ``exact`` as [target] exact
    (:mod:`specframe.models.exact`)."""
    from specframe.models.target import TargetModel, load_causal_lm

    if threads:
        torch.set_num_threads(int(threads))
    if device in (None, "auto"):  # as the experiment's [target] device: CUDA when available
        device = "cuda" if torch.cuda.is_available() else "cpu"
    model = load_causal_lm(name, dtype=dtype, device=torch.device(device))
    if packed_linears or linears != "float32":
        from specframe.models.linears import apply_linears

        apply_linears(model, linears, packed_linears)
    if exact:
        from specframe.models.exact import use_exact

        use_exact(model)
    return TargetModel(model)


def profile_model(name: str, dtype: str = "float32", device: str | None = None, threads: int | None = None,
                  sizes: tuple[int, ...] = FULL_SIZES, cache_lens: tuple[int, ...] = FULL_CACHE_LENS,
                  reps: int = FULL_REPS, plot_path: Path | None = None,
                  packed_linears: bool | str = False, linears: str = "float32") -> tuple[CostCurve, Path, Path]:
    """Load ``name`` (:func:`load_profiled_target`), measure its curve, cache it and plot it.

    Returns the curve, the cache file and the plot. ``threads`` sets torch's intra-op threads
    for the measurement (and the key); None keeps the current setting. ``packed_linears``
    measures the model with fast small-batch linears (:mod:`specframe.models.packed_linear`; True or
    ``"auto"``: the fastest kernel here, or ``"native"`` / ``"onednn"`` / ``"mkl"``), cached apart;
    ``linears="bf16"`` measures the bf16 linears (cached apart too).
    """
    return profile_target(load_profiled_target(name, dtype, device, threads, packed_linears, linears),
                          sizes, cache_lens, reps, plot_path)


def profile_target(target: Any, sizes: tuple[int, ...] = FULL_SIZES, cache_lens: tuple[int, ...] = FULL_CACHE_LENS,
                   reps: int = FULL_REPS, plot_path: Path | None = None) -> tuple[CostCurve, Path, Path]:
    """Measure ``target``'s curve (:func:`~specframe.sizing.profile.measure_trusted`), cache it
    and plot it; returns the curve, the cache file and the plot."""
    curve = measure_trusted(target, sizes, cache_lens, reps)
    path = save(curve)
    png = plot(curve, plot_path or path.with_suffix(".png"))
    return curve, path, png
