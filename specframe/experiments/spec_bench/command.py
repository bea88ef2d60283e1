"""The body of ``specframe bench spec-bench``: run the experiment into the bench directory's
run directory (resuming), then write and print the leaderboard from its answers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from specframe.errors import ExperimentError, one_line
from specframe.experiments.spec_bench.layout import BenchDir

#: The baseline every speedup is taken against (Spec-Bench's vanilla decoding).
BASELINE = "autoregressive"


def check_config(config: Any) -> tuple[str, list]:
    """``(baseline arm name, questions)``: the experiment can be benchmarked; else one line
    naming what is wrong (no autoregressive arm, batching, categories that are no task's)."""
    from specframe.experiments.data import load_questions
    from specframe.experiments.spec_bench.tasks import categories_error, unknown_categories

    base = next((a.name for a in config.arms if a.baseline == BASELINE), None)
    if base is None:
        raise click.ClickException(f"{config.source or config.name}: Spec-Bench's speedups are over vanilla decoding: "
                                   f"add an arm with baseline = \"{BASELINE}\"; arms: "
                                   f"{', '.join(a.name for a in config.arms)}")
    if config.batch_size != 1:
        raise click.ClickException(f"batch_size = {config.batch_size}: Spec-Bench times one sequence at a time "
                                   "(and its MT-bench questions have two turns); set batch_size = 1")
    questions = load_questions(config.data.path, config.data.category, config.data.limit)
    unknown = unknown_categories(q.category for q in questions)
    if unknown:
        raise click.ClickException(categories_error(f"[data] {config.data.path}", unknown))
    return base, questions


def answer_keys(config: Any, questions: list, run_dir: Path) -> set[tuple[str, int]]:
    """The answers this experiment has: its questions (less those its run left out as too long)
    times its repeats. Only these enter the leaderboard."""
    from specframe.experiments.runs import RunFile, answer_key

    skipped = RunFile(run_dir).overflow_skipped_ids()
    return {answer_key(q.question_id, r) for q in questions if json.dumps(q.question_id) not in skipped
            for r in range(config.repeats)}


def build_summary(config: Any, base: str, questions: list, run_dir: Path) -> dict:
    """The leaderboard of the experiment's arms from the answers in ``run_dir``, with the
    conditions it was measured under."""
    from specframe.experiments.metrics import load_run
    from specframe.experiments.spec_bench.leaderboard import leaderboard
    from specframe.experiments.spec_bench.tasks import task_of

    run = load_run(run_dir)
    arms = {a.name: run["arms"][a.name] for a in config.arms if a.name in run["arms"]}
    board = leaderboard(arms, base, run["greedy"], keep=answer_keys(config, questions, run_dir))
    per_task: dict[str, int] = {}
    for q in questions:
        per_task[task_of(q.category)] = per_task.get(task_of(q.category), 0) + 1
    conditions = {"experiment": config.name, "source": str(config.source or ""), "target": config.target.model,
                  "max_new_tokens": config.max_new_tokens, "repeats": config.repeats,
                  "data": str(config.data.path), "questions": per_task, "torch": run.get("torch"),
                  "devices": sorted({json.dumps(r.get("device"), sort_keys=True)
                                     for recs in arms.values() for r in recs if r.get("device")})}
    conditions["devices"] = [json.loads(d) for d in conditions["devices"]]
    return {**board, "conditions": conditions}


def write_outputs(summary: dict, bench: BenchDir) -> None:
    """summary.json, leaderboard.md and the figure."""
    from specframe.experiments.runs.layout import write_json
    from specframe.experiments.spec_bench.plots import speedup_bars
    from specframe.experiments.spec_bench.table import equality_lines, markdown_table

    write_json(bench.summary, summary)
    c = summary["conditions"]
    head = (f"# Spec-Bench leaderboard: {c['experiment']}\n\nTarget {c['target']}, {c['max_new_tokens']} new tokens, "
            f"{c['repeats']} repeat(s), questions per task {c['questions']}; speedups over {summary['baseline']} "
            "(per task: mean tokens/s of the arm over the baseline's, averaged over repeats).\n\n")
    bench.table.write_text(head + markdown_table(summary) + "\n\n" + "\n".join(equality_lines(summary)) + "\n",
                           encoding="utf-8")
    speedup_bars(summary, bench.plot)


def spec_bench_main(config_path: Path, out: Path | None, fresh: bool, progress: bool, console: Any) -> dict:
    """Validate, run every missing answer into ``DIR/run``, write its report and the
    leaderboard's files, print the table; returns the leaderboard's summary."""
    from specframe.experiments.config import ConfigError, load_config
    from specframe.experiments.experiment import run_experiment
    from specframe.experiments.progress import exit_interrupted
    from specframe.experiments.report import write_report
    from specframe.experiments.spec_bench.table import equality_lines, markdown_table

    try:
        config = load_config(config_path)
    except ConfigError as err:
        raise click.ClickException(one_line(err)) from err
    base, questions = check_config(config)
    bench = BenchDir(out) if out is not None else BenchDir.default(config.output.dir)
    try:
        outcome = run_experiment(config, out_dir=bench.run, fresh=fresh, progress=progress, console=console)
        write_report(outcome.out_dir)
    except ExperimentError as err:
        raise click.ClickException(one_line(err)) from err
    except KeyboardInterrupt:
        exit_interrupted(console, "answers", bench.run)
    summary = build_summary(config, base, questions, bench.run)
    write_outputs(summary, bench)
    reused = f", {outcome.skipped} reused (--fresh recomputes)" if outcome.skipped else ""
    console.print(markdown_table(summary), markup=False)
    for line in equality_lines(summary):
        console.print(line, markup=False)
    console.print(f"{outcome.computed} answers computed{reused}. Summary: {bench.summary}  table: {bench.table}  "
                  f"plot: {bench.plot}  run: {bench.run}", markup=False)
    return summary
