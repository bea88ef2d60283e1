"""Experiment configuration: one TOML file -> validated dataclasses, before any model loads.

Everything that can be checked without loading a model is checked here (unknown keys at every
table level, plugin names and options against the registry, sweeps, data file and dataset,
duplicated arm names, model names), so a typo fails in a second instead of after minutes of
loading. The full reference with an example of every key is docs/experiments.md.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from .options import OptionError, build_options
from .plugins import SINGULAR, PluginError, get_registry

#: Prefix of a tiny random model built from ``[...random]`` options (tests, smoke runs).
RANDOM_PREFIX = "random:"
#: Prefix of a noisy copy of another declared model (a draft that agrees often).
PERTURBED_PREFIX = "perturbed:"
#: Toy tokenizer for random models: UTF-8 bytes modulo the vocabulary size.
BYTES_TOKENIZER = "bytes"

TOP_KEYS = ("name", "max_new_tokens", "warmup", "repeats", "seed", "stop_at_eos", "threads",
            "target", "models", "drafter", "arm", "data", "output")
MODEL_KEYS = ("model", "dtype", "device", "attn_implementation", "tokenizer", "random", "packed_linears")
RANDOM_KEYS = ("vocab_size", "hidden", "layers", "heads", "kv_heads", "max_positions", "seed", "init_std")
PERTURBED_KEYS = ("noise", "seed")
DRAFTER_KEYS = ("name", "options")
ARM_KEYS = ("name", "baseline", "baseline_options", "policy", "policy_options", "drafter",
            "drafter_options", "verifier", "verifier_options", "sweep")
DATA_KEYS = ("path", "category", "limit", "chat_template", "on_overflow")
ON_OVERFLOW = ("error", "skip")
OUTPUT_KEYS = ("dir", "trees_per_answer")
DTYPES = ("float32", "float64", "float16", "bfloat16")
ATTENTION = ("sdpa", "eager")
SWEEP_SCOPES = ("policy", "drafter", "verifier", "baseline")


class ConfigError(ValueError):
    """The experiment file is invalid; the message names the table, key or value at fault."""


@dataclass
class ModelSpec:
    """How to obtain one model: ``[target]`` or a ``[models.<alias>]`` table.

    Attributes:
        model: local path, hub id, shipped name (``demo-target``), ``random:<arch>`` or
            ``perturbed:<alias>`` (``target`` is the alias of the target model).
        dtype: torch dtype name; None = float32 for the target, the target's for the others.
        device: ``cpu``, ``cuda``, ``cuda:1``, ... or ``auto`` (CUDA when available).
        attn_implementation: ``sdpa`` or ``eager`` (both take a tree mask).
        tokenizer: tokenizer path / name (default: the model's own; ``bytes`` for random models).
        random: options of ``random:``/``perturbed:`` models.
        packed_linears: float32 CPU linears with MKL weights pre-packed per small row count
            (:mod:`specframe.packed_linear`): faster tree forwards, last-bit different logits.
    """

    model: str
    dtype: str | None = None
    device: str | None = None
    attn_implementation: str = "sdpa"
    tokenizer: str | None = None
    random: dict = field(default_factory=dict)
    packed_linears: bool = False

    @property
    def is_random(self) -> bool:
        """True for ``random:`` models (built from a config, no files)."""
        return self.model.startswith(RANDOM_PREFIX)

    @property
    def perturbed_of(self) -> str | None:
        """Alias of the model this one is a noisy copy of, if ``perturbed:``."""
        return self.model[len(PERTURBED_PREFIX):] if self.model.startswith(PERTURBED_PREFIX) else None


@dataclass
class PluginRef:
    """A registered plugin name and its (already validated) option values."""

    name: str
    options: dict = field(default_factory=dict)


@dataclass
class ArmConfig:
    """One arm of the comparison: a baseline or a drafter x policy x verifier combination.

    Attributes:
        name: unique display name (also the answers file stem, see :attr:`slug`).
        baseline: ``autoregressive``, ``hf-assisted`` or ``hf-prompt-lookup``; None for a
            specframe arm.
        baseline_options: options of the baseline.
        policy, drafter, verifier: plugin references of a specframe arm (None for baselines).
        sweep: the swept option values that produced this arm (empty if not swept).
    """

    name: str
    baseline: str | None = None
    baseline_options: dict = field(default_factory=dict)
    policy: PluginRef | None = None
    drafter: PluginRef | None = None
    verifier: PluginRef | None = None
    sweep: dict = field(default_factory=dict)

    @property
    def slug(self) -> str:
        """File-system-safe form of the name."""
        return slugify(self.name)

    def describe(self) -> dict:
        """Plain-data description (stored in run.json; changes here invalidate old answers)."""
        return _plain(dataclasses.asdict(self))


@dataclass
class DataConfig:
    """The prompts: a JSONL file, an optional category filter and a limit.

    ``on_overflow``: a prompt whose tokens plus ``max_new_tokens`` exceed the target's
    context either stops the run (``error``) or is left out for every arm and listed in the
    report (``skip``).
    """

    path: Path
    category: list[str] | None = None
    limit: int | None = None
    chat_template: bool = False
    on_overflow: str = "error"


@dataclass
class OutputConfig:
    """Where results go and how much detail is kept."""

    dir: Path
    trees_per_answer: int = 2


@dataclass
class ExperimentConfig:
    """A whole validated experiment."""

    name: str
    target: ModelSpec
    arms: list[ArmConfig]
    data: DataConfig
    output: OutputConfig
    models: dict[str, ModelSpec] = field(default_factory=dict)
    drafter: PluginRef | None = None
    max_new_tokens: int = 128
    warmup: int = 1
    repeats: int = 1
    seed: int = 0
    stop_at_eos: bool = True
    threads: int | None = None
    source: Path | None = None

    def arm(self, name: str) -> ArmConfig:
        """The arm called ``name``; the error lists the arms."""
        for arm in self.arms:
            if arm.name == name:
                return arm
        raise ConfigError(f"no arm {name!r}; arms: {', '.join(a.name for a in self.arms)}")

    def fingerprint(self) -> dict:
        """Settings shared by all arms that make old answers incomparable when they change."""
        return _plain({
            "target": dataclasses.asdict(self.target),
            "models": {k: dataclasses.asdict(v) for k, v in self.models.items()},
            "max_new_tokens": self.max_new_tokens, "seed": self.seed, "stop_at_eos": self.stop_at_eos,
            "data": {"path": str(self.data.path), "category": self.data.category,
                     "chat_template": self.data.chat_template},
        })


# ---------------------------------------------------------------------- helpers
def slugify(name: str) -> str:
    """``talon[mu=0.01,budget=32]`` -> ``talon.mu=0.01.budget=32`` (safe as a file name)."""
    text = name.replace("[", ".").replace(",", ".").replace("]", "")
    return re.sub(r"[^A-Za-z0-9._=+-]", "_", text)


def _plain(value: Any) -> Any:
    """JSON-able copy (paths as strings, tuples as lists)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def _check_keys(table: Any, allowed: tuple[str, ...], where: str) -> dict:
    """``table`` as a dict whose keys are all in ``allowed``; else name the bad and valid keys."""
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where} must be a table, got {type(table).__name__} {table!r}")
    unknown = [k for k in table if k not in allowed]
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(repr(k) for k in unknown)}; valid keys: {', '.join(allowed)}"
        )
    return dict(table)


