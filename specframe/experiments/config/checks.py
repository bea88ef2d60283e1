"""Checks of a whole experiment file: the data file and its dataset, batching against the arms,
draft models against the target's tokenizer, and unique arm names."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from specframe.experiments.config.schema import ArmConfig, ConfigError, DataConfig, ModelSpec, _table


def _parse_data(raw: Any, base: Path) -> DataConfig:
    if isinstance(raw, Mapping) and isinstance(raw.get("category"), str):
        raw = {**raw, "category": [raw["category"]]}
    data = _table(DataConfig, raw, "[data]")
    data.path = _resolve(base, data.path)
    _check_dataset(data)
    return data


def _check_dataset(data: DataConfig) -> None:
    from specframe.experiments.data import DataError, load_questions

    if not data.path.is_file():
        raise ConfigError(f"[data]: data file {str(data.path)!r} does not exist")
    try:
        questions = load_questions(data.path, data.category, data.limit)
    except DataError as err:
        raise ConfigError(f"[data]: {err}") from err
    if not questions:
        what = f" in categories {data.category}" if data.category else ""
        raise ConfigError(f"[data]: dataset {str(data.path)!r} is empty: no questions{what}")


def _resolve(base: Path, path: Path) -> Path:
    path = path.expanduser()
    return path if path.is_absolute() else (base / path)


def _batch_allocator(name: str, batch_size: int, arms: list[ArmConfig]) -> str:
    """``batch_allocator`` checked against the registered allocators, and batched arms against
    what batching supports (specframe arms and the ``autoregressive`` baseline)."""
    if batch_size > 1:
        from specframe.decode.allocate import allocator_classes

        names = sorted(allocator_classes())
        if name not in names:
            raise ConfigError(f"batch_allocator {name!r} is not one of {', '.join(names)}")
        odd = [a.name for a in arms if a.baseline not in (None, "autoregressive")]
        if odd:
            raise ConfigError(f"batch_size = {batch_size}: arms {odd} are baselines that do not batch; "
                              "batched runs take specframe arms and the 'autoregressive' baseline")
    return name


def _draft_models(arm: ArmConfig) -> list[str]:
    """Model references an arm drafts with (``model`` drafter option, hf-assisted assistant)."""
    refs = []
    if arm.drafter is not None and arm.drafter.name == "model":
        refs.append(arm.drafter.options.get("model"))
    if arm.baseline == "hf-assisted":
        refs.append(arm.baseline_options.get("assistant"))
    return [r for r in refs if isinstance(r, str) and r != "target"]


def _check_pairs(target: ModelSpec, models: dict[str, ModelSpec], arms: list[ArmConfig]) -> None:
    """Every draft model shares the target's tokenizer (read from disk; nothing loads).

    The same check the ``model`` drafter makes when given paths, so a TOML alias cannot slip a
    same-sized but different vocabulary past it. Random, perturbed and hub models are skipped.
    """
    from specframe.models.pairs import check_same_tokenizer

    if target.is_random:
        return
    checked: set[str] = set()
    for arm in arms:
        for ref in _draft_models(arm):
            spec = models.get(ref)
            path = spec.model if spec is not None else ref
            if path in checked or (spec is not None and (spec.is_random or spec.perturbed_of is not None)):
                continue
            checked.add(path)
            where = f"[models.{ref}]" if spec is not None else f"[[arm]] {arm.name!r}"
            try:
                check_same_tokenizer(target.tokenizer or target.model, path)
            except FileNotFoundError:
                continue  # a missing path is reported where the model loads, with its table
            except ValueError as err:
                raise ConfigError(f"{where}: {err}") from err


def _check_unique(arms: list[ArmConfig]) -> None:
    """Names, and answers file names ignoring case (case-insensitive file systems), are unique."""
    seen: dict[str, str] = {}
    for arm in arms:
        for key in (arm.name, arm.slug.casefold()):
            if key in seen:
                raise ConfigError(
                    f"arm name {arm.name!r} is duplicated (clashes with {seen[key]!r}); give each [[arm]] a unique 'name'"
                )
        seen[arm.name] = seen[arm.slug.casefold()] = arm.name

