"""One experiment twice, float32 linears against bf16 linears, interleaved question by question
(four times with ``--exact both``: each linears with the exact forward off and on).

An experiment runs one target: every arm of it, the autoregressive baseline included, runs the
same linears, so its speedups and mismatches are read against the AR arm of *that* model. To
read what bf16 linears gain, this script runs the experiment file twice, ``[target] linears =
"float32"`` and ``"bf16"`` (everything else as the file says), into ``--out DIR/float32`` and
``DIR/bf16``, and prints both in one table::

    python benchmarks/linears_ab.py examples/demo.toml --out runs/linears-ab [--chunk 1]
        [--limit N] [--max-new-tokens T] [--arms talon,talon-16] [--threads 2] [--fresh]
        [--exact file|on|off|both]

``--exact``: ``file`` (default) keeps the file's ``[target] exact``; ``on`` / ``off`` set it for
both runs; ``both`` runs ``DIR/float32`` and ``DIR/bf16`` with the exact forward off, whatever
the file says, and adds two runs, ``DIR/float32-exact`` and ``DIR/bf16-exact``, with it on
(:mod:`specframe.models.exact`), all four taking turns.

How the two runs are interleaved: the question limit grows a chunk (``--chunk K``, default 1)
at a time, and for each chunk both runs answer their new questions, the run going first
alternating between chunks. So both linears' timings of a question are taken at most a few
minutes apart, and machine drift (1.5x within an hour on the shared 2-core machine) hits both
alike. Each run is the experiment's own machinery (:class:`~specframe.experiments.experiment.
Experiment`: its lock, its resume, its timing, warm-up and answer files), held in this one
process: :class:`HeldExperiment` keeps each target, its arms and their warm-up between chunks,
so a chunk costs its answers only (re-running ``run_experiment`` per chunk would load both
targets and warm every arm up again for every question). Each chunk checks that resuming with
the larger limit computed only the new answers (every answer file holds each question once).
The first chunk of each run also loads its target, builds its arms (an ``"auto"`` arm measures
the cost curve of its linears there, refused on a busy machine) and warms them up, untimed.

Crash-safe: the answers are the run's files, so running the same command again resumes where it
stopped (``--fresh`` starts over). At the end each run's report is written
(:func:`~specframe.experiments.report.write_report`) and the table is printed and saved as
``DIR/table.md``, with the bf16 run's tree shape against the root's confidence per talon arm.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from specframe.experiments.config import ArmConfig, ExperimentConfig, load_config
from specframe.experiments.data import Question, load_questions
from specframe.experiments.experiment import Experiment
from specframe.experiments.loading import ModelPool, stop_tokens
from specframe.experiments.metrics import load_run
from specframe.experiments.plots import shape_points
from specframe.experiments.report import write_report
from specframe.experiments.runners import build_runner
from specframe.experiments.runs import RunDir, RunFile, answer_key
from specframe.models.cache_keys import cpu_name

ROOT = Path(__file__).resolve().parent.parent
#: The two runs, in the order of the table's rows.
LINEARS = ("float32", "bf16")
#: The suffix of a run with the exact forward on.
EXACT = "-exact"


def variants(exact: str) -> tuple[str, ...]:
    """The runs of ``--exact``: the linears, then (``both``) the linears with the exact forward."""
    return LINEARS + tuple(lin + EXACT for lin in LINEARS) if exact == "both" else LINEARS


class HeldExperiment(Experiment):
    """An :class:`Experiment` that keeps its target, its arms' runners and their warm-up across
    :meth:`run` calls, so growing ``[data] limit`` between calls times only the new questions."""

    def __init__(self, config: ExperimentConfig, out_dir: Path, fresh: bool = False) -> None:
        super().__init__(config, out_dir, progress=False, fresh=fresh)
        self._held: tuple[ModelPool, Any] | None = None
        self._runners: dict[str, Any] = {}
        self._warm: set[str] = set()

    def prepare_arms(self, arms: list[ArmConfig], questions: list[Question]) -> tuple[Any, Any, dict, set[int]]:
        """The runners over the held target, built once per arm and reused by every chunk."""
        from specframe.models.target import TargetModel

        if self._held is None:
            pool = ModelPool(self.config)
            self._held = (pool, TargetModel(pool.target()))
        pool, target = self._held
        for arm in arms:
            if arm.name not in self._runners:
                self._runners[arm.name] = build_runner(arm, pool, target, self.config)
        runners = {arm.name: self._runners[arm.name] for arm in arms}
        self._skip_overflowing(self.encoder(), target, questions, runners)
        eos = stop_tokens(self.config, target)
        return self.encoder(), target, runners, eos

    def warm_up(self, arms: list[ArmConfig], runners: dict, encoder: Any, q: Question, eos: set[int]) -> None:
        # A held arm stays warm: warm up only the arms this process has not run yet.
        cold = [arm for arm in arms if arm.name not in self._warm]
        super().warm_up(cold, runners, encoder, q, eos)
        self._warm.update(arm.name for arm in cold)


def with_exact(config: ExperimentConfig, mode: str) -> ExperimentConfig:
    """``config`` with ``[target] exact`` as ``--exact`` says: ``file`` keeps it, ``on``/``off``
    set it, ``both`` turns it off (the runs without the ``-exact`` suffix are the stock forward,
    even where the file turns it on, as examples/demo.toml does)."""
    if mode == "file":
        return config
    return dataclasses.replace(config, target=dataclasses.replace(config.target, exact=mode == "on"))


def variant(config: ExperimentConfig, name: str, limit: int) -> ExperimentConfig:
    """``config`` with ``[target] linears`` (and ``exact`` for a name ending in ``-exact``) and
    ``[data] limit`` set (nothing else changes)."""
    exact = name.endswith(EXACT) or config.target.exact
    target = dataclasses.replace(config.target, linears=name.removesuffix(EXACT), exact=exact)
    return dataclasses.replace(config, target=target, data=dataclasses.replace(config.data, limit=limit))


def answer_lines(out_dir: Path, arms: list[ArmConfig]) -> dict[str, list[tuple[str, int]]]:
    """Per arm, the (question, repeat) key of every line of its answers file, duplicates kept."""
    run_dir, found = RunDir(out_dir), {}
    for arm in arms:
        path = run_dir.answers(arm.name)
        lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
        records = [json.loads(line) for line in lines if line.strip()]
        found[arm.name] = [answer_key(r["question_id"], r["repeat"]) for r in records if r.get("arm") == arm.name]
    return found


def run_chunk(exp: HeldExperiment, config: ExperimentConfig) -> tuple[int, int, float]:
    """Answer ``config``'s questions not yet on disk; ``(computed, reused, seconds)``. Raises
    RuntimeError if an answer already on disk was computed again."""
    before = answer_lines(exp.out_dir, config.arms)
    exp.config = config
    start = time.perf_counter()
    outcome = exp.run()
    seconds = time.perf_counter() - start
    after = answer_lines(exp.out_dir, config.arms)
    added = sum(len(after[a]) - len(before[a]) for a in after)
    repeated = [a for a, keys in after.items() if len(keys) != len(set(keys))]
    if added != outcome.computed or repeated:
        raise RuntimeError(f"{exp.out_dir}: resuming recomputed old answers (arms {repeated or 'all'}; "
                           f"{added} lines added for {outcome.computed} computed)")
    return outcome.computed, outcome.skipped, seconds


def asked(out_dir: Path) -> int:
    """How many questions the run in ``out_dir`` was given so far (0 for none): a run refuses a
    smaller limit (its questions would leave the data), so a resumed benchmark starts there."""
    return len(RunFile(out_dir).read().get("inputs", {})) if RunDir(out_dir).run_file.exists() else 0


def chunk_limits(done: int, total: int, chunk: int) -> list[int]:
    """The limits to run in turn: ``done`` first (where one run may lag the other after a crash),
    then ``chunk`` more questions at a time up to ``total``."""
    return ([done] if 0 < done < total else []) + list(range(done + chunk, total, chunk)) + [total]


def interleave(config: ExperimentConfig, out: Path, total: int, chunk: int, fresh: bool,
               names: tuple[str, ...] = LINEARS) -> dict[str, Path]:
    """Every run of ``names``, the limit growing ``chunk`` questions at a time; a progress line
    per chunk."""
    runs = {lin: HeldExperiment(variant(config, lin, total), out / lin, fresh=fresh) for lin in names}
    start = time.perf_counter()
    limits = chunk_limits(0 if fresh else max(asked(out / lin) for lin in names), total, chunk)
    for i, limit in enumerate(limits):
        parts = []
        for lin in names if i % 2 == 0 else names[::-1]:
            computed, reused, seconds = run_chunk(runs[lin], variant(config, lin, limit))
            runs[lin].fresh = False  # --fresh discards once, before the first chunk
            parts.append(f"{lin}: {computed} computed, {reused} reused, {seconds:.1f} s")
        print(f"chunk {i + 1}/{len(limits)}: questions 1-{limit} | " + " | ".join(parts)
              + f" | {time.perf_counter() - start:.0f} s in all", flush=True)
    return {lin: exp.out_dir for lin, exp in runs.items()}


def cell(value: Any, fmt: str) -> str:
    """``value`` formatted, or "-" when missing."""
    return "-" if value is None else format(value, fmt)


def speedup_cell(overall: dict) -> str:
    """``1.23x [1.10, 1.35]``: the speedup vs autoregressive and its 95% CI."""
    speedup, ci = overall.get("speedup"), overall.get("speedup_ci")
    if speedup is None:
        return "-"
    return f"{speedup:.2f}x" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")


def table(summaries: dict[str, dict], labels: dict[str, str], names: list[str]) -> list[str]:
    """The markdown table: per arm of ``names`` (a directory may hold more, from other runs), a
    row per run; every run but the first has its tokens/s over the first run's."""
    runs = list(summaries)
    rows = [f"| arm | linears | tau | tokens/s | speedup vs AR (95% CI) | mismatches vs AR | tokens/s / {runs[0]}'s |",
            "|---|---|---|---|---|---|---|"]
    arms = {lin: {a["name"]: a["overall"] for a in s["arms"]} for lin, s in summaries.items()}
    for name in names:
        for lin in runs:
            o = arms[lin].get(name, {})
            ratio = "-"
            first = arms[runs[0]].get(name, {}).get("tokens_per_s")
            if lin != runs[0] and o.get("tokens_per_s") and first:
                ratio = f"{o['tokens_per_s'] / first:.2f}"
            mismatches = "-" if o.get("compared") is None else f"{o.get('mismatches', 0)}/{o['compared']}"
            rows.append(f"| {name} | {labels[lin]} | {cell(o.get('tau'), '.2f')} | {cell(o.get('tokens_per_s'), '.1f')} "
                        f"| {speedup_cell(o)} | {mismatches} | {ratio} |")
    return rows


