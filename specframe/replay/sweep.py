"""``specframe sweep SWEEP.toml --replay TRACE``: replay a grid of configurations over one trace.

A sweep file names a base experiment and a grid over arm options::

    base = "smollm2.toml"            # the experiment (relative to this file)
    arms = ["talon"]                 # base arms to sweep (default: every specframe arm)
    chunk = 8                        # configurations per task (one model load each)
    [grid]
    "policy.budget" = [4, 8, 16]
    "policy.mu" = [0.01, 0.03]
    [output]
    dir = "../runs/smollm2-sweep"

Configurations are split into chunks; a chunk is one replayed experiment (the autoregressive
arm + its configurations) in its own run directory, run in a local process or a Ray task.

Crash safety: the sweep holds a :class:`~specframe.experiments.runlock.RunLock` on its output directory;
each finished chunk appends its rows to ``results.jsonl`` at once, fsynced, and a torn last
line (a killed sweep) is dropped with a warning. Chunks are formed from the sweep file's full
list of configurations and their directories are named by a hash of their configurations, so
a rerun maps every configuration to the same directory and resumes its finished answers.

Failure isolation: a chunk whose replay raises replays its configurations one at a time and
records a failure row (``"failed": true`` with the one-line ``"error"``) for each that raises;
a chunk whose worker dies gets failure rows for its configurations. The sweep goes on (or,
with ``fail_fast``, stops after the first failure). A rerun recomputes the failed and missing
configurations only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import multiprocessing
import shutil
from concurrent.futures import CancelledError, Future, ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from specframe.experiments.config import ArmConfig, ConfigError, ExperimentConfig, expand_sweep, load_config, tomllib
from specframe.errors import ExperimentError, one_line, warn
from specframe.experiments.cluster import rayrun
from specframe.experiments.cluster.rayrun import RAY_MISSING  # noqa: F401 - the sweep command's message
from specframe.experiments.runlock import RunLock
from specframe.experiments.runs.jsonl import append_line, open_for_append, read_lines

#: What a sweep stopped by a lost Ray node keeps, and how it goes on.
RESUME = "The configurations finished so far are kept: run the same command again to replay only the rest."

RESULTS = "results.jsonl"
#: What the rows of a sweep directory are tied to (:func:`sweep_fingerprint`).
SWEEP_FILE = "sweep.json"

#: One chunk of work: ``(base, configurations, trace_dir, chunk_dir, curve, threads)``, the
#: arguments of :func:`run_chunk`.
Job = tuple
#: What runs a job (``run_chunk``; tests substitute their own).
Work = Callable[..., list[dict]]


@dataclass
class SweepFile:
    """A parsed sweep file: the base experiment and the configurations of the grid."""

    base: ExperimentConfig
    configs: list[ArmConfig]
    out_dir: Path
    chunk: int


def load_sweep(path: str | Path) -> SweepFile:
    """Read and validate a sweep file (see the module docstring); errors name the key."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: invalid TOML: {err}") from err
    unknown = sorted(set(raw) - {"base", "arms", "grid", "output", "chunk"})
    if unknown or "base" not in raw:
        raise ConfigError(f"{path}: " + (f"unknown keys {unknown}" if unknown else "missing key 'base'")
                          + "; valid keys: base, arms, grid, output, chunk")
    chunk = raw.get("chunk", 8)
    # bool is an int to Python, but `chunk = true` is no size.
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk <= 0:
        raise ConfigError(f"{path}: 'chunk' must be a positive integer (configurations per task), got {chunk!r}")
    base = load_config(path.parent / raw["base"])
    wanted = raw.get("arms")
    arms = [a for a in base.arms if a.baseline is None and (wanted is None or a.name in wanted)]
    missing = sorted(set(wanted or []) - {a.name for a in arms})
    if missing:
        raise ConfigError(f"{path}: arms {missing} are no specframe arm of {raw['base']}; "
                          f"valid: {', '.join(a.name for a in base.arms if a.baseline is None)}")
    grid = raw.get("grid", {})
    configs = [c for a in arms for c in expand_sweep(a, grid, f"{path} [grid]", base.drafter)]
    _check_distinct(configs, f"{path} [grid]")
    out = Path(raw.get("output", {}).get("dir", f"runs/{base.name}-sweep"))
    out = out if out.is_absolute() else path.parent / out
    return SweepFile(base, configs, out, chunk)


