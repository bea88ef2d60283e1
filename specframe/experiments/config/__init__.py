"""Experiment configuration: one TOML file -> validated dataclasses, before any model loads.

Everything that can be checked without loading a model is checked here (unknown keys at every
table level, plugin names and options against the registry, sweeps, data file and dataset,
duplicated arm names, model names), so a typo fails in a second instead of after minutes of
loading. Each table is a dataclass filled by :func:`specframe.options.build_options`, the
checker of plugin options, so a bad key names itself and the valid ones. The full reference
with an example of every key is docs/experiments.md.

The package: :mod:`.schema` (the file format and the dataclasses), :mod:`.arms` (plugins, arms,
engine arms and sweeps), :mod:`.checks` (data, batching, model pairs, names); the names below
import from here.
"""

from __future__ import annotations

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]
from pathlib import Path
from typing import Any, Mapping

from specframe.experiments.config.arms import expand_sweep, _parse_arm, _plugin_ref
from specframe.experiments.config.checks import _batch_allocator, _check_pairs, _check_unique, _parse_data, _resolve
from specframe.experiments.config.schema import (
    ATTENTION, BYTES_TOKENIZER, DTYPES, LINEAR_KERNELS, ON_OVERFLOW, PERTURBED_PREFIX, RANDOM_PREFIX, ArmConfig,
    ConfigError, DataConfig, ExperimentConfig, ModelSpec, OutputConfig, PluginRef, RunSettings, _File, _parse_model,
    _parse_models, _table, lossy_label,
)
from specframe.experiments.runs.layout import slugify

__all__ = [
    "ATTENTION", "BYTES_TOKENIZER", "DTYPES", "LINEAR_KERNELS", "ON_OVERFLOW", "PERTURBED_PREFIX", "RANDOM_PREFIX",
    "ArmConfig", "ConfigError", "DataConfig", "ExperimentConfig", "ModelSpec", "OutputConfig", "PluginRef",
    "RunSettings", "expand_sweep", "load_config", "lossy_label", "parse_config", "slugify", "tomllib",
]


def parse_config(raw: Mapping[str, Any], base: Path | str = ".", source: Path | None = None) -> ExperimentConfig:
    """Validate a parsed TOML document; relative paths resolve against ``base``."""
    base = Path(base)
    t = _table(_File, raw, "experiment file (top level)")
    models = _parse_models(t.models)
    target = _parse_model(t.target, "[target]", set(models) | {"target"})
    if target.perturbed_of is not None:
        raise ConfigError("[target]: the target cannot be perturbed:<alias>; declare it directly")
    drafter = None
    if t.drafter is not None:
        d = _table(PluginRef, t.drafter, "[drafter]")
        drafter = _plugin_ref("drafters", d.name, d.options, "[drafter]")
    if not t.arm:
        raise ConfigError("experiment file: declare at least one [[arm]] table")
    arms = [a for i, raw_arm in enumerate(t.arm) for a in _parse_arm(raw_arm, i, drafter)]
    _check_unique(arms)
    _check_pairs(target, models, arms)
    output = _table(OutputConfig, {"dir": f"runs/{t.name}", **t.output}, "[output]")
    output.dir = _resolve(base, output.dir)
    return ExperimentConfig(
        name=t.name, target=target, arms=arms, data=_parse_data(t.data, base), output=output, models=models,
        drafter=drafter, max_new_tokens=t.max_new_tokens, warmup=t.warmup, repeats=t.repeats, seed=t.seed,
        stop_at_eos=t.stop_at_eos, threads=t.threads, source=source, batch_size=t.batch_size,
        batch_allocator=_batch_allocator(t.batch_allocator, t.batch_size, arms), batch_budget=t.batch_budget,
        batch_refill=t.batch_refill, load=dict(t.load),
    )


def load_config(path: str | Path) -> ExperimentConfig:
    """Read and validate an experiment TOML file (nothing is loaded but the registry)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"experiment file {str(path)!r} does not exist")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: invalid TOML: {err}") from err
    try:
        return parse_config(raw, base=path.resolve().parent, source=path.resolve())
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from err
