"""The Optuna studies of a tune: one per arm, in one journal file of the output directory.

Crash safety: every trial is written to ``study.journal`` (Optuna's JournalStorage) as it
starts and ends, so a killed tune (even ``kill -9``) keeps its finished trials. The tune holds
the directory's lock (:class:`~specframe.experiments.runlock.RunLock`) throughout, so a trial
still marked running when the next tune starts died with its process: it is marked failed and
its parameters are enqueued again, and the tune runs only the trials still missing.

Never stale: ``tune-inputs.json`` records what the trials are tied to (the base experiment's
fingerprint, the trace's and the curve's identity: :func:`~specframe.replay.sweep.sweep_fingerprint`;
the data's content; the search's objective, split and space; each arm's definition and
declared space). Another input is refused in one line naming it (the sweep's rule,
:func:`~specframe.replay.sweep.refuse_other_inputs`); ``fresh`` starts over.
"""

from __future__ import annotations

import json
import multiprocessing
import shutil
import warnings
from concurrent.futures import ProcessPoolExecutor, wait
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from specframe.errors import ExperimentError, one_line
from specframe.experiments.config import ArmConfig, ExperimentConfig
from specframe.replay.record import experiment_settings
from specframe.experiments.cluster import rayrun
from specframe.replay.sweep import SweepFile, refuse_other_inputs, sweep_fingerprint
from specframe.search_space import Dimension, drawing_order
from specframe.tuning.evaluate import OBJECTIVES, Evaluator, Score
from specframe.tuning.space import arm_space, arm_values, default_point, tuned_arm

JOURNAL = "study.journal"
INPUTS = "tune-inputs.json"
TUNE_MISSING = "specframe tune needs Optuna: pip install 'specframe[tune]'"


@dataclass
class TuneSettings:
    """What one ``specframe tune`` does (see the command's options)."""

    trials: int = 50
    objective: str = "speedup"
    split: float = 0.5
    space: str = "all"
    seed: int = 0
    workers: int = 1
    ray: str | None = None
    #: :data:`~specframe.tuning.evaluate.SPLITS`; a directory's recorded studies keep theirs
    #: (:func:`recorded_split`).
    split_by: str = "category"

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ExperimentError(f"--objective {self.objective!r} is not one of {', '.join(OBJECTIVES)}")
        if self.trials < 1 or self.workers < 1:
            raise ExperimentError(f"--trials and --workers must be >= 1, got {self.trials} and {self.workers}")

    def search(self) -> dict:
        """What the trials' values mean: a change makes them incomparable."""
        search = {"objective": self.objective, "split": self.split, "space": self.space}
        # A prefix split is what every study recorded before the stratified one searched: its
        # inputs name no rule, and stay comparable.
        return search if self.split_by == "prefix" else {**search, "split_by": self.split_by}


@dataclass
class ArmResult:
    """One arm's outcome: the default's and the best's scores on the searched and the
    confirmation questions, the best options, the trial counts and the time taken."""

    arm: ArmConfig
    tuned: ArmConfig
    best_options: dict
    default: dict
    best: dict
    trials: dict
    seconds: float
    replay: str
    study: Any = field(repr=False, default=None)


def optuna_module() -> Any:
    """Optuna, quietened (one INFO line per trial otherwise), or an ImportError saying how to install it."""
    try:
        import optuna
    except ImportError as err:
        raise ImportError(TUNE_MISSING) from err
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    return optuna


def journal_storage(path: Path) -> Any:
    """Optuna's JournalStorage over the file ``path`` (appended to, safe across processes)."""
    optuna = optuna_module()
    try:
        from optuna.storages.journal import JournalFileBackend as Backend
    except ImportError:  # Optuna < 4
        from optuna.storages import JournalFileStorage as Backend
    return optuna.storages.JournalStorage(Backend(str(path)))


# ---------------------------------------------------------------------- inputs
def tune_fingerprint(config: ExperimentConfig, arms: list[ArmConfig], trace_dir: str | Path,
                     curve: str | Path | None, settings: TuneSettings) -> dict:
    """What the studies of a directory are tied to (the module docstring); ``arms`` maps each
    arm to its definition and declared space, checked per arm (:func:`check_tune_dir`)."""
    base = sweep_fingerprint(SweepFile(config, arms, Path("."), 1), trace_dir, curve)
    return {**base, "data": experiment_settings(config)["data"], "search": settings.search(),
            "arms": {a.name: {"definition": a.describe(),
                              "space": {k: d.describe() for k, d in arm_space(a, settings.space).items()}}
                     for a in arms}}


def recorded_split(out_dir: Path, settings: TuneSettings, fresh: bool) -> TuneSettings:
    """``settings`` with the split rule of the studies ``out_dir`` already holds: a directory
    recorded before the stratified split searched the first share of the questions, and
    resuming it must score new trials on the questions the old ones were scored on."""
    recorded = None if fresh else recorded_inputs(out_dir)
    if recorded is None:
        return settings
    return replace(settings, split_by=recorded.get("search", {}).get("split_by", "prefix"))