def _check_distinct(configs: list[ArmConfig], where: str) -> None:
    """Refuse two configurations of one name (or file name): a grid list that repeats a value.

    Results are keyed by name, so a duplicate would be computed once and counted twice."""
    seen: dict[str, str] = {}
    for config in configs:
        for key in (config.name, config.slug):
            if key in seen:
                raise ConfigError(f"{where}: configuration {config.name!r} is duplicated (clashes with "
                                  f"{seen[key]!r}): a grid list repeats a value; list each value once")
        seen[config.name] = seen[config.slug] = config.name


# ---------------------------------------------------------------------- one chunk
def run_chunk(base: ExperimentConfig, arms: list[ArmConfig], trace_dir: str, out_dir: str,
              curve: str | None, threads: int | None = 1) -> list[dict]:
    """Replay ``arms`` (plus autoregressive) in one experiment; one row per arm.

    When that replay raises, each arm is replayed alone in the same directory (arms that
    finished answers resume them), so one failing configuration costs only its own row: a
    failure row (:func:`failure_row`) for each arm that raises, result rows for the others.

    ``threads``: torch threads of the replay (1 where several processes share the cores; the
    drafter's measured time, part of the projection, depends on it)."""
    try:
        return _replay_rows(base, arms, trace_dir, out_dir, curve, threads)
    except Exception as err:
        if len(arms) == 1:
            return [failure_row(arms[0], one_line(err))]
        warn(f"a chunk of the sweep failed, so its {len(arms)} configurations replay one at a time to "
             f"find which fail ({out_dir}): {one_line(err)}")
    rows = []
    for arm in arms:
        try:
            rows += _replay_rows(base, [arm], trace_dir, out_dir, curve, threads)
        except Exception as err:
            rows.append(failure_row(arm, one_line(err)))
    return rows


def _replay_rows(base: ExperimentConfig, arms: list[ArmConfig], trace_dir: str, out_dir: str,
                 curve: str | None, threads: int | None) -> list[dict]:
    """Replay ``arms`` plus autoregressive into ``out_dir``; one result row per arm."""
    from specframe.experiments.config import ArmConfig as Arm
    from specframe.experiments.report import write_report
    from specframe.replay.runner import replay_experiment

    ar = Arm(name="autoregressive", baseline="autoregressive")
    config = dataclasses.replace(base, arms=[ar, *arms], warmup=0, threads=threads)
    replay_experiment(config, trace_dir, out_dir, curve=curve, progress=False)
    summary = write_report(out_dir, plots=False)
    seconds = summary["replay"].get("replay_seconds", {})
    found = {a["name"]: a for a in summary["arms"]}
    return [{**_row(found[arm.name], arm), "replay_seconds": seconds.get(arm.name)} if arm.name in found
            else failure_row(arm, _not_replayed(arm, summary["replay"].get("not_replayed", [])))
            for arm in arms]


def _not_replayed(arm: ArmConfig, reasons: list[str]) -> str:
    """Why the replay has no answers for ``arm`` (e.g. its drafter does not replay)."""
    why = next((r for r in reasons if r.startswith(f"{arm.name} (")), None)
    return f"not replayed: {why}" if why else "not replayed: the replay wrote no answers for it"


def _identity(arm: ArmConfig) -> dict:
    """The fields every row starts with: which configuration it is (``config``: the hash of its
    whole definition, so a row is reused only for the configuration that produced it)."""
    return {"name": arm.name, "config": chunk_id([arm]), "drafter": arm.drafter.name, "policy": arm.policy.name,
            "options": {**{f"policy.{k}": v for k, v in arm.policy.options.items()},
                        **{f"drafter.{k}": v for k, v in arm.drafter.options.items() if not isinstance(v, str)}}}