def _typed(table: dict, key: str, types: type | tuple, where: str, default: Any = None) -> Any:
    """``table[key]`` checked against ``types`` (bools are not ints), or ``default``."""
    if key not in table:
        return default
    value = table[key]
    types = types if isinstance(types, tuple) else (types,)
    bad_bool = isinstance(value, bool) and bool not in types
    if bad_bool or not isinstance(value, types):
        names = " or ".join(t.__name__ for t in types)
        raise ConfigError(f"{where}: {key!r} must be {names}, got {type(value).__name__} {value!r}")
    return value


def _positive(table: dict, key: str, where: str, default: int, minimum: int = 1) -> int:
    value = _typed(table, key, int, where, default)
    if value < minimum:
        raise ConfigError(f"{where}: {key!r} must be >= {minimum}, got {value}")
    return value


# ---------------------------------------------------------------------- models
def _parse_model(table: Any, where: str, aliases: set[str]) -> ModelSpec:
    t = _check_keys(table, MODEL_KEYS, where)
    if "model" not in t:
        raise ConfigError(f"{where}: 'model' is required (a path, hub id, shipped name or random:<arch>)")
    spec = ModelSpec(
        model=_typed(t, "model", str, where),
        dtype=_typed(t, "dtype", str, where),
        device=_typed(t, "device", str, where),
        attn_implementation=_typed(t, "attn_implementation", str, where, "sdpa"),
        tokenizer=_typed(t, "tokenizer", str, where),
        random=dict(_typed(t, "random", dict, where, {})),
        packed_linears=bool(_typed(t, "packed_linears", bool, where, False)),
    )
    if spec.dtype is not None and spec.dtype not in DTYPES:
        raise ConfigError(f"{where}: dtype {spec.dtype!r} is not one of {', '.join(DTYPES)}")
    if spec.attn_implementation not in ATTENTION:
        raise ConfigError(
            f"{where}: attn_implementation {spec.attn_implementation!r} cannot take a tree mask; "
            f"use one of {', '.join(ATTENTION)}"
        )
    if spec.device is not None and not re.fullmatch(r"auto|cpu|cuda(:\d+)?|mps", spec.device):
        raise ConfigError(f"{where}: device {spec.device!r} is not auto, cpu, cuda, cuda:N or mps")
    _check_model_source(spec, where, aliases)
    return spec