def header(config: ExperimentConfig, total: int, labels: dict[str, str]) -> list[str]:
    """Date, CPU, threads, commit, the command, and what the runs held."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip() or "unknown"
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    command = "python " + " ".join(shlex.quote(a) for a in sys.argv)
    return [f"{datetime.date.today().isoformat()}, {cpu_name() or 'unknown CPU'}, {config.threads or 'default'} "
            f"thread(s), commit {commit}{' (uncommitted changes)' if dirty else ''}, `{command}`",
            "",
            f"{config.name} on {config.target.model}: {total} question(s), {config.max_new_tokens} new tokens, "
            f"{config.repeats} repeat(s); runs: " + ", ".join(f"{k} = {v}" for k, v in labels.items()) + ". "
            "The runs interleaved question by question; each arm's speedup and mismatches are against the "
            "autoregressive arm of the same run.",
            ""]


def shape_lines(out_dir: Path, names: list[str]) -> list[str]:
    """Per talon arm of ``names`` in the run: mean tree depth below and above the median root confidence,
    and the path of the report's shape_confidence.png."""
    run = load_run(out_dir)
    lines = []
    for name, records in run["arms"].items():
        if name not in names:
            continue
        policy = (run["descriptions"][name].get("policy") or {}).get("name")
        pts = shape_points(records)
        if policy != "talon" or not len(pts):
            continue
        median = float(np.median(pts[:, 0]))
        low, high = pts[pts[:, 0] < median, 1], pts[pts[:, 0] >= median, 1]
        means = [f"{part.mean():.2f}" if len(part) else "-" for part in (low, high)]
        lines.append(f"- {name}: mean depth {means[0]} where the root's top p < {median:.2f} (the median), "
                     f"{means[1]} above; depths {int(pts[:, 1].min())}-{int(pts[:, 1].max())} over {len(pts)} steps")
    if not lines:
        lines.append("- no talon arm with recorded root confidences")
    plot = out_dir / "plots" / "shape_confidence.png"
    lines.append(f"- plot: {plot}" if plot.exists() else "- no shape_confidence.png (no root confidences recorded)")
    return lines


