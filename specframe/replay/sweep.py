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
Each finished chunk appends its rows to ``results.jsonl`` at once, so an interrupted sweep
loses nothing finished and a rerun skips what is there.
"""

from __future__ import annotations

import dataclasses
import json
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from ..config import ArmConfig, ConfigError, ExperimentConfig, _expand_sweep, load_config, tomllib

RESULTS = "results.jsonl"


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
    base = load_config(path.parent / raw["base"])
    wanted = raw.get("arms")
    arms = [a for a in base.arms if a.baseline is None and (wanted is None or a.name in wanted)]
    missing = sorted(set(wanted or []) - {a.name for a in arms})
    if missing:
        raise ConfigError(f"{path}: arms {missing} are no specframe arm of {raw['base']}; "
                          f"valid: {', '.join(a.name for a in base.arms if a.baseline is None)}")
    grid = raw.get("grid", {})
    configs = [c for a in arms for c in _expand_sweep(a, grid, f"{path} [grid]", base.drafter)]
    out = Path(raw.get("output", {}).get("dir", f"runs/{base.name}-sweep"))
    out = out if out.is_absolute() else path.parent / out
    return SweepFile(base, configs, out, int(raw.get("chunk", 8)))


def run_chunk(base: ExperimentConfig, arms: list[ArmConfig], trace_dir: str, out_dir: str,
              curve: str | None, threads: int | None = 1) -> list[dict]:
    """Replay ``arms`` (plus autoregressive) in one experiment; one result row per arm.

    ``threads``: torch threads of the replay (1 where several processes share the cores; the
    drafter's measured time, part of the projection, depends on it)."""
    from ..config import ArmConfig as Arm
    from ..report import write_report
    from .runner import replay_experiment

    ar = Arm(name="autoregressive", baseline="autoregressive")
    config = dataclasses.replace(base, arms=[ar, *arms], warmup=0, threads=threads)
    replay_experiment(config, trace_dir, out_dir, curve=curve, progress=False)
    summary = write_report(out_dir, plots=False)
    seconds = summary["replay"].get("replay_seconds", {})
    return [{**_row(a, arm), "replay_seconds": seconds.get(arm.name)}
            for a in summary["arms"] for arm in arms if a["name"] == arm.name]


def _row(summary_arm: dict, arm: ArmConfig) -> dict:
    keys = ("tau", "delta", "tokens_per_s", "speedup", "answers", "tokens")
    per_cat = {c: {k: m.get(k) for k in keys} for c, m in summary_arm["categories"].items()}
    return {"name": arm.name, "drafter": arm.drafter.name, "policy": arm.policy.name,
            "options": {**{f"policy.{k}": v for k, v in arm.policy.options.items()},
                        **{f"drafter.{k}": v for k, v in arm.drafter.options.items() if not isinstance(v, str)}},
            "overall": {k: summary_arm["overall"].get(k) for k in keys}, "categories": per_cat,
            "replay": summary_arm.get("replay", True)}


def chunks(configs: list[ArmConfig], size: int) -> list[list[ArmConfig]]:
    """``configs`` in consecutive groups of ``size``."""
    return [configs[i: i + size] for i in range(0, len(configs), size)]


def done_names(out_dir: Path) -> set[str]:
    """Configurations already in ``results.jsonl``."""
    file = out_dir / RESULTS
    if not file.exists():
        return set()
    return {json.loads(line)["name"] for line in file.read_text(encoding="utf-8").splitlines() if line.strip()}


def run_sweep(sweep: SweepFile, trace_dir: str | Path, out_dir: Path, ray_address: str | None = None,
              workers: int = 2, curve: str | Path | None = None,
              on_done: Callable[[list[dict]], None] | None = None) -> list[dict]:
    """Replay every configuration not yet in ``results.jsonl``; returns every row."""
    out_dir.mkdir(parents=True, exist_ok=True)
    done = done_names(out_dir)
    todo = [c for c in sweep.configs if c.name not in done]
    # One process alone keeps the experiment's threads; several share the cores one thread each.
    threads = sweep.base.threads if not ray_address and int(workers) == 1 else 1
    jobs = [(sweep.base, group, str(trace_dir), str(out_dir / "chunks" / f"{i:04d}"),
             None if curve is None else str(curve), threads)
            for i, group in enumerate(chunks(todo, sweep.chunk))]
    runner = _ray_results if ray_address else _local_results
    with (out_dir / RESULTS).open("a", encoding="utf-8") as results:
        for rows in runner(jobs, ray_address if ray_address else workers):
            for r in rows:
                results.write(json.dumps(r) + "\n")
            results.flush()
            if on_done is not None:
                on_done(rows)
    return read_results(out_dir)


def read_results(out_dir: Path) -> list[dict]:
    """Every row of ``results.jsonl``, in file order."""
    file = out_dir / RESULTS
    return [json.loads(x) for x in file.read_text(encoding="utf-8").splitlines() if x.strip()] if file.exists() else []


def _local_results(jobs: list[tuple], workers: Any) -> Iterator[list[dict]]:
    import multiprocessing

    if not jobs:
        return
    if int(workers) == 1:  # in this process: no interpreter to start, same results
        for job in jobs:
            yield run_chunk(*job)
        return
    with ProcessPoolExecutor(max_workers=int(workers), mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(run_chunk, *job) for job in jobs]
        for future in as_completed(futures):
            yield future.result()


RAY_MISSING = "--ray needs Ray: pip install 'specframe[ray]'"


def _ray_results(jobs: list[tuple], address: str) -> Iterator[list[dict]]:
    try:
        import ray
    except ImportError as err:
        raise ImportError(RAY_MISSING) from err
    if not ray.is_initialized():
        ray.init(address=None if address == "local" else address, ignore_reinit_error=True, log_to_driver=False)
    task = ray.remote(num_cpus=1)(run_chunk)
    pending = [task.remote(*job) for job in jobs]
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        yield ray.get(ready[0])