def _check_model_source(spec: ModelSpec, where: str, aliases: set[str]) -> None:
    """Random/perturbed options are valid; a path or shipped name resolves (no loading)."""
    if spec.is_random:
        from .testing.models import ARCHITECTURES

        arch = spec.model[len(RANDOM_PREFIX):]
        if arch not in ARCHITECTURES:
            raise ConfigError(f"{where}: random architecture {arch!r} unknown; valid: {', '.join(ARCHITECTURES)}")
        _check_keys(spec.random, RANDOM_KEYS, f"{where}.random")
        for key in spec.random:
            _typed(spec.random, key, (float, int) if key == "init_std" else int, f"{where}.random")
        return
    if spec.perturbed_of is not None:
        if spec.perturbed_of not in aliases:
            raise ConfigError(
                f"{where}: perturbed:{spec.perturbed_of} names no declared model; declared: {', '.join(sorted(aliases))}"
            )
        _check_keys(spec.random, PERTURBED_KEYS, f"{where}.random")
        _typed(spec.random, "noise", (float, int), f"{where}.random")
        _typed(spec.random, "seed", int, f"{where}.random")
        return
    if spec.random:
        raise ConfigError(f"{where}: 'random' options apply only to random:<arch> and perturbed:<alias> models")
    from .assets import resolve_model_path

    try:
        resolve_model_path(spec.model)
    except FileNotFoundError as err:
        raise ConfigError(f"{where}: {err}") from err


def _parse_models(raw: Any, where: str = "[models]") -> dict[str, ModelSpec]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where} must be a table of [models.<alias>] tables")
    aliases = set(raw) | {"target"}
    if "target" in raw:
        raise ConfigError(f"{where}: the alias 'target' is reserved for the [target] model")
    return {alias: _parse_model(table, f"[models.{alias}]", aliases) for alias, table in raw.items()}


