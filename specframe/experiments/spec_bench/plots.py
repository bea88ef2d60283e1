"""The leaderboard's figure: grouped bars, one group per task (and Overall), one bar per arm."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specframe.experiments.spec_bench.tasks import TASKS


def speedup_bars(summary: dict, path: Path) -> Path:
    """Speedup over the baseline per task and overall, one bar per arm (the baseline's 1.0 is
    the dashed line); written as PNG to ``path``."""
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    groups = [(key, label) for key, label in TASKS if key in summary["tasks"]] + [("overall", "Overall")]
    arms = [a for a in summary["arms"] if a["arm"] != summary["baseline"]]
    fig = Figure(figsize=(min(18.0, max(7.0, 0.35 * len(groups) * len(arms) + 3)), 4.2), dpi=100,
                 layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    width = 0.8 / max(1, len(arms))
    x = np.arange(len(groups))
    # The default cycle has ten colours: an eleventh arm would share the first one's.
    cmap = colormaps["tab10" if len(arms) <= 10 else "tab20"]
    for i, arm in enumerate(arms):
        values = [(arm["speedup"] if key == "overall" else arm["tasks"].get(key, {}).get("speedup")) for key, _ in groups]
        ax.bar(x + (i - (len(arms) - 1) / 2) * width, [v if v is not None else 0.0 for v in values], width,
               label=arm["arm"], color=cmap(i % cmap.N))
    ax.axhline(1.0, color="black", linestyle="--", linewidth=0.8)
    ax.set_xticks(x, [label for _, label in groups])
    ax.set_ylabel(f"speedup over {summary['baseline']}")
    ax.set_title("Spec-Bench: speedup per task (mean speed over the baseline's)")
    if arms:
        ax.legend(fontsize=7, ncols=2 if len(arms) > 6 else 1, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path
