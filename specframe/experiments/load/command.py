"""The body of ``specframe load`` (the click command itself lives in ``specframe/cli.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from specframe.experiments.progress import exit_interrupted


class _Bar:
    """A rich progress bar over the cells (nothing when disabled)."""

    def __init__(self, enabled: bool, console: Any) -> None:
        self.bar = self.task = None
        if enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), console=console, transient=False)

    def __call__(self, done: int, total: int, label: str) -> None:
        if self.bar is None:
            return
        if self.task is None:
            self.bar.start()
            self.task = self.bar.add_task(label, total=total)
        self.bar.update(self.task, completed=done, description=label)
        if done == total:
            self.bar.stop()


def load_command(config_path: Path, options: dict[str, Any], out: Path | None, progress: bool, console: Any) -> None:
    """Validate, serve every missing (rate, arm, round) cell, print the table and where the files
    are; ``options``: the command line's [load] settings (None: the file's, else the default)."""
    from specframe.experiments.config import ConfigError, load_config
    from specframe.experiments.load.run import LoadRun
    from specframe.experiments.load.settings import load_settings, parse_rates
    from specframe.experiments.load.table import markdown_table

    try:
        config = load_config(config_path)
        rates = options.get("rates")
        settings = load_settings(config.load, {**options, "rates": parse_rates(rates) if rates else None})
    except (ConfigError, ValueError, TypeError) as err:
        raise click.ClickException(str(err).splitlines()[0]) from err
    if settings.arrivals != "poisson" and not Path(settings.arrivals).is_file():
        raise click.ClickException(f"--arrivals {settings.arrivals!r}: give 'poisson' or an existing file of "
                                   "arrival times (seconds, one per line)")
    out_dir = out or Path(str(config.output.dir) + "-load")
    bar = _Bar(progress, console)
    try:
        summary = LoadRun(config, settings, out_dir, progress=bar).run()
    except ConfigError as err:
        raise click.ClickException(str(err)) from err
    except KeyboardInterrupt:
        exit_interrupted(console, "cells", out_dir)
    console.print(markdown_table(summary), markup=False)
    for line in mismatch_lines(out_dir, summary):
        console.print(line, markup=False)
    console.print(f"Summary: {out_dir / 'summary.json'}  table: {out_dir / 'table.md'}  plots: {out_dir / 'plots'}",
                  markup=False)
    print_prediction(summary, out_dir, console)


def print_prediction(summary: dict, out_dir: Path, console: Any) -> None:
    """The predicting allocators' model beside the measurement, per live batch size (where
    they part, the model is wrong), and where every arm's is kept."""
    from specframe.experiments.load.prediction import prediction_table

    table = prediction_table(summary)
    if table:
        console.print("Predicted beside measured, per live batch size (means per step):", markup=False)
        console.print(table, markup=False)
    console.print(f"Every arm per live batch size: {out_dir / 'prediction.md'}", markup=False)


def mismatch_lines(out_dir: Path, summary: dict) -> list[str]:
    """One line per request of this run's cells (``summary``'s rates, arms and rounds) that left
    its greedy decoding: where, and the target's top-2 logit margin there (a float32 near-tie,
    or a bug). Other cell files in the folder, from an earlier run's rates or arms, are not
    this run's."""
    from specframe.experiments.load.store import cell_path, read_json
    from specframe.experiments.metrics import NEAR_TIE

    lines = []
    rounds = summary["settings"]["rounds"]
    for path in (cell_path(out_dir, c["rate"], c["arm"], r) for c in summary["cells"] for r in range(rounds)):
        cell = read_json(path) or {}
        for i, row in enumerate(cell.get("requests", [])):
            if not row.get("mismatch"):
                continue
            margin = row.get("margin")
            verdict = "" if margin is None else f"; the target's top-2 logit margin there is {margin:.3g}" + (
                " (a float32 near-tie)" if margin < NEAR_TIE else " (not a near-tie: a bug to report)")
            lines.append(f"mismatch: {cell['arm']} @ {cell['rate']:g}/s, round {cell.get('round', 0) + 1}, request {i}: "
                         f"token {row.get('diverged_at')} is {row.get('token')}, greedy decoding's "
                         f"{row.get('reference_token')}{verdict}")
    return lines
