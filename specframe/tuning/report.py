"""The tune's report: per arm, default vs tuned; parameter importances (Optuna's fANOVA); the
optimisation history and a parallel-coordinates plot (matplotlib, as the other plots)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

REPORT = "report.md"


def importances(study: Any, seed: int = 0) -> dict[str, float]:
    """fANOVA importance of each parameter over the completed trials (empty when fewer than
    two trials completed or no parameter varied)."""
    from optuna.importance import FanovaImportanceEvaluator, get_param_importances

    try:
        return dict(get_param_importances(study, evaluator=FanovaImportanceEvaluator(seed=seed)))
    except (RuntimeError, ValueError):  # too few trials, or a single distinct point
        return {}


def plots(study: Any, where: Path, stem: str) -> list[Path]:
    """``<stem>-history.png`` and ``<stem>-parallel.png`` (the latter when a parameter varied)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as ovm

    where.mkdir(parents=True, exist_ok=True)
    out = []
    for name, draw in (("history", ovm.plot_optimization_history), ("parallel", ovm.plot_parallel_coordinate)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                ax = draw(study)
            except (ValueError, RuntimeError):
                continue
        fig = (ax.flat[0] if hasattr(ax, "flat") else ax).figure
        fig.set_size_inches(8, 4.5)
        fig.tight_layout()
        path = where / f"{stem}-{name}.png"
        fig.savefig(path)
        plt.close(fig)
        out.append(path)
    return out


def _fmt(value: Any) -> str:
    return "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)


def markdown(results: list[Any], settings: dict, questions: dict, out_dir: Path, seed: int = 0) -> str:
    """report.md: the search, then one section per arm (table, best options, importances, plots)."""
    obj = settings["objective"]
    lines = [f"# specframe tune ({obj}, replayed: projected times)", "",
             f"{questions['searched']} questions searched, {questions['confirmation']} kept for confirmation "
             f"(split {settings['split']}); space: {settings['space']}; {settings['trials']} trials per arm, seed "
             f"{settings['seed']}. Confirm live: `specframe run {out_dir / 'best.toml'}` (or `tune --confirm`).", ""]
    for r in results:
        lines += [f"## {r.arm.name}" + (f" (replay {r.replay}: projected figures are approximate)"
                                         if r.replay != "exact" else ""), "",
                  "| arm | tau (searched) | speedup (searched) | tau (confirmation) | speedup (confirmation) |",
                  "|---|---|---|---|---|"]
        for label, row in (("default", r.default), (r.tuned.name, r.best)):
            s, c = row["searched"] or {}, row["confirmation"]
            lines.append(f"| {label} | {_fmt(s.get('tau'))} | {_fmt(s.get('speedup'))} | {_fmt(c['tau'])} | "
                         f"{_fmt(c['speedup'])} |")
        t = r.trials
        lines += ["", f"Trials: {t['complete']} complete, {t['pruned']} pruned, {t['fail']} failed; "
                      f"{r.seconds:.1f} s of trials.", "",
                  "Best options: " + (", ".join(f"`{k} = {v!r}`" for k, v in r.best_options.items())
                                      or "the arm's own (no trial beat the default)"), ""]
        imp = importances(r.study, seed)
        if imp:
            lines += ["| parameter | importance (fANOVA) |", "|---|---|"]
            lines += [f"| {k} | {v:.3f} |" for k, v in imp.items()] + [""]
        stem = r.arm.slug
        for path in plots(r.study, out_dir / "plots", stem):
            lines += [f"![{path.stem}](plots/{path.name})", ""]
    return "\n".join(lines)
