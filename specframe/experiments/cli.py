"""The experiment harness's commands' glue (specframe.cli calls these): run an experiment file and
print its summary, and the paired comparison of ``specframe compare``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from specframe.errors import one_line
from specframe.experiments.progress import exit_interrupted


#: Width of output that goes to a pipe or file: wide enough that no table cell is cut.
PIPE_WIDTH = 1000


def make_console() -> Any:
    """rich console; piped output is not squeezed to 80 columns (tables keep arm names whole)."""
    from rich.console import Console

    console = Console()
    if console.is_terminal or os.environ.get("COLUMNS"):
        return console
    return Console(width=PIPE_WIDTH)


def run_config(config_path: Path, out: Path | None, fresh: bool, progress: bool, title: str | None = None,
               ray_address: str | None = None, workers: int | None = None, allow_mixed_devices: bool = False,
               plots: bool = True) -> None:
    """Validate, run (resuming), write the report, print the summary table and where the files are.
    With ``ray_address`` the answers are computed by ``workers`` Ray actors (docs/distributed.md);
    ``plots``: draw the report's figures (about 0.3 s each: most of a small run's time)."""
    from specframe.experiments.config import ConfigError, load_config
    from specframe.experiments.experiment import ExperimentError, run_experiment
    from specframe.experiments.report import write_report

    try:
        config = load_config(config_path)
    except ConfigError as err:
        raise click.ClickException(one_line(err)) from err
    out_dir = out or config.output.dir
    console = make_console()
    for arm in config.arms:
        if arm.imported:  # an arm written in an engine's vocabulary says how faithfully it runs
            console.print(f"{arm.name}: imported from {arm.imported['engine']}; fidelity: {arm.imported['fidelity']}",
                          markup=False)
    try:
        if ray_address is None:
            outcome = run_experiment(config, out_dir=out_dir, fresh=fresh, progress=progress, console=console)
        else:
            from specframe.experiments.cluster.driver import run_sharded

            outcome = run_sharded(config, out_dir, ray_address, workers, fresh=fresh, progress=progress, console=console)
        summary = write_report(outcome.out_dir, plots=plots, allow_mixed_devices=allow_mixed_devices)
    except ExperimentError as err:
        raise click.ClickException(one_line(err)) from err
    except KeyboardInterrupt:
        exit_interrupted(console, "answers", out_dir)
    reused = f", {outcome.skipped} reused from earlier runs (--fresh recomputes)" if outcome.skipped else ""
    print_summary(console, summary, f"{outcome.computed} answers computed{reused}. ", outcome.out_dir, title)


def print_summary(console: Any, summary: dict, prefix: str, run_dir: Path, title: str | None = None) -> None:
    """The summary table, its notes and where the report is."""
    from specframe.experiments.report import notice_lines, summary_table
    from specframe.experiments.runs import RunDir

    console.print(summary_table(summary, title=title))
    for line in notice_lines(summary):
        console.print(f"Note: {line}", markup=False)
    console.print(f"{prefix}Report: {RunDir(run_dir).report}", markup=False)


def _records_of(source: Path, arm: str | None) -> tuple[str, list[dict]]:
    """``(label, records)`` of an answers file, or of one arm of a run dir / experiment file."""
    from specframe.experiments.runs import read_answers

    if arm is None:
        if not source.is_file():
            raise click.ClickException(f"{source} is not an answers file (.jsonl)")
        return source.stem, read_answers(source)
    run = _load_run(source)
    if arm not in run["arms"]:
        raise click.ClickException(f"no answers for arm {arm!r} in {source}; arms: {', '.join(run['arms'])}")
    return arm, run["arms"][arm]


def _load_run(source: Path) -> dict:
    from specframe.experiments.metrics import load_run
    from specframe.experiments.runs import RunDir

    run_dir = source
    if source.is_file() and source.suffix == ".toml":
        from specframe.experiments.config import ConfigError, load_config

        try:
            run_dir = load_config(source).output.dir
        except ConfigError as err:
            raise click.ClickException(one_line(err)) from err
    if not RunDir(run_dir).is_run():
        raise click.ClickException(f"{run_dir} is not a run directory (no {RunDir(run_dir).run_file.name})")
    return load_run(run_dir)


def _pairs(args: tuple[Path | str, ...]) -> list[tuple[tuple[str, list], tuple[str, list]]]:
    if len(args) == 2:
        return [(_records_of(Path(args[0]), None), _records_of(Path(args[1]), None))]
    source = Path(args[0])
    if len(args) == 3:
        return [(_records_of(source, str(args[1])), _records_of(source, str(args[2])))]
    run = _load_run(source)
    if run["baseline"] is None:
        raise click.ClickException(f"{source} has no autoregressive arm; name two arms to compare")
    base = (run["baseline"], run["arms"][run["baseline"]])
    return [(base, (name, recs)) for name, recs in run["arms"].items() if name != run["baseline"]]


def compare_main(sources: tuple[str, ...], level: float) -> None:
    """``specframe compare SOURCES``: a table of paired comparisons (see the command's help)."""
    from rich.markup import escape
    from rich.table import Table

    from specframe.experiments.metrics import compare

    if len(sources) not in (1, 2, 3):
        raise click.UsageError("give A.jsonl B.jsonl, RUN_DIR ARM_A ARM_B, or RUN_DIR")
    table = Table(title=f"paired comparison (speedup = wall A / wall B; {level:.0%} bootstrap CI)")
    for col in ("A", "B", "pairs", "speedup (geo-mean)", "CI", "total-time ratio", "identical outputs",
                "token agreement", "tau A", "tau B"):
        table.add_column(col, justify="left" if col in ("A", "B") else "right")
    for (name_a, rec_a), (name_b, rec_b) in _pairs(sources):
        try:
            res = compare(rec_a, rec_b, level=level)
        except ValueError as err:
            raise click.ClickException(f"{name_a} vs {name_b}: {err}") from err
        ci = res["speedup_ci"]
        table.add_row(
            escape(name_a), escape(name_b), str(res["pairs"]), f"{res['speedup_geomean']:.3f}",
            "-" if ci is None else f"[{ci[0]:.3f}, {ci[1]:.3f}]", f"{res['speedup_total']:.3f}",
            f"{res['identical_outputs']}/{res['pairs']}", f"{res['token_agreement']:.1%}",
            "-" if res["tau_a"] is None else f"{res['tau_a']:.2f}", "-" if res["tau_b"] is None else f"{res['tau_b']:.2f}",
        )
    make_console().print(table)