# ---------------------------------------------------------------------- plugins
def _plugin_ref(kind: str, name: Any, options: Any, where: str) -> PluginRef:
    """Check ``name`` is registered as ``kind`` and ``options`` fit its options dataclass."""
    if not isinstance(name, str):
        raise ConfigError(f"{where}: {SINGULAR[kind]} name must be a string, got {name!r}")
    if options is not None and not isinstance(options, Mapping):
        raise ConfigError(f"{where}: {SINGULAR[kind]} options must be a table, got {options!r}")
    try:
        cls = get_registry().get(kind, name)
        build_options(cls.Options, options, f"{SINGULAR[kind]} {name!r}")
    except (PluginError, OptionError) as err:
        raise ConfigError(f"{where}: {err}") from err
    return PluginRef(name, dict(options or {}))


def _baseline_options(name: Any, options: Any, where: str) -> dict:
    from .baselines import BASELINES

    if name not in BASELINES:
        raise ConfigError(f"{where}: unknown baseline {name!r}; available baselines: {', '.join(BASELINES)}")
    if options is not None and not isinstance(options, Mapping):
        raise ConfigError(f"{where}: baseline_options must be a table, got {options!r}")
    try:
        build_options(BASELINES[name].Options, options, f"baseline {name!r}")
    except OptionError as err:
        raise ConfigError(f"{where}: {err}") from err
    return dict(options or {})


def _options_of(kind: str, name: str) -> set[str]:
    if kind == "baseline":
        from .baselines import BASELINES

        return {f.name for f in dataclasses.fields(BASELINES[name].Options)}
    cls = get_registry().get({"policy": "policies", "drafter": "drafters", "verifier": "verifiers"}[kind], name)
    return {f.name for f in dataclasses.fields(cls.Options)}


# ---------------------------------------------------------------------- arms
def _parse_arm(raw: Any, index: int, default_drafter: PluginRef | None) -> list[ArmConfig]:
    where = f"[[arm]] #{index + 1}"
    t = _check_keys(raw, ARM_KEYS, where)
    if "name" in t:
        where = f"[[arm]] {_typed(t, 'name', str, where)!r}"
    baseline = t.get("baseline")
    if baseline is not None and any(k in t for k in ("policy", "policy_options", "drafter", "drafter_options",
                                                     "verifier", "verifier_options")):
        raise ConfigError(f"{where}: a baseline arm takes no policy, drafter or verifier keys")
    if baseline is None and "policy" not in t:
        raise ConfigError(f"{where}: set 'policy' (a specframe arm) or 'baseline' (autoregressive, hf-assisted, hf-prompt-lookup)")
    if baseline is None and "baseline_options" in t:
        raise ConfigError(f"{where}: 'baseline_options' needs 'baseline'")
    arm = _base_arm(t, where, default_drafter)
    sweep = _typed(t, "sweep", dict, where, {})
    return _expand_sweep(arm, sweep, where, default_drafter)


def _base_arm(t: dict, where: str, default_drafter: PluginRef | None) -> ArmConfig:
    if "baseline" in t:
        name = _typed(t, "baseline", str, where)
        opts = _baseline_options(name, t.get("baseline_options"), where)
        if name == "hf-assisted" and opts.get("assistant") is None:
            default = default_drafter.options.get("model") if default_drafter else None
            if not isinstance(default, str):
                raise ConfigError(
                    f"{where}: hf-assisted needs an assistant model: set baseline_options.assistant "
                    "or a 'model' option in [drafter.options]"
                )
        return ArmConfig(name=t.get("name", name), baseline=name, baseline_options=opts)
    drafter_name = t.get("drafter", default_drafter.name if default_drafter else None)
    if drafter_name is None:
        raise ConfigError(f"{where}: no drafter: set 'drafter' here or a default in [drafter]")
    drafter_opts = dict(t.get("drafter_options") or {})
    if default_drafter is not None and drafter_name == default_drafter.name:
        # Defaults belong to the default drafter; another drafter starts from its own defaults.
        drafter_opts = {**default_drafter.options, **drafter_opts}
    drafter = _plugin_ref("drafters", drafter_name, drafter_opts, where)
    policy = _plugin_ref("policies", t["policy"], t.get("policy_options"), where)
    verifier = _plugin_ref("verifiers", t.get("verifier", "greedy"), t.get("verifier_options"), where)
    default_name = policy.name
    if default_drafter is None or drafter.name != default_drafter.name:
        default_name = f"{drafter.name}+{policy.name}"
    return ArmConfig(name=t.get("name", default_name), policy=policy, drafter=drafter, verifier=verifier)


