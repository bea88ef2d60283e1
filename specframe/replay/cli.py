"""The commands behind ``specframe record``, ``run --replay`` and ``sweep`` (specframe.cli calls these)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

import click

from specframe.errors import one_line
from specframe.experiments.progress import exit_interrupted


def _config(path: Path) -> Any:
    from specframe.experiments.config import ConfigError, load_config

    try:
        return load_config(path)
    except ConfigError as err:
        raise click.ClickException(one_line(err)) from err


def record_config(config_path: Path, out: Path, progress: bool, console: Any, ray_address: str | None = None,
                  workers: int | None = None, fresh: bool = False) -> None:
    """Record the trace of ``config_path`` into ``out`` (over Ray workers with ``ray_address``)
    and say what it holds; a trace of this experiment already there is kept unless ``fresh``."""
    from specframe.errors import ExperimentError
    from specframe.replay.record import complete_trace, record_trace

    config = _config(config_path)
    found = None if fresh else complete_trace(config, out)
    if found is not None:
        console.print(f"trace: {out} already holds this experiment's trace ({len(found.prompts)} prompts): "
                      "nothing recorded (--fresh records again)", markup=False)
        return
    try:
        if ray_address is None:
            trace = record_trace(config, out, progress=progress, console=console)
        else:
            from specframe.replay.sharded_record import record_sharded

            trace = record_sharded(config, out, ray_address, workers, progress=progress, console=console, fresh=fresh)
    except ExperimentError as err:
        raise click.ClickException(one_line(err)) from err
    layers = f", hidden layers {trace.hidden_layers} ({trace.environment['hidden_dtype']})" if trace.hidden_layers else ""
    devices = trace.environment.get("devices", [])
    on = f"; recorded on {len(devices)} devices" if len(devices) > 1 else ""
    console.print(f"trace: {out} ({len(trace.prompts)} prompts{layers}; curve {trace.environment['curve_key']}{on})",
                  markup=False)


def replay_config(config_path: Path, trace_dir: Path, out: Path | None, curve: Path | None, fresh: bool,
                  progress: bool, console: Any, print_summary: Callable, plots: bool = True) -> None:
    """Replay ``config_path`` over ``trace_dir``, write the report (its figures where ``plots``)
    and print its table."""
    from specframe.experiments.report import write_report
    from specframe.replay.runner import replay_experiment

    config = _config(config_path)
    try:
        outcome = replay_experiment(config, trace_dir, out, curve=curve, fresh=fresh, progress=progress, console=console)
    except KeyboardInterrupt:
        exit_interrupted(console, "answers")
    summary = write_report(outcome.out_dir, plots=plots)
    console.print(f"Replayed over {trace_dir}; {summary['replay']['projection']}", markup=False)
    print_summary(console, summary, f"{outcome.computed} answers replayed. ", outcome.out_dir,
                  f"{summary.get('name')} (replayed, projected times)")


def sweep_config(sweep_path: Path, trace_dir: Path, out: Path | None, ray_address: str | None,
                 workers: int | None, curve: Path | None, progress: bool, console: Any,
                 fail_fast: bool = False, fresh: bool = False) -> None:
    """Run a sweep with a progress bar; print its table, the best configuration per category
    and the failed configurations (then exit 1: a failed configuration is no result)."""
    from specframe.experiments.config import ConfigError
    from specframe.errors import ExperimentError
    from specframe.experiments.runlock import DirectoryInUseError
    from specframe.replay.trace import TraceError
    from specframe.replay.sweep import RAY_MISSING, done_names, is_failure, load_sweep, run_sweep

    if ray_address is not None:
        try:
            import ray  # noqa: F401
        except ImportError:
            raise click.ClickException(RAY_MISSING) from None
    try:
        sweep = load_sweep(sweep_path)
    except ConfigError as err:
        raise click.ClickException(one_line(err)) from err
    out_dir = out or sweep.out_dir
    # The Ray layer's rule: --workers N is N tasks; without it, local processes default to the
    # CPUs (at most 4) and Ray to the cluster's CPUs.
    workers = workers if ray_address is not None else workers or min(os.cpu_count() or 1, 4)
    names = {c.name for c in sweep.configs}
    done = 0 if fresh else len(done_names(out_dir, sweep.configs))
    try:
        with _bar(len(sweep.configs), done, progress, console) as advance:
            rows = run_sweep(sweep, trace_dir, out_dir, ray_address, workers, curve,
                             on_done=lambda r: advance(len(r)), fail_fast=fail_fast, fresh=fresh)
    except (DirectoryInUseError, ExperimentError, TraceError) as err:
        raise click.ClickException(one_line(err)) from None
    rows = [r for r in rows if r["name"] in names]
    succeeded = [r for r in rows if not is_failure(r)]
    if succeeded:
        _print_successes(succeeded, out_dir, console)
    failed = [r for r in rows if is_failure(r)]
    not_run = len(names) - len(rows)
    _print_failures(failed, not_run, fail_fast, out_dir, console)
    if failed or not_run:
        raise click.exceptions.Exit(1)


def _print_successes(rows: list[dict], out_dir: Path, console: Any) -> None:
    """The table, the best configuration per category, and best.json and the plots written."""
    console.print(sweep_table(rows))
    best = best_per_category(rows)
    for cat, row in best.items():
        console.print(f"best for {cat}: {row['name']} (projected speedup {row['speedup']:.2f})", markup=False)
    figures = pareto_plots(rows, out_dir / "plots")
    (out_dir / "best.json").write_text(json.dumps(best, indent=1) + "\n", encoding="utf-8")
    console.print(f"Results: {out_dir / 'results.jsonl'}; plots: {', '.join(str(f) for f in figures)}", markup=False)


def _print_failures(failed: list[dict], not_run: int, fail_fast: bool, out_dir: Path, console: Any) -> None:
    """Each failed configuration with its error, and how many never ran (--fail-fast)."""
    if failed:
        console.print(f"failed configurations ({len(failed)}):", markup=False)
        for row in failed:
            console.print(f"  {row['name']}: {row['error']}", markup=False)
    if not_run:
        why = " (--fail-fast: stopped at the first failure)" if fail_fast else ""
        console.print(f"{not_run} configuration(s) not run{why}", markup=False)
    if failed or not_run:
        console.print(f"Rerun the same command to replay only these ({out_dir / 'results.jsonl'} keeps the rest).",
                      markup=False)


class _bar:
    """rich progress over configurations (a no-op when disabled)."""

    def __init__(self, total: int, done: int, enabled: bool, console: Any) -> None:
        self.total, self.done, self.enabled, self.console = total, done, enabled, console

    def __enter__(self) -> Callable[[int], None]:
        if not self.enabled:
            return lambda n: None
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self._p = Progress(TextColumn("[bold]configurations (replay)"), BarColumn(), MofNCompleteColumn(),
                           TimeElapsedColumn(), TimeRemainingColumn(), console=self.console)
        self._p.__enter__()
        task = self._p.add_task("sweep", total=self.total, completed=self.done)
        return lambda n: self._p.update(task, advance=n)

    def __exit__(self, *exc: Any) -> None:
        if self.enabled:
            self._p.__exit__(*exc)


def sweep_table(rows: list[dict]) -> Any:
    """One table of every configuration that succeeded (every row is replayed, and says so)."""
    from rich.markup import escape
    from rich.table import Table

    rows = _successes(rows)
    table = Table(title="sweep (replay: projected times)")
    for col in ("configuration", "drafter", "policy", "tau", "delta", "tokens/s (projected)", "speedup (projected)"):
        table.add_column(col, justify="left" if col in ("configuration", "drafter", "policy") else "right")
    for r in sorted(rows, key=lambda r: -(r["overall"]["speedup"] or 0)):
        o = r["overall"]
        table.add_row(escape(r["name"] + " (replay)"), r["drafter"], r["policy"], f"{o['tau']:.3f}", f"{o['delta']:.3f}",
                      f"{o['tokens_per_s']:.1f}", "-" if o["speedup"] is None else f"{o['speedup']:.3f}")
    return table


def best_per_category(rows: list[dict]) -> dict[str, dict]:
    """The configuration of highest projected speedup, overall and in each category (failed
    configurations have no speedup and are left out)."""
    rows = _successes(rows)
    best: dict[str, dict] = {}
    cats = sorted({c for r in rows for c in r["categories"]})
    for cat in ["overall", *cats]:
        scored = [(m["speedup"], r["name"]) for r in rows
                  for m in [r["overall"] if cat == "overall" else r["categories"].get(cat)] if m and m.get("speedup")]
        if scored:
            speed, name = max(scored)
            best[cat] = {"name": name, "speedup": speed}
    return best


def pareto_plots(rows: list[dict], where: Path) -> list[Path]:
    """tau vs delta (Pareto front marked) and projected speedup vs budget, per category."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = _successes(rows)
    where.mkdir(parents=True, exist_ok=True)
    cats = ["overall", *sorted({c for r in rows for c in r["categories"]})]
    paths = []
    for kind in ("tau_delta", "speedup_budget"):
        fig, axes = plt.subplots(1, len(cats), figsize=(4 * len(cats), 3.5), squeeze=False)
        for ax, cat in zip(axes[0], cats):
            ms = [(r, r["overall"] if cat == "overall" else r["categories"].get(cat)) for r in rows]
            ms = [(r, m) for r, m in ms if m]
            if kind == "tau_delta":
                pts = [(m["delta"], m["tau"]) for _, m in ms]
                ax.scatter(*zip(*pts), s=10) if pts else None
                front = pareto_front(pts)
                ax.plot(*zip(*front), color="C3") if front else None
                ax.set_xlabel("delta (draft forwards / step)")
                ax.set_ylabel("tau")
            else:
                for drafter in sorted({r["drafter"] for r, _ in ms}):
                    pts = sorted((r["options"].get("policy.budget"), m["speedup"]) for r, m in ms
                                 if r["drafter"] == drafter and isinstance(r["options"].get("policy.budget"), int)
                                 and m["speedup"] is not None)
                    if pts:
                        ax.scatter(*zip(*pts), s=10, label=drafter)
                ax.set_xlabel("budget")
                ax.set_ylabel("projected speedup")
            ax.set_title(f"{cat} (replay)")
        fig.tight_layout()
        path = where / f"{kind}.png"
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    return paths


def _successes(rows: list[dict]) -> list[dict]:
    """The rows with metrics (a failure row has only the configuration and its error)."""
    return [r for r in rows if not r.get("failed")]


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Points no other point beats (less or equal delta with more tau), by delta."""
    front, best = [], float("-inf")
    for x, y in sorted(points, key=lambda p: (p[0], -p[1])):
        if y > best:
            front.append((x, y))
            best = y
    return front