def _row(summary_arm: dict, arm: ArmConfig) -> dict:
    keys = ("tau", "delta", "tokens_per_s", "speedup", "answers", "tokens")
    per_cat = {c: {k: m.get(k) for k in keys} for c, m in summary_arm["categories"].items()}
    return {**_identity(arm), "overall": {k: summary_arm["overall"].get(k) for k in keys}, "categories": per_cat,
            "replay": summary_arm.get("replay", True)}


def failure_row(arm: ArmConfig, error: str) -> dict:
    """The row of a configuration that could not be replayed: which one, and the one-line error."""
    return {**_identity(arm), "error": error, "failed": True}


def is_failure(row: dict) -> bool:
    """Whether ``row`` records a failed configuration (no metrics)."""
    return bool(row.get("failed"))


# ---------------------------------------------------------------------- chunks and results
def chunks(configs: list[ArmConfig], size: int) -> list[list[ArmConfig]]:
    """``configs`` in consecutive groups of ``size``."""
    return [configs[i: i + size] for i in range(0, len(configs), size)]


def chunk_id(group: list[ArmConfig]) -> str:
    """A short hash of a chunk's configurations: its directory name, the same on every rerun."""
    text = json.dumps([c.describe() for c in group], sort_keys=True)
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:12]


def read_results(out_dir: Path) -> list[dict]:
    """One row per configuration of ``results.jsonl``: its latest success row if it has one,
    else its latest failure row (in order of first appearance).

    A half-written last line (a killed sweep) is dropped with a warning naming the file."""
    latest: dict[str, dict] = {}
    for row in read_lines(out_dir / RESULTS, what="sweep result"):
        old = latest.get(row["name"])
        if old is None or not is_failure(row) or is_failure(old):
            latest[row["name"]] = row
    return list(latest.values())


def done_names(out_dir: Path, configs: list[ArmConfig] | None = None) -> set[str]:
    """Configurations with a success row in ``results.jsonl`` (failed ones are not done); with
    ``configs``, only rows of those very definitions count."""
    ids = None if configs is None else {c.name: chunk_id([c]) for c in configs}
    return {r["name"] for r in read_results(out_dir) if not is_failure(r)
            and (ids is None or ids.get(r["name"]) == r.get("config"))}


def sweep_fingerprint(sweep: SweepFile, trace_dir: str | Path, curve: str | Path | None) -> dict:
    """What every row of a sweep directory is tied to: the base experiment's fingerprint, the
    trace's identity and the curve's (a replayed run directory's, docs/experiments.md)."""
    from specframe.replay.runner import step_model
    from specframe.replay.trace import Trace

    trace = Trace.load(trace_dir)
    return {"base": sweep.base.fingerprint(), "trace": trace.identity(), "curve": step_model(trace, curve).identity}


def check_sweep_dir(out_dir: Path, sweep: SweepFile, fingerprint: dict, fresh: bool) -> None:
    """Apply the one staleness rule to a sweep directory: ``fresh`` discards what it holds;
    else rows of another base experiment, trace or curve, or of a configuration whose name now
    means another definition, are refused in one line naming it."""
    file = out_dir / SWEEP_FILE
    if fresh:
        for name in (RESULTS, SWEEP_FILE, "best.json"):
            (out_dir / name).unlink(missing_ok=True)
        shutil.rmtree(out_dir / "chunks", ignore_errors=True)
    old = json.loads(file.read_text(encoding="utf-8")) if file.exists() else None
    if old is None and (out_dir / RESULTS).exists():
        old = {}  # rows written before their inputs were recorded: not comparable
    refuse_other_inputs(out_dir, "a sweep", old, fingerprint, "its rows")
    ids = {c.name: chunk_id([c]) for c in sweep.configs}
    changed = sorted({r["name"] for r in read_results(out_dir)
                      if not is_failure(r) and r["name"] in ids and r.get("config") != ids[r["name"]]})
    if changed:
        raise ExperimentError(f"{out_dir}: configurations {', '.join(changed)} now mean other definitions than "
                              "their rows' (the base experiment's arm changed): use another --out, or --fresh")
    out_dir.mkdir(parents=True, exist_ok=True)
    file.write_text(json.dumps(fingerprint, indent=1) + "\n", encoding="utf-8")