def _sweep_scope(arm: ArmConfig, key: str, where: str) -> tuple[str, str]:
    """``(scope, option)`` of a sweep key: ``policy.mu`` explicitly, or ``mu`` looked up."""
    scopes = ("baseline",) if arm.baseline else ("policy", "drafter", "verifier")
    if "." in key:
        scope, option = key.split(".", 1)
        if scope not in scopes:
            raise ConfigError(f"{where}: sweep key {key!r}: scope {scope!r} not one of {', '.join(scopes)}")
        found = [scope] if option in _options_of(scope, _scope_name(arm, scope)) else []
    else:
        option = key
        found = [s for s in scopes if option in _options_of(s, _scope_name(arm, s))]
    if not found:
        valid = sorted(f"{s}.{o}" for s in scopes for o in _options_of(s, _scope_name(arm, s)))
        raise ConfigError(f"{where}: sweep key {key!r} is no option of this arm; valid: {', '.join(valid)}")
    if len(found) > 1:
        raise ConfigError(f"{where}: sweep key {key!r} is ambiguous; write one of {', '.join(f'{s}.{option}' for s in found)}")
    return found[0], option


def _scope_name(arm: ArmConfig, scope: str) -> str:
    return arm.baseline if scope == "baseline" else getattr(arm, scope).name


def _expand_sweep(arm: ArmConfig, sweep: dict, where: str, default_drafter: PluginRef | None) -> list[ArmConfig]:
    """One arm per combination of the swept values (cartesian product, TOML key order)."""
    if not sweep:
        return [arm]
    axes = []
    for key, values in sweep.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{where}: sweep.{key} must be a non-empty list of values, got {values!r}")
        axes.append((key, *_sweep_scope(arm, key, where), values))
    arms = []
    for combo in itertools.product(*(values for *_, values in axes)):
        new = dataclasses.replace(arm, baseline_options=dict(arm.baseline_options), sweep={})
        label = []
        for (key, scope, option, _), value in zip(axes, combo):
            _set_option(new, scope, option, value)
            new.sweep[key] = value
            label.append(f"{option}={value}")
        new.name = f"{arm.name}[{','.join(label)}]"
        _revalidate(new, f"{where} (sweep {new.name})")
        arms.append(new)
    return arms


def _set_option(arm: ArmConfig, scope: str, option: str, value: Any) -> None:
    if scope == "baseline":
        arm.baseline_options[option] = value
    else:
        ref = getattr(arm, scope)
        setattr(arm, scope, PluginRef(ref.name, {**ref.options, option: value}))


def _revalidate(arm: ArmConfig, where: str) -> None:
    if arm.baseline:
        _baseline_options(arm.baseline, arm.baseline_options, where)
        return
    for scope, kind in (("policy", "policies"), ("drafter", "drafters"), ("verifier", "verifiers")):
        ref = getattr(arm, scope)
        _plugin_ref(kind, ref.name, ref.options, where)


# ---------------------------------------------------------------------- data / output
def _parse_data(raw: Any, base: Path) -> DataConfig:
    t = _check_keys(raw, DATA_KEYS, "[data]")
    if "path" not in t:
        raise ConfigError("[data]: 'path' is required (a JSONL file of prompts)")
    path = _resolve(base, _typed(t, "path", str, "[data]"))
    category = t.get("category")
    if isinstance(category, str):
        category = [category]
    if category is not None and (not isinstance(category, list) or not all(isinstance(c, str) for c in category)):
        raise ConfigError(f"[data]: 'category' must be a string or a list of strings, got {category!r}")
    limit = _typed(t, "limit", int, "[data]")
    if limit is not None and limit < 1:
        raise ConfigError(f"[data]: 'limit' must be >= 1, got {limit}")
    on_overflow = _typed(t, "on_overflow", str, "[data]", "error")
    if on_overflow not in ON_OVERFLOW:
        raise ConfigError(f"[data]: on_overflow {on_overflow!r} is not one of {', '.join(map(repr, ON_OVERFLOW))}")
    data = DataConfig(path, category, limit, _typed(t, "chat_template", bool, "[data]", False), on_overflow)
    _check_dataset(data)
    return data


