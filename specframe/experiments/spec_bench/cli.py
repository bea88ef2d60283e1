"""The ``specframe bench`` group and its ``spec-bench`` command (``specframe/cli.py`` adds the group)."""

from __future__ import annotations

from pathlib import Path

import click


@click.group("bench")
def bench_group() -> None:
    """Published benchmarks run over an experiment file's arms."""


@bench_group.command("spec-bench")
@click.argument("config", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Output directory (default: the [output] dir of the config + '-spec-bench').")
@click.option("--fresh", is_flag=True, help="Discard earlier answers in the output directory instead of resuming.")
@click.option("--progress/--no-progress", default=True, help="Show the progress bar.")
def spec_bench_command(config: Path, out: Path | None, fresh: bool, progress: bool) -> None:
    """Spec-Bench's leaderboard for CONFIG's arms: every arm against its autoregressive arm on
    CONFIG's questions (Spec-Bench's categories), per task speedup (mean tokens/s over the
    baseline's), mean accepted tokens and Overall, every answer checked token for token against
    the baseline. Writes DIR/summary.json, DIR/leaderboard.md and a plot; the answers live in
    DIR/run, and a rerun computes only the missing ones (docs/spec-bench.md)."""
    from specframe.experiments.cli import make_console
    from specframe.experiments.spec_bench.command import spec_bench_main

    spec_bench_main(config, out, fresh, progress, make_console())