def refuse_other_inputs(out_dir: Path, what: str, old: dict | None, new: dict, kept: str) -> None:
    """The one staleness rule for results over a trace: unless ``old`` (the recorded inputs,
    None when there are none) equals ``new``, refuse in one line naming every input that
    differs (``{what}`` over another trace, curve, ...); ``kept`` names what --fresh discards."""
    if old is not None and old != new:
        diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
        raise ExperimentError(f"{out_dir} holds {what} over another {' and another '.join(diff)}: use another "
                              f"--out, or --fresh to discard {kept}")


def sweep_jobs(sweep: SweepFile, trace_dir: str | Path, out_dir: Path, done: set[str],
               curve: str | Path | None, threads: int | None) -> list[Job]:
    """One job per chunk that has configurations not in ``done``, with only those.

    Chunks come from the full list of configurations, so each keeps its directory (and its
    finished answers) however much of the sweep is already done."""
    jobs = []
    for group in chunks(sweep.configs, sweep.chunk):
        todo = [c for c in group if c.name not in done]
        if todo:
            jobs.append((sweep.base, todo, str(trace_dir), str(out_dir / "chunks" / chunk_id(group)),
                         None if curve is None else str(curve), threads))
    return jobs


def run_sweep(sweep: SweepFile, trace_dir: str | Path, out_dir: Path, ray_address: str | None = None,
              workers: int | None = 2, curve: str | Path | None = None,
              on_done: Callable[[list[dict]], None] | None = None, fail_fast: bool = False,
              fresh: bool = False) -> list[dict]:
    """Replay every configuration without a success row in ``results.jsonl``; returns
    :func:`read_results` (failed configurations have failure rows).

    Holds the lock of ``out_dir`` throughout (:class:`~specframe.experiments.runlock.DirectoryInUseError`
    when another live sweep has it). ``on_done`` gets each chunk's new rows once they are on
    disk. ``fail_fast``: after the first failure no further chunk starts. The directory's rows
    must be of the same base experiment, trace and curve (:func:`check_sweep_dir`); ``fresh``
    discards them first."""
    fingerprint = sweep_fingerprint(sweep, trace_dir, curve)
    with RunLock(out_dir):
        check_sweep_dir(out_dir, sweep, fingerprint, fresh)
        done = done_names(out_dir, sweep.configs)
        # One process alone keeps the experiment's threads; several share the cores one thread each.
        threads = sweep.base.threads if not ray_address and int(workers or 1) == 1 else 1
        jobs = sweep_jobs(sweep, trace_dir, out_dir, done, curve, threads)
        runner = (_ray_results(jobs, ray_address, fail_fast, workers=workers) if ray_address
                  else _local_results(jobs, workers or 1, fail_fast))
        # closing(): an exception here (on_done, KeyboardInterrupt) cancels the pending chunks now.
        with contextlib.closing(runner) as results, open_for_append(out_dir / RESULTS) as file:
            for rows in results:
                # One success row per configuration: a name that already has one is not written again.
                rows = [r for r in rows if r["name"] not in done]
                for row in rows:
                    append_line(file, row)
                    if not is_failure(row):
                        done.add(row["name"])
                if on_done is not None:
                    on_done(rows)
        return read_results(out_dir)


# ---------------------------------------------------------------------- runners
def _chunk_failed(job: Job, error: str) -> list[dict]:
    """Failure rows for every configuration of ``job`` (its worker failed outside run_chunk)."""
    return [failure_row(arm, error) for arm in job[1]]


def _stops(rows: list[dict], fail_fast: bool) -> bool:
    return fail_fast and any(is_failure(r) for r in rows)


def _local_results(jobs: list[Job], workers: Any, fail_fast: bool = False,
                   work: Work | None = None) -> Iterator[list[dict]]:
    """Each job's rows, as they finish: in this process (``workers == 1``) or in a pool of
    ``workers`` spawned processes (see :func:`_pool_results`). ``work``: default run_chunk."""
    if not jobs:
        return
    work = work or run_chunk
    if int(workers) == 1:  # in this process: no interpreter to start, same results
        for job in jobs:
            try:
                rows = work(*job)
            except Exception as err:  # run_chunk isolates its arms; this is anything else
                rows = _chunk_failed(job, one_line(err))
            yield rows
            if _stops(rows, fail_fast):
                return
        return
    yield from _pool_results(jobs, int(workers), fail_fast, work)


