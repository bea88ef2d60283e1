"""The command behind ``specframe tune`` (specframe.cli calls :func:`tune_command`): progress
bars, the one-line refusals, the summary table and ``--confirm``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import click

from specframe.errors import one_line
from specframe.experiments.progress import exit_interrupted


def tune_command(config: Path, trace_dir: Path, out: Path, trials: int, arms: str | None, objective: str,
                 split: float, space: str, workers: int, ray_address: str | None, seed: int, fresh: bool,
                 confirm: bool, curve: Path | None, progress: bool, console: Any,
                 run_live: Callable[[Path, bool], None]) -> None:
    """Tune, print default vs tuned per arm and where the files are; with ``confirm`` run
    best.toml live (``run_live(path, progress)``: the ``run`` command's own path)."""
    from specframe.errors import ExperimentError
    from specframe.experiments.config import ConfigError
    from specframe.experiments.runlock import DirectoryInUseError
    from specframe.replay.runner import ReplayError
    from specframe.replay.trace import TraceError
    from specframe.tuning.outputs import BEST
    from specframe.tuning.study import TuneSettings
    from specframe.tuning.tune import run_tune

    wanted = [a.strip() for a in arms.split(",") if a.strip()] if arms else None
    try:
        # The Ray layer's rule: --workers N is N tasks, locally or on Ray.
        settings = TuneSettings(trials, objective, split, space, seed, workers, ray_address)
        with _Bars(progress, console) as on_event:
            results = run_tune(config, trace_dir, out, settings, wanted, curve, fresh, on_event)
    except (ConfigError, ExperimentError, TraceError, ReplayError, DirectoryInUseError, ImportError) as err:
        raise click.ClickException(one_line(err)) from None
    except KeyboardInterrupt:
        exit_interrupted(console, "trials", out)
    console.print(results_table(results, objective))
    console.print(f"Best: {out / BEST} (confirmation questions; run it live with `specframe run`); "
                  f"tune.json, report.md and plots/ in {out}", markup=False)
    if confirm:
        run_live(out / BEST, progress)


def results_table(results: list[Any], objective: str) -> Any:
    """Default vs tuned per arm, on the searched and the confirmation questions (projected)."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"tune ({objective}; replay: projected times)")
    for col in ("arm", "replay", "trials", "tau searched", "tau confirm", "speedup searched", "speedup confirm",
                "best options"):
        table.add_column(col, justify="left" if col in ("arm", "replay", "best options") else "right")
    fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    for r in results:
        t = r.trials
        for label, row, options in ((r.arm.name, r.default, "(as given)"),
                                    (r.tuned.name, r.best, ", ".join(f"{k}={_short(v)}" for k, v in r.best_options.items())
                                     or "(as given)")):
            s, c = row["searched"] or {}, row["confirmation"]
            table.add_row(escape(label), r.replay, f"{t['complete']}+{t['pruned']}p+{t['fail']}f",
                          fmt(s.get("tau")), fmt(c["tau"]), fmt(s.get("speedup")), fmt(c["speedup"]), escape(options))
    return table


def _short(value: Any) -> str:
    """A value as the table shows it (4 significant digits for a float; best.toml keeps all)."""
    return f"{value:.4g}" if isinstance(value, float) else repr(value)


class _Bars:
    """A rich progress bar per arm's study (nothing when disabled; notes are printed either way)."""

    def __init__(self, enabled: bool, console: Any) -> None:
        self.enabled, self.console, self.tasks = enabled, console, {}

    def __enter__(self) -> Callable[[str, str, Any], None]:
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

            self.bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), TimeRemainingColumn(), console=self.console)
            self.bar.__enter__()
        return self.event

    def event(self, kind: str, arm: str, value: Any) -> None:
        if kind == "note":
            self.console.print(f"{arm}: {value}", markup=False)
        elif not self.enabled:
            return
        elif kind == "start":
            self.tasks[arm] = self.bar.add_task(f"trials {arm} (replay)", total=value[1], completed=value[0])
        elif kind == "trial":
            self.bar.update(self.tasks[arm], completed=value)

    def __exit__(self, *exc: Any) -> None:
        if self.enabled:
            self.bar.__exit__(*exc)
