"""Figures of a run (matplotlib, Agg canvas, PNG), regenerated from the answer records.

No global backend is switched: figures are built on ``matplotlib.figure.Figure`` with an Agg
canvas, so importing this module never disturbs a user's interactive matplotlib.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from specframe.experiments.metrics import step_points
from specframe.experiments.explorer.tokentext import visible


def _figure(width: float, height: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path


def _grid(n: int, cols: int = 3) -> tuple[int, int]:
    cols = min(cols, max(1, n))
    return math.ceil(n / cols), cols


# ---------------------------------------------------------------------- individual figures
def funnel_heatmaps(summary: dict, path: Path) -> Path | None:
    """One heatmap per tree arm: depth (rows) x sibling rank (columns) -> accepted frequency."""
    arms = [a for a in summary["arms"] if a.get("funnel")]
    if not arms:
        return None
    rows, cols = _grid(len(arms))
    fig = _figure(4.2 * cols, 3.4 * rows)
    vmax = max(max(map(max, a["funnel"]["frequency"])) for a in arms) or 1.0
    # Same columns for every arm (comparable), but no empty columns beyond the deepest rank seen.
    used = max(int(np.nonzero(np.array(a["funnel"]["counts"]).sum(axis=0))[0].max(initial=0)) for a in arms)
    for i, arm in enumerate(arms):
        ax = fig.add_subplot(rows, cols, i + 1)
        freq = np.array(arm["funnel"]["frequency"])[:, : used + 1]
        image = ax.imshow(freq, aspect="auto", cmap="viridis", vmin=0, vmax=vmax)
        r = arm["funnel"]["max_rank"]
        ax.set_xticks(range(used + 1), [str(k) if k < r else f"{r}+" for k in range(used + 1)], fontsize=7)
        step = max(1, math.ceil(freq.shape[0] / 12))  # deep trees: label every step-th depth
        ticks = range(0, freq.shape[0], step)
        ax.set_yticks(ticks, [str(d + 1) for d in ticks], fontsize=7)
        ax.set_xlabel("sibling rank")
        ax.set_ylabel("depth")
        ax.set_title(arm["name"], fontsize=9)
    fig.colorbar(image, ax=fig.axes, shrink=0.8, label="accepted per step")
    fig.suptitle("Acceptance funnel")
    return _save(fig, path)


def delta_tau_scatter(run: dict, summary: dict, path: Path) -> Path:
    """Per-answer (delta, tau) points per arm, arm means, and the oracle line tau = delta."""
    fig = _figure(8.5, 4.8)
    ax = fig.add_subplot(1, 1, 1)
    top, tau_top = 1.0, 1.0
    colors = arm_colors(summary)
    for arm in summary["arms"]:
        color = colors[arm["name"]]
        pts = np.array(step_points(run["arms"][arm["name"]]))
        if not len(pts):
            continue
        ax.scatter(pts[:, 0], pts[:, 1], s=10, alpha=0.35, color=color)
        o = arm["overall"]
        ax.scatter([o["delta"] or 0], [o["tau"] or 0], s=70, marker="D", edgecolor="black", color=color,
                   label=arm["name"])
        top = max(top, float(pts[:, 0].max()))
        tau_top = max(tau_top, float(pts[:, 1].max()))
    line = np.linspace(0, top * 1.05, 50)
    ax.plot(line, line, "k--", lw=1, label="oracle: tau = delta")
    ax.plot(line, line + 1, ":", color="grey", lw=1, label="chain bound: tau = delta + 1")
    ax.set_xlim(left=-0.1)
    ax.set_ylim(0, tau_top * 1.15 + 0.5)  # the data, not the oracle line, sets the scale
    ax.set_xlabel("delta (draft forwards per target forward)")
    ax.set_ylabel("tau (tokens per target forward)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))  # outside: never over data
    ax.set_title("delta vs tau (dots: answers, diamonds: arm totals)", fontsize=10)
    return _save(fig, path)


def shape_distributions(summary: dict, path: Path) -> Path | None:
    """Per tree arm: tree depth and widest-layer distributions (box plots), mean width per depth."""
    arms = [a for a in summary["arms"] if a.get("shapes")]
    if not arms:
        return None
    colors = arm_colors(summary)
    fig = _figure(max(12.0, 9.0 + 0.8 * len(arms)), 4.4)
    axes = [fig.add_subplot(1, 3, k + 1) for k in range(3)]
    for ax, key, label in ((axes[0], "depth_hist", "tree depth"), (axes[1], "max_width_hist", "widest layer (nodes)")):
        samples = [np.repeat(np.arange(len(a["shapes"][key])), a["shapes"][key]) for a in arms]
        box = ax.boxplot(samples, patch_artist=True, widths=0.6, showfliers=True)
        for patch, arm in zip(box["boxes"], arms):
            patch.set_facecolor(colors[arm["name"]])
        ax.set_xticks(range(1, len(arms) + 1), [a["name"] for a in arms], rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(label)
        ax.set_title(f"{label.split(' (')[0].capitalize()} per step")
    for arm in arms:
        prof = arm["shapes"]["width_profile"]
        axes[2].plot(range(len(prof)), prof, marker="o", ms=3, color=colors[arm["name"]], label=arm["name"])
    axes[2].set_xlabel("depth")
    axes[2].set_ylabel("mean nodes at depth")
    axes[2].set_title("Width profile (mean over steps)")
    axes[2].legend(fontsize=7)
    return _save(fig, path)


def speedup_bars(summary: dict, path: Path) -> Path | None:
    """Speedup over autoregressive per arm; error bars: bootstrap CI (else std over repeats)."""
    arms = [a for a in summary["arms"] if a["overall"].get("speedup") is not None]
    if not arms:
        return None
    fig = _figure(max(5.0, 0.9 * len(arms) + 2), 4.2)
    ax = fig.add_subplot(1, 1, 1)
    values = np.array([a["overall"]["speedup"] for a in arms])
    err = np.zeros((2, len(arms)))
    for i, a in enumerate(arms):
        ci, std = a["overall"].get("speedup_ci"), a["overall"].get("speedup_std")
        if ci:
            err[:, i] = [max(0.0, values[i] - ci[0]), max(0.0, ci[1] - values[i])]
        elif std:
            err[:, i] = std
    colors = arm_colors(summary)
    ax.bar(range(len(arms)), values, yerr=err, capsize=4, color=[colors[a["name"]] for a in arms])
    ax.axhline(1.0, color="black", lw=0.8, ls="--")
    ax.set_xticks(range(len(arms)), [a["name"] for a in arms], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("speedup vs autoregressive")
    ax.set_title("Speedup (error bars: 95% bootstrap CI over questions)")
    return _save(fig, path)


def quality_pareto(summary: dict, path: Path) -> Path | None:
    """Speedup against NLL gap: what each lossy arm buys in speed for what its text costs
    (the lossless reference sits at gap 0); the upper-left frontier is joined. None without a
    scored lossy arm."""
    arms = [a for a in summary["arms"] if a["overall"].get("nll_gap") is not None
            and a["overall"].get("speedup") is not None]
    if not any("lossy" in a for a in arms):
        return None
    fig = _figure(6.4, 4.4)
    ax = fig.add_subplot(1, 1, 1)
    colors = arm_colors(summary)
    points = [(a["overall"]["nll_gap"], a["overall"]["speedup"], a) for a in arms]
    for gap, speed, arm in points:
        ax.scatter(gap, speed, s=60, color=colors[arm["name"]], marker="o" if "lossy" in arm else "s",
                   edgecolors="black", linewidths=0.6, zorder=3)
        ax.annotate(arm["name"], (gap, speed), textcoords="offset points", xytext=(6, 4), fontsize=8)
    frontier, best = [], -np.inf
    for gap, speed, _ in sorted(points, key=lambda p: (p[0], -p[1])):
        if speed > best:
            frontier.append((gap, speed))
            best = speed
    ax.plot(*zip(*frontier), color="grey", lw=1, ls="--", zorder=2)
    ax.axvline(0.0, color="black", lw=0.8, ls=":")
    ax.set_xlabel(f"NLL gap per token vs {summary.get('nll_reference')} (nats; > 0: less likely text)")
    ax.set_ylabel("speedup vs autoregressive")
    ax.set_title("Speed vs quality cost (circles: lossy; dashed: Pareto frontier)", fontsize=10)
    return _save(fig, path)


# ---------------------------------------------------------------------- trees
def tree_graph(data: dict) -> Any:
    """A ``networkx.DiGraph`` of a recorded tree, nodes added in depth-first order.

    Attributes match :meth:`DraftTree.to_networkx` (token, depth, rank) plus ``accepted``.
    DFS insertion order keeps siblings' subtrees apart in a layered layout.
    """
    import networkx as nx

    parents = data["parents"]
    children: dict[int, list[int]] = {i: [] for i in range(len(parents))}
    for i, p in enumerate(parents):
        if p >= 0:
            children[p].append(i)
    accepted = set(data.get("accepted", []))
    graph = nx.DiGraph()
    stack = [0]
    while stack:
        node = stack.pop()
        graph.add_node(node, token=data["tokens"][node], depth=data["depths"][node], rank=data["ranks"][node],
                       accepted=node in accepted)
        if parents[node] >= 0:
            graph.add_edge(parents[node], node)
        stack.extend(reversed(children[node]))
    return graph


def typical_trees(records: list[dict], k: int = 3) -> list[dict]:
    """``k`` recorded trees closest to the arm's median (size, depth): its typical shape."""
    trees = [t for r in records for t in r.get("trees", [])]
    if not trees:
        return []
    size = np.array([len(t["tokens"]) for t in trees], dtype=float)
    depth = np.array([max(t["depths"]) for t in trees], dtype=float)
    dist = np.abs(size - np.median(size)) / (size.std() + 1) + np.abs(depth - np.median(depth)) / (depth.std() + 1)
    return [trees[i] for i in np.argsort(dist, kind="stable")[:k]]


