"""What a tune writes besides its studies: the confirmation questions, ``best.toml`` and ``tune.json``.

``best.toml`` is the experiment file it was given, rewritten to run live on the confirmation
questions only (``confirm.jsonl`` beside it) with, for each tuned arm, the arm as given and an
arm ``<name>-tuned`` with the best options, side by side, plus the autoregressive arm
(speedups are against it); ``specframe run best.toml`` runs it (``tune --confirm`` does).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from specframe.experiments.config import ArmConfig, ExperimentConfig, tomllib
from specframe.experiments.data import Question

BEST = "best.toml"
CONFIRM_DATA = "confirm.jsonl"
TUNE_JSON = "tune.json"
#: Arm-table keys that name a plugin or a baseline, never a file.
_NAMES = ("name", "baseline", "policy", "drafter", "verifier", "engine")


def write_confirm_data(questions: list[Question], path: Path) -> Path:
    """The confirmation questions as a data file (file order kept: a drafter that keeps state
    across requests sees them as in the trace)."""
    lines = []
    for q in questions:
        row: dict[str, Any] = {"question_id": q.question_id, "category": q.category, "turns": list(q.turns)}
        if q.answer is not None:
            row["answer"] = q.answer
        lines.append(json.dumps(row))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def arm_table(arm: ArmConfig) -> dict:
    """An ``[[arm]]`` table that loads back as ``arm``."""
    if arm.baseline is not None:
        return {"name": arm.name, "baseline": arm.baseline,
                **({"baseline_options": dict(arm.baseline_options)} if arm.baseline_options else {})}
    table: dict[str, Any] = {"name": arm.name}
    for scope in ("drafter", "policy", "verifier"):
        ref = getattr(arm, scope)
        if ref is not None:
            table[scope] = ref.name
            if ref.options:
                table[f"{scope}_options"] = dict(ref.options)
    return table


def best_toml(config_path: Path, config: ExperimentConfig, pairs: list[tuple[ArmConfig, ArmConfig]],
              out_dir: Path) -> str:
    """The text of best.toml (see the module docstring): ``pairs`` of (arm as given, tuned arm)."""
    raw = tomllib.loads(config_path.read_text(encoding="utf-8"))
    raw = _absolute(raw, config_path.parent.resolve())
    raw["name"] = f"{raw.get('name', config.name)}-tuned"
    raw["data"] = {**{k: v for k, v in raw["data"].items() if k not in ("category", "limit")},
                   "path": str((out_dir / CONFIRM_DATA).resolve())}
    raw["output"] = {**raw.get("output", {}), "dir": str((out_dir / "confirm").resolve())}
    raw.pop("drafter", None)  # every arm names its drafter
    ar = next((a for a in config.arms if a.baseline == "autoregressive"),
              ArmConfig(name="autoregressive", baseline="autoregressive"))
    raw["arm"] = [arm_table(ar)] + [arm_table(a) for pair in pairs for a in pair]
    header = ("# Written by `specframe tune`: the tuned arms beside the arms as given, on the confirmation\n"
              f"# questions ({CONFIRM_DATA}), which the search never scored. Run it live: specframe run {BEST}\n")
    return header + to_toml(raw)


def _absolute(value: Any, base: Path, key: str = "") -> Any:
    """Relative paths made absolute against the experiment file's folder (best.toml lives
    elsewhere): a string that names an existing file or folder there, outside name keys."""
    if isinstance(value, dict):
        return {k: _absolute(v, base, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_absolute(v, base, key) for v in value]
    if isinstance(value, str) and key not in _NAMES and value and not Path(value).is_absolute() \
            and ("/" in value or "." in value) and (base / value).exists():
        return str((base / value).resolve())
    return value


# ---------------------------------------------------------------------- TOML
def to_toml(data: dict) -> str:
    """TOML for plain data (str, int, float, bool, lists, tables; a list of tables is an array
    of tables): what an experiment file holds."""
    lines: list[str] = []
    _table_lines(data, [], lines)
    return "\n".join(lines).strip() + "\n"


def _table_lines(data: dict, path: list[str], lines: list[str]) -> None:
    scalars = {k: v for k, v in data.items() if not isinstance(v, dict) and not _tables(v)}
    if path and (scalars or not data):
        lines += ["", f"[{'.'.join(map(_key, path))}]"]
    lines += [f"{_key(k)} = {_value(v)}" for k, v in scalars.items()]
    for k, v in data.items():
        if isinstance(v, dict):
            _table_lines(v, [*path, k], lines)
    for k, v in data.items():
        if _tables(v):
            for item in v:
                lines += ["", f"[[{'.'.join(map(_key, [*path, k]))}]]"]
                lines += [f"{_key(ik)} = {_value(iv)}" for ik, iv in item.items()]


def _tables(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def _key(key: str) -> str:
    return key if key.replace("_", "").replace("-", "").isalnum() else json.dumps(key)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else ("inf" if value > 0 else "-inf" if value < 0 else "nan")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, (str, Path)):
        return json.dumps(str(value))
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {type(value).__name__} {value!r} to TOML")


# ---------------------------------------------------------------------- tune.json
def tune_json(settings: dict, fingerprint: dict, results: list[Any], searched: int, confirmation: int) -> dict:
    """tune.json: the search's settings and inputs, and per arm the default's and the best's
    objective on the searched and the confirmation questions, the best options, the trial
    counts and the seconds the trials took."""
    return {"settings": settings, "inputs": {k: v for k, v in fingerprint.items() if k != "arms"},
            "questions": {"searched": searched, "confirmation": confirmation},
            "arms": {r.arm.name: {"tuned": r.tuned.name, "replay": r.replay, "default": r.default, "best": r.best,
                                  "best_options": r.best_options, "trials": r.trials,
                                  "seconds": round(r.seconds, 3)} for r in results}}