def _check_dataset(data: DataConfig) -> None:
    from .data import DataError, load_questions

    if not data.path.is_file():
        raise ConfigError(f"[data]: data file {str(data.path)!r} does not exist")
    try:
        questions = load_questions(data.path, data.category, data.limit)
    except DataError as err:
        raise ConfigError(f"[data]: {err}") from err
    if not questions:
        what = f" in categories {data.category}" if data.category else ""
        raise ConfigError(f"[data]: dataset {str(data.path)!r} is empty: no questions{what}")


def _resolve(base: Path, text: str) -> Path:
    path = Path(text).expanduser()
    return path if path.is_absolute() else (base / path)


# ---------------------------------------------------------------------- entry points
def parse_config(raw: Mapping[str, Any], base: Path | str = ".", source: Path | None = None) -> ExperimentConfig:
    """Validate a parsed TOML document; relative paths resolve against ``base``."""
    base = Path(base)
    t = _check_keys(raw, TOP_KEYS, "experiment file (top level)")
    for required in ("target", "arm", "data"):
        if required not in t:
            raise ConfigError(f"experiment file: [{required}] is missing")
    models = _parse_models(t.get("models"))
    target = _parse_model(t["target"], "[target]", set(models) | {"target"})
    if target.perturbed_of is not None:
        raise ConfigError("[target]: the target cannot be perturbed:<alias>; declare it directly")
    drafter = None
    if "drafter" in t:
        d = _check_keys(t["drafter"], DRAFTER_KEYS, "[drafter]")
        if "name" not in d:
            raise ConfigError("[drafter]: 'name' is required (a registered drafter)")
        drafter = _plugin_ref("drafters", d["name"], d.get("options"), "[drafter]")
    if not isinstance(t["arm"], list) or not t["arm"]:
        raise ConfigError("experiment file: declare at least one [[arm]] table")
    arms = [a for i, raw_arm in enumerate(t["arm"]) for a in _parse_arm(raw_arm, i, drafter)]
    _check_unique(arms)
    _check_pairs(target, models, arms)
    out = _check_keys(t.get("output", {}), OUTPUT_KEYS, "[output]")
    output = OutputConfig(
        dir=_resolve(base, _typed(out, "dir", str, "[output]", f"runs/{t.get('name', 'experiment')}")),
        trees_per_answer=_positive(out, "trees_per_answer", "[output]", 2, minimum=0),
    )
    return ExperimentConfig(
        name=_typed(t, "name", str, "experiment file", "experiment"),
        target=target, arms=arms, data=_parse_data(t["data"], base), output=output, models=models,
        drafter=drafter,
        max_new_tokens=_positive(t, "max_new_tokens", "experiment file", 128),
        warmup=_positive(t, "warmup", "experiment file", 1, minimum=0),
        repeats=_positive(t, "repeats", "experiment file", 1),
        seed=_typed(t, "seed", int, "experiment file", 0),
        stop_at_eos=_typed(t, "stop_at_eos", bool, "experiment file", True),
        threads=_positive(t, "threads", "experiment file", None) if "threads" in t else None,
        source=source,
    )


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
    from .pairs import check_same_tokenizer

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
    seen: dict[str, str] = {}
    for arm in arms:
        for key in (arm.name, arm.slug):
            if key in seen:
                raise ConfigError(
                    f"arm name {arm.name!r} is duplicated (clashes with {seen[key]!r}); give each [[arm]] a unique 'name'"
                )
        seen[arm.name] = seen[arm.slug] = arm.name


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