def main(argv: list[str] | None = None) -> str:
    """Run both linears interleaved, write both reports, print the table; returns the table text."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path, help="the experiment file")
    parser.add_argument("--out", type=Path, required=True, help="DIR: runs in DIR/float32 and DIR/bf16")
    parser.add_argument("--chunk", type=int, default=1, help="questions added per step (default 1)")
    parser.add_argument("--limit", type=int, default=None, help="first N questions (default: the file's limit)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="override the file's max_new_tokens")
    parser.add_argument("--threads", type=int, default=None, help="override the file's threads")
    parser.add_argument("--arms", default=None,
                        help="comma-separated arm names to keep (the autoregressive baseline is always kept)")
    parser.add_argument("--fresh", action="store_true", help="discard earlier answers in both runs first")
    parser.add_argument("--exact", choices=("file", "on", "off", "both"), default="file",
                        help="the exact forward: as the file says, on or off for both runs, or both (four runs)")
    args = parser.parse_args(argv)
    config = load_config(args.config)
    config = with_exact(config, args.exact)
    config = dataclasses.replace(config, max_new_tokens=args.max_new_tokens or config.max_new_tokens,
                                 threads=args.threads or config.threads)
    if args.arms:
        keep = set(args.arms.split(","))
        unknown = keep - {a.name for a in config.arms}
        if unknown:
            parser.error(f"--arms: no arm named {', '.join(sorted(unknown))} in {args.config}")
        config = dataclasses.replace(config, arms=[a for a in config.arms
                                                   if a.name in keep or a.baseline == "autoregressive"])
    total = len(load_questions(config.data.path, config.data.category, args.limit or config.data.limit))
    dirs = interleave(config, args.out, total, max(1, args.chunk), args.fresh, variants(args.exact))
    summaries = {lin: write_report(path) for lin, path in dirs.items()}
    labels = {lin: RunFile(path).read().get("linears", lin) + (" exact" if RunFile(path).read().get("exact") else "")
              for lin, path in dirs.items()}
    names = [a.name for a in config.arms]
    text = "\n".join([*header(config, total, labels), *table(summaries, labels, names), "",
                      "Tree depth vs the root's confidence, bf16 run:", *shape_lines(dirs["bf16"], names)]) + "\n"
    (args.out / "table.md").write_text(text, encoding="utf-8")
    print("\n" + text, end="")
    return text


if __name__ == "__main__":
    main()