def recorded_inputs(out_dir: Path) -> dict | None:
    """The inputs ``out_dir``'s studies were recorded with (``tune-inputs.json``), or None."""
    file = out_dir / INPUTS
    return json.loads(file.read_text(encoding="utf-8")) if file.exists() else None


def check_tune_dir(out_dir: Path, fingerprint: dict, fresh: bool) -> None:
    """Apply the one rule to a tune directory: ``fresh`` discards its studies; else another
    base, trace, curve, data or search is refused naming it, and so is an arm whose definition
    or declared space changed (new arms join). Records the inputs."""
    if fresh:
        for name in (JOURNAL, INPUTS, "tune.json", "best.toml", "confirm.jsonl", "report.md"):
            (out_dir / name).unlink(missing_ok=True)
        for name in ("plots", "replay", "confirm"):
            shutil.rmtree(out_dir / name, ignore_errors=True)
    old = recorded_inputs(out_dir)
    if old is None and (out_dir / JOURNAL).exists():
        old = {}  # trials whose inputs were never recorded: not comparable
    if old is not None:
        strip = lambda fp: {k: v for k, v in fp.items() if k != "arms"}  # noqa: E731
        refuse_other_inputs(out_dir, "a tune", strip(old), strip(fingerprint), "its studies")
        changed = sorted(n for n, d in fingerprint["arms"].items() if n in old.get("arms", {}) and old["arms"][n] != d)
        if changed:
            raise ExperimentError(f"{out_dir} holds a tune of another definition or search space of arm(s) "
                                  f"{', '.join(changed)}: use another --out, or --fresh to discard its studies")
        fingerprint = {**fingerprint, "arms": {**old.get("arms", {}), **fingerprint["arms"]}}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / INPUTS).write_text(json.dumps(fingerprint, indent=1) + "\n", encoding="utf-8")


# ---------------------------------------------------------------------- one study
def open_study(storage: Any, arm: ArmConfig, settings: TuneSettings, worker: int = 0) -> Any:
    """The arm's study (created or loaded): TPE (multivariate, conditional groups; seeded per
    worker) and a median pruner over partial scores after the first trials."""
    optuna = optuna_module()
    sampler = optuna.samplers.TPESampler(seed=settings.seed + worker, multivariate=True, group=True,
                                         constant_liar=settings.workers > 1 or settings.ray is not None,
                                         n_startup_trials=min(10, max(2, settings.trials // 4)))
    pruner = optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=0)
    return optuna.create_study(storage=storage, study_name=arm.name, direction="maximize", sampler=sampler,
                               pruner=pruner, load_if_exists=True)


def finished(study: Any) -> int:
    """Trials that count toward ``--trials``: completed or pruned (a failed one does not)."""
    from optuna.trial import TrialState

    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))


def recover(study: Any) -> int:
    """Mark the trials a killed tune left running as failed (Optuna's public
    ``study.tell(number, state=FAIL)``) and enqueue their parameters again (the caller holds the
    directory's lock, so none of them is alive); returns how many."""
    from optuna.trial import TrialState

    dead = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    for trial in dead:
        study.tell(trial.number, state=TrialState.FAIL)
        # Every parameter is suggested before the replay starts, so a dead trial's are complete.
        study.enqueue_trial(dict(trial.params), user_attrs={**trial.user_attrs, "retry_of": trial.number})
    return len(dead)


def suggest(trial: Any, key: str, dim: Dimension) -> Any:
    """Optuna's suggestion for one declared dimension."""
    if dim.kind == "choice":
        return trial.suggest_categorical(key, list(dim.choices))
    if dim.kind == "int":
        return trial.suggest_int(key, int(dim.low), int(dim.high), step=dim.step, log=dim.log)
    return trial.suggest_float(key, float(dim.low), float(dim.high), log=dim.log)


def objective(evaluator: Evaluator, arm: ArmConfig, space: dict[str, Dimension], settings: TuneSettings) -> Callable:
    """The trial function: draw a point (the default trial: the arm's own values), replay the
    arm it makes over the searched questions, report partial scores to the pruner."""
    import optuna

    values = arm_values(arm)
    fixed = default_point(arm, space)

    def run(trial: Any) -> float:
        default = bool(trial.user_attrs.get("default"))
        point: dict[str, Any] = {}
        for key, dim in drawing_order(space):
            if dim.active({**values, **point}) and (not default or key in fixed):
                point[key] = suggest(trial, key, dim)
        candidate = arm if default else tuned_arm(arm, point, name=arm.name)

        def report(done: int, score: Score) -> None:
            trial.report(score.value(settings.objective), step=done)
            if not default and trial.should_prune():
                raise optuna.TrialPruned()

        try:
            score = evaluator.evaluate(candidate, evaluator.searched, report)
        except optuna.TrialPruned:
            raise
        except Exception as err:  # kept with the failed trial: the tune's error names it
            trial.set_user_attr("error", one_line(err))
            raise
        trial.set_user_attr("tau", score.tau)
        trial.set_user_attr("speedup", score.speedup)
        return score.value(settings.objective)

    return run


