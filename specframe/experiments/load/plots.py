"""The load benchmark's plots (matplotlib, written as PNG next to summary.json)."""

from __future__ import annotations

from pathlib import Path


def _arms(cells: list[dict]) -> dict[str, list[dict]]:
    """Cells by arm, each arm's cells by rate."""
    out: dict[str, list[dict]] = {}
    for cell in cells:
        out.setdefault(cell["arm"], []).append(cell)
    return {arm: sorted(rows, key=lambda c: c["rate"]) for arm, rows in out.items()}


def make_plots(summary: dict, cells_series: dict, out_dir: Path) -> list[Path]:
    """``load_latency.png`` (throughput against p50 and p99 latency, one line per arm),
    ``load_tpot.png`` (mean TPOT against the offered rate) and ``load_live.png`` (the live
    batch over time at each rate); ``cells_series``: ``(rate, arm) -> (step_at, step_live)``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir) / "plots"
    out_dir.mkdir(parents=True, exist_ok=True)
    arms = _arms(summary["cells"])
    written = []
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, q in zip(axes, ("p50", "p99")):
        for arm, rows in arms.items():
            ax.plot([c[f"latency_{q}"] for c in rows], [c["throughput"] for c in rows], marker="o", label=arm)
        ax.set_xlabel(f"{q} end-to-end latency (s)")
        ax.set_title(f"throughput against {q} latency")
    axes[0].set_ylabel("throughput (tokens/s)")
    axes[0].legend(fontsize=8)
    written.append(_save(fig, out_dir / "load_latency.png"))
    fig, ax = plt.subplots(figsize=(6, 4))
    for arm, rows in arms.items():
        ax.plot([c["rate"] for c in rows], [1000 * (c["tpot_mean"] or 0) for c in rows], marker="o", label=arm)
    ax.set_xlabel("offered rate (requests/s)")
    ax.set_ylabel("mean TPOT (ms per token)")
    ax.legend(fontsize=8)
    written.append(_save(fig, out_dir / "load_tpot.png"))
    rates = sorted({c["rate"] for c in summary["cells"]})
    fig, axes = plt.subplots(len(rates), 1, figsize=(8, 2.2 * len(rates)), squeeze=False)
    for ax, rate in zip(axes[:, 0], rates):
        for arm in arms:
            at, live = cells_series.get((rate, arm), ([], []))
            ax.step(at, live, where="post", label=arm)
        ax.set_ylabel(f"live @ {rate:g}/s")
    axes[-1, 0].set_xlabel("time (s, open-loop clock)")
    axes[0, 0].legend(fontsize=7)
    written.append(_save(fig, out_dir / "load_live.png"))
    return written


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