def _spawn_pool(workers: int) -> ProcessPoolExecutor:
    return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))


def _pool_results(jobs: list[Job], workers: int, fail_fast: bool, work: Work) -> Iterator[list[dict]]:
    """Jobs in one shared process pool; when a worker dies (which breaks the whole pool, and
    names no culprit), the unfinished jobs run again, each in a process of its own, so a
    second death is pinned on the job that caused it (:func:`_own_process_results`)."""
    pool = _spawn_pool(workers)
    unfinished: list[Job] = []
    stopped = False
    try:
        futures = {pool.submit(work, *job): job for job in jobs}
        for future in as_completed(futures):
            rows = _outcome(future, futures[future], unfinished)
            if rows is None:
                continue
            yield rows
            if _stops(rows, fail_fast):
                stopped = True
                _cancel(futures)
    finally:
        # Early exit (fail-fast, KeyboardInterrupt, generator closed): nothing pending starts.
        pool.shutdown(wait=True, cancel_futures=True)
    if unfinished and not stopped:
        warn(f"a sweep worker process died; replaying the {len(unfinished)} unfinished chunk(s) "
             "again, each in a process of its own")
        yield from _own_process_results(unfinished, workers, fail_fast, work)


def _outcome(future: Future, job: Job, unfinished: list[Job]) -> list[dict] | None:
    """A finished future's rows; None when it was cancelled or its pool broke (then the job
    goes to ``unfinished``)."""
    try:
        return future.result()
    except CancelledError:
        return None
    except BrokenProcessPool:
        unfinished.append(job)
        return None
    except Exception as err:
        return _chunk_failed(job, one_line(err))


def _cancel(futures: Iterable[Future]) -> None:
    for future in futures:
        future.cancel()  # no-op for a running or finished future: those rows are kept


def _in_own_process(work: Work, job: Job) -> list[dict]:
    """``work(*job)`` in a fresh one-process pool: if that process dies, this job killed it."""
    with _spawn_pool(1) as pool:
        return pool.submit(work, *job).result()


def _own_process_results(jobs: list[Job], workers: int, fail_fast: bool, work: Work) -> Iterator[list[dict]]:
    """Each job in a process of its own, ``workers`` at a time; a job whose process dies gets
    failure rows for its configurations."""
    threads = ThreadPoolExecutor(max_workers=workers)
    try:
        futures = {threads.submit(_in_own_process, work, job): job for job in jobs}
        for future in as_completed(futures):
            job = futures[future]
            try:
                rows = future.result()
            except CancelledError:
                continue
            except BrokenProcessPool as err:
                rows = _chunk_failed(job, f"its worker process died ({one_line(err)})")
            except Exception as err:
                rows = _chunk_failed(job, one_line(err))
            yield rows
            if _stops(rows, fail_fast):
                _cancel(futures)
    finally:
        threads.shutdown(wait=True, cancel_futures=True)


def _ray_results(jobs: list[Job], address: str, fail_fast: bool = False,
                 work: Work | None = None, workers: int | None = None) -> Iterator[list[dict]]:
    """Each job as a Ray task, at most ``workers`` at a time (the Ray layer's rule:
    :mod:`specframe.experiments.cluster.rayrun`); a task that fails (its worker died, or it
    raised outside run_chunk's isolation) gives failure rows for its configurations, each with
    the task's one-line error. ``work``: default run_chunk."""
    if not jobs:
        return
    ray = rayrun.connect(address)
    task = ray.remote(num_cpus=1)(work or run_chunk)
    count = rayrun.worker_count(workers)
    for job, rows, error in rayrun.bounded(lambda job: task.remote(*job), jobs, count, resume=RESUME):
        if error is not None:
            rows = _chunk_failed(job, error)
        yield rows
        if _stops(rows, fail_fast):
            return
