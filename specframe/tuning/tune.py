"""One ``specframe tune``: pick the arms, tie the directory to its inputs, run each arm's study,
score default and best on both halves of the questions, write the outputs."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Callable

from specframe.errors import ExperimentError, warn
from specframe.experiments.config import ArmConfig, ConfigError, ExperimentConfig, load_config
from specframe.experiments.runlock import RunLock
from specframe.plugins import get_registry
from specframe.replay.runner import unreplayable_verifier
from specframe.tuning.evaluate import Evaluator
from specframe.tuning.outputs import BEST, CONFIRM_DATA, TUNE_JSON, best_toml, tune_json, write_confirm_data
from specframe.tuning.report import REPORT, markdown
from specframe.tuning.space import arm_space, default_point
from specframe.tuning.study import (
    JOURNAL, ArmResult, TuneSettings, arm_result, check_tune_dir, finished, journal_storage, open_study, optimize,
    optuna_module, parallel, recorded_split, recover, tune_fingerprint,
)

#: ``on_event(kind, arm, value)``: ``start`` (value: (finished, total)), ``trial`` (finished so
#: far), ``done`` (the ArmResult), ``note`` (a line to show).
Events = Callable[[str, str, Any], None]


def select_arms(config: ExperimentConfig, wanted: list[str] | None) -> list[ArmConfig]:
    """The speculative arms to tune: those named (each must be a specframe arm of the
    experiment whose verifier replays), else every one whose verifier replays."""
    arms = [a for a in config.arms if a.baseline is None]
    if wanted is not None:
        missing = [n for n in wanted if n not in {a.name for a in arms}]
        if missing:
            raise ConfigError(f"--arms {', '.join(missing)}: no specframe arm of the experiment; valid: "
                              f"{', '.join(a.name for a in arms)}")
        arms = [a for a in arms if a.name in wanted]
    keep = []
    for arm in arms:
        why = unreplayable_verifier(get_registry().get("verifiers", arm.verifier.name))
        if why is None:
            keep.append(arm)
        elif wanted is not None:
            raise ExperimentError(f"arm {arm.name!r}: verifier {arm.verifier.name!r} {why}; tune replays greedy "
                                  "verification only: tune another arm")
        else:
            warn(f"not tuned: arm {arm.name!r} (verifier {arm.verifier.name!r} {why})")
    if not keep:
        raise ExperimentError("no arm of the experiment can be tuned (see above)")
    return keep


def has_default(study: Any) -> bool:
    """Whether the arm's own options have a trial done or waiting (a failed one is tried again
    once per run: the default is always measured)."""
    from optuna.trial import TrialState

    return any(t.user_attrs.get("default") and t.state != TrialState.FAIL for t in study.get_trials(deepcopy=False))


def run_tune(config_path: Path, trace_dir: Path, out_dir: Path, settings: TuneSettings,
             wanted: list[str] | None = None, curve: Path | None = None, fresh: bool = False,
             on_event: Events | None = None) -> list[ArmResult]:
    """Tune every selected arm (the package docstring); returns each arm's result after writing
    best.toml, confirm.jsonl, tune.json and report.md into ``out_dir``."""
    optuna_module()
    event = on_event or (lambda kind, arm, value: None)
    config = load_config(config_path)
    arms = select_arms(config, wanted)
    with RunLock(out_dir):
        settings = recorded_split(out_dir, settings, fresh)
        fingerprint = tune_fingerprint(config, arms, trace_dir, curve, settings)
        check_tune_dir(out_dir, fingerprint, fresh)
        single = settings.workers == 1 and settings.ray is None
        evaluator = Evaluator(config, arms, trace_dir, curve, settings.split, out_dir / "replay" / "main",
                              split_by=settings.split_by,
                              threads=config.threads if single else 1)
        for name, why in evaluator.refused.items():
            if wanted is not None:
                raise ExperimentError(f"arm {name!r} cannot be tuned: not replayed: {why}")
            event("note", name, f"not tuned: {why}")
        arms = [a for a in arms if a.name not in evaluator.refused]
        storage = journal_storage(out_dir / JOURNAL)
        results = []
        for arm in arms:
            space = arm_space(arm, settings.space)
            if not space:
                event("note", arm.name, f"not tuned: its plugins declare no tunable option in --space {settings.space}")
                continue
            if evaluator.exactness.get(arm.name) != "exact":
                event("note", arm.name, f"replays {evaluator.exactness.get(arm.name)}ly (drafter {arm.drafter.name!r}): "
                                        "its projected figures are approximate; --confirm measures it live")
            study = open_study(storage, arm, settings)
            dead = recover(study)
            if dead:
                event("note", arm.name, f"{dead} trial(s) killed mid-run are run again")
            if not has_default(study):
                study.enqueue_trial(default_point(arm, space), user_attrs={"default": True})
            event("start", arm.name, (finished(study), settings.trials))
            if single:
                optimize(study, evaluator, arm, space, settings, lambda: event("trial", arm.name, finished(study)))
            else:
                parallel(config, arm, trace_dir, curve, settings, out_dir, study,
                         lambda n: event("trial", arm.name, n))
            result = arm_result(study, evaluator, arm, settings)
            results.append(result)
            event("done", arm.name, result)
        if not results:
            raise ExperimentError("no arm was tuned (see the notes above)")
        write_outputs(config_path, config, out_dir, settings, fingerprint, results, evaluator)
    return results


def write_outputs(config_path: Path, config: ExperimentConfig, out_dir: Path, settings: TuneSettings,
                  fingerprint: dict, results: list[ArmResult], evaluator: Evaluator) -> None:
    """confirm.jsonl, best.toml, tune.json and report.md."""
    write_confirm_data(evaluator.confirmation, out_dir / CONFIRM_DATA)
    (out_dir / BEST).write_text(best_toml(config_path, config, [(r.arm, r.tuned) for r in results], out_dir),
                                encoding="utf-8")
    plain = dataclasses.asdict(settings)
    questions = {"searched": len(evaluator.searched), "confirmation": len(evaluator.confirmation)}
    data = tune_json(plain, fingerprint, results, **questions)
    (out_dir / TUNE_JSON).write_text(json.dumps(data, indent=1, default=str) + "\n", encoding="utf-8")
    (out_dir / REPORT).write_text(markdown(results, plain, questions, out_dir, settings.seed), encoding="utf-8")