def optimize(study: Any, evaluator: Evaluator, arm: ArmConfig, space: dict[str, Dimension],
             settings: TuneSettings, on_trial: Callable[[], None] | None = None) -> None:
    """Run trials in this process until the study has ``settings.trials`` finished ones (failed
    trials are recorded and do not count; at most as many again may fail)."""
    optuna = optuna_module()
    from optuna.trial import TrialState

    remaining = settings.trials - finished(study)
    if remaining <= 0:
        return
    callbacks = [optuna.study.MaxTrialsCallback(settings.trials, states=(TrialState.COMPLETE, TrialState.PRUNED))]
    if on_trial is not None:
        callbacks.append(lambda study, trial: on_trial())
    study.optimize(objective(evaluator, arm, space, settings), n_trials=2 * remaining, catch=(Exception,),
                   callbacks=callbacks, gc_after_trial=False)


def work(config: ExperimentConfig, arm: ArmConfig, trace_dir: str, curve: str | None, settings: TuneSettings,
         out_dir: str, worker: int) -> int:
    """One worker process or Ray task: load the target, join the arm's study and run trials
    until it has enough; returns the study's finished trials."""
    out = Path(out_dir)
    evaluator = Evaluator(config, [arm], trace_dir, curve, settings.split, out / "replay" / f"worker{worker}", threads=1,
                          split_by=settings.split_by)
    study = open_study(journal_storage(out / JOURNAL), arm, settings, worker)
    optimize(study, evaluator, arm, arm_space(arm, settings.space), settings)
    return finished(study)


def parallel(config: ExperimentConfig, arm: ArmConfig, trace_dir: str | Path, curve: str | Path | None,
             settings: TuneSettings, out_dir: Path, study: Any, on_progress: Callable[[int], None]) -> None:
    """``settings.workers`` spawned processes (or as many Ray tasks, ``settings.ray``: the Ray
    layer's rule) on one study; ``on_progress(finished)`` while they run. A worker's error
    stops the tune, in one line naming the arm."""
    args = (config, arm, str(trace_dir), None if curve is None else str(curve), settings, str(out_dir))
    count = settings.workers
    if settings.ray is not None:
        ray = rayrun.connect(settings.ray)
        task = ray.remote(num_cpus=1)(work)
        refs = {task.remote(*args, i): i for i in range(count)}
        resume = f"The trials finished so far are kept in {out_dir / JOURNAL}: run the same command again to go on."
        for _, _, error in rayrun.as_completed(refs, timeout=1.0, on_wait=lambda: on_progress(finished(study)),
                                               resume=resume):
            on_progress(finished(study))
            if error is not None:  # every result is fetched: a task's error is the tune's, naming the arm
                raise rayrun.TaskFailed(f"arm {arm.name!r}, tune worker", error)
        return
    with ProcessPoolExecutor(max_workers=count, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(work, *args, i) for i in range(count)]
        while True:
            done, pending = wait(futures, timeout=1.0)
            on_progress(finished(study))
            if not pending:
                break
        for future in done:
            future.result()  # a worker's error is the tune's


# ---------------------------------------------------------------------- results
def last_failure(trials: list) -> str:
    """``"; the last failed with: <one line>"`` (the error a failed trial kept), or ""."""
    from optuna.trial import TrialState

    reasons = [t.user_attrs.get("error") for t in trials if t.state == TrialState.FAIL]
    reasons = [r for r in reasons if r]
    return f"; the last failed with: {reasons[-1]}" if reasons else ""


def arm_result(study: Any, evaluator: Evaluator, arm: ArmConfig, settings: TuneSettings) -> ArmResult:
    """The arm's default and best, each scored on the searched questions (their trials) and
    replayed on the confirmation questions."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    if not complete:
        raise ExperimentError(f"arm {arm.name!r}: no trial completed{last_failure(trials)} "
                              f"(every failed trial's error is in {JOURNAL})")
    default = next((t for t in complete if t.user_attrs.get("default")), None)
    best = study.best_trial
    tuned = tuned_arm(arm, dict(best.params), name=f"{arm.name}-tuned") if not best.user_attrs.get("default") \
        else tuned_arm(arm, {}, name=f"{arm.name}-tuned")
    searched = lambda t: {"tau": t.user_attrs.get("tau"), "speedup": t.user_attrs.get("speedup")}  # noqa: E731
    conf_default = evaluator.evaluate(arm, evaluator.confirmation)
    conf_best = evaluator.evaluate(tuned, evaluator.confirmation)
    counts = {state.name.lower(): sum(t.state == state for t in trials)
              for state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)}
    seconds = sum((t.datetime_complete - t.datetime_start).total_seconds() for t in trials
                  if t.datetime_complete is not None and t.datetime_start is not None)
    return ArmResult(arm, tuned, {k: v for k, v in best.params.items()} if not best.user_attrs.get("default") else {},
                     {"searched": searched(default) if default else None, "confirmation": conf_default.to_dict()},
                     {"searched": searched(best), "confirmation": conf_best.to_dict(), "trial": best.number},
                     counts, seconds, evaluator.exactness.get(arm.name, "exact"), study)