def node_label(data: dict, node: int, width: int = 10) -> str:
    """A recorded tree node's label: its decoded text with whitespace visible (the token id
    for records without text), at most ``width`` characters, safe from matplotlib's mathtext."""
    texts = data.get("text")
    label = visible(texts[node]) if texts else str(data["tokens"][node])
    if len(label) > width:
        label = label[: width - 1] + "\u2026"
    return label.replace("$", r"\$")  # a $ pair would start mathtext


def tree_drawings(run: dict, summary: dict, path: Path, k: int = 3) -> Path | None:
    """A row of ``k`` typical trees per tree arm, nodes labelled with their decoded text (in a
    large tree, the root and the accepted path only); accepted path highlighted."""
    import networkx as nx

    arms = [(a["name"], typical_trees(run["arms"][a["name"]], k)) for a in summary["arms"]]
    arms = [(n, t) for n, t in arms if t]
    if not arms:
        return None
    fig = _figure(4.6 * k, 3.2 * len(arms))
    for i, (name, trees) in enumerate(arms):
        for j, data in enumerate(trees):
            ax = fig.add_subplot(len(arms), k, i * k + j + 1)
            graph = tree_graph(data)
            pos = tidy_layout(graph)
            colors = ["tab:green" if graph.nodes[n]["accepted"] else "tab:blue" for n in graph]
            small = graph.number_of_nodes() <= 16
            nx.draw_networkx(graph, pos, ax=ax, node_size=40 if small else 14, node_color=colors,
                             with_labels=False, arrows=False, width=0.6)
            shown = [n for n in graph if small or n == 0 or graph.nodes[n]["accepted"]]
            beside = {n: (x + 0.25, y) for n, (x, y) in pos.items()}  # right of the dot: its colour stays visible
            nx.draw_networkx_labels(graph, beside, ax=ax, labels={n: node_label(data, n) for n in shown}, font_size=7,
                                    horizontalalignment="left",
                                    bbox={"boxstyle": "round,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.7})
            ax.set_title(f"{name}: {graph.number_of_nodes()} nodes, depth {max(data['depths'])}, "
                         f"{len(data.get('accepted', [])) - 1} accepted", fontsize=8)
            ax.axis("off")
    fig.suptitle("Typical draft trees (green: accepted path; labels: decoded tokens, \u2423 = space, \u21b5 = newline)")
    return _save(fig, path)


def shape_points(records: list[dict]) -> np.ndarray:
    """``[n, 3]``: per recorded step with a root confidence, (the drafter's top probability
    at the root, tree depth, widest layer below the root)."""
    rows = []
    for r in records:
        steps = r.get("steps") or {}
        for p, depth, widths in zip(steps.get("root_p") or [], steps.get("depth", []), steps.get("widths", [])):
            if p is not None:
                rows.append((p, depth, max(widths[1:], default=0)))
    return np.array(rows, dtype=float).reshape(-1, 3)


def shape_vs_confidence(run: dict, summary: dict, path: Path, bins: int = 8) -> Path | None:
    """TALON's figure, from this run: one panel per tree arm, its tree depth (left axis) and
    widest layer (right axis) against the drafter's confidence at the root; each step a dot,
    the mean per confidence bin a line. An adaptive policy goes deep and narrow where the
    drafter is sure, wide and shallow where it is not; a fixed shape draws flat lines. None
    without recorded root confidences."""
    arms = [(a["name"], shape_points(run["arms"].get(a["name"], []))) for a in summary["arms"]]
    arms = [(n, pts) for n, pts in arms if len(pts)]
    if not arms:
        return None
    rows, cols = _grid(len(arms), 4)
    fig = _figure(3.9 * cols, 3.0 * rows + 0.4)
    edges = np.linspace(0.0, 1.0, bins + 1)
    rng = np.random.default_rng(0)  # jitter only spreads integer shapes apart; seeded, reproducible
    for i, (name, pts) in enumerate(arms):
        left = fig.add_subplot(rows, cols, i + 1)
        right = left.twinx()
        which = np.clip(np.digitize(pts[:, 0], edges) - 1, 0, bins - 1)
        used = [b for b in range(bins) if (which == b).any()]
        centres = [(edges[b] + edges[b + 1]) / 2 for b in used]
        for ax, col, color, label in ((left, 1, "tab:blue", "depth"), (right, 2, "tab:orange", "widest layer")):
            ax.scatter(pts[:, 0], pts[:, col] + rng.uniform(-0.15, 0.15, len(pts)), s=5, alpha=0.2, color=color)
            ax.plot(centres, [pts[which == b, col].mean() for b in used], marker="o", ms=3, lw=1.8, color=color,
                    label=label)
            ax.set_ylim(0, max(1.0, float(pts[:, col].max())) * 1.08)
            ax.tick_params(axis="y", colors=color, labelsize=7)
        left.set_xlim(0, 1)
        left.tick_params(axis="x", labelsize=7)
        left.set_title(f"{name} ({len(pts)} steps)", fontsize=9)
        if i % cols == 0:
            left.set_ylabel("tree depth", color="tab:blue", fontsize=8)
        if i % cols == cols - 1 or i == len(arms) - 1:
            right.set_ylabel("widest layer (nodes)", color="tab:orange", fontsize=8)
        if i >= len(arms) - cols:
            left.set_xlabel("root confidence (top child's p)", fontsize=8)
    fig.suptitle("Tree shape vs the drafter's confidence at the root (dots: steps; lines: mean per bin)", fontsize=10)
    return _save(fig, path)


def tidy_layout(graph: Any) -> dict[int, tuple[float, float]]:
    """Crossing-free positions for a tree graph: leaves side by side in depth-first order,
    each parent centred over its children, depth downwards (root on top)."""
    pos: dict[int, tuple[float, float]] = {}
    next_leaf = [0.0]

    def place(node: int) -> float:
        kids = list(graph.successors(node))
        if kids:
            x = sum(place(k) for k in kids) / len(kids)
        else:
            x, next_leaf[0] = next_leaf[0], next_leaf[0] + 1.0
        pos[node] = (x, -float(graph.nodes[node]["depth"]))
        return x

    place(0)
    return pos


def arm_colors(summary: dict) -> dict[str, Any]:
    """One colour per arm, by its position in the run, the same in every figure."""
    from matplotlib import colormaps

    names = [a["name"] for a in summary["arms"]]
    cmap = colormaps["tab10" if len(names) <= 10 else "tab20"]
    return {name: cmap(i % cmap.N) for i, name in enumerate(names)}


# ---------------------------------------------------------------------- all
def make_plots(run: dict, summary: dict, plot_dir: str | Path) -> dict[str, Path]:
    """Write every figure that has data; returns ``{title: path}``."""
    plot_dir = Path(plot_dir)
    made = {
        "Speedup vs autoregressive": speedup_bars(summary, plot_dir / "speedup.png"),
        "Acceptance funnel (depth x sibling rank)": funnel_heatmaps(summary, plot_dir / "funnel.png"),
        "delta vs tau": delta_tau_scatter(run, summary, plot_dir / "delta_tau.png"),
        "Tree depth and width distributions": shape_distributions(summary, plot_dir / "shapes.png"),
        "Tree shape vs the drafter's confidence at the root": shape_vs_confidence(run, summary,
                                                                                 plot_dir / "shape_confidence.png"),
        "Typical trees": tree_drawings(run, summary, plot_dir / "trees.png"),
        "Speedup vs NLL gap (lossy verifiers)": quality_pareto(summary, plot_dir / "quality_pareto.png"),
    }
    return {title: p for title, p in made.items() if p is not None}
