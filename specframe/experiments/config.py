"""Experiment configuration: one TOML file -> validated dataclasses, before any model loads.

Everything that can be checked without loading a model is checked here (unknown keys at every
table level, plugin names and options against the registry, sweeps, data file and dataset,
duplicated arm names, model names), so a typo fails in a second instead of after minutes of
loading. Each table is a dataclass filled by :func:`specframe.options.build_options`, the
checker of plugin options, so a bad key names itself and the valid ones. The full reference
with an example of every key is docs/experiments.md.
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

from specframe.options import OptionError, build_options
from specframe.plugins import SINGULAR, PluginError, get_registry
from specframe.experiments.runs.layout import slugify

#: Prefix of a tiny random model built from ``[...random]`` options (tests, smoke runs).
RANDOM_PREFIX = "random:"
#: Prefix of a noisy copy of another declared model (a draft that agrees often).
PERTURBED_PREFIX = "perturbed:"
#: Toy tokenizer for random models: UTF-8 bytes modulo the vocabulary size.
BYTES_TOKENIZER = "bytes"

ON_OVERFLOW = ("error", "skip")
DTYPES = ("float32", "float64", "float16", "bfloat16")
ATTENTION = ("sdpa", "eager")
LINEAR_KERNELS = ("auto", "native", "onednn", "mkl")  # packed_linears values besides true/false


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
        packed_linears: fast small-batch float32 CPU linears (:mod:`specframe.models.packed_linear`):
            ``true`` / ``"auto"`` (the fastest kernel on this CPU), ``"native"`` (specframe's
            own, compiled here at first use), ``"onednn"`` or ``"mkl"``
            (pre-packed MKL weights); faster tree forwards, last-bit different logits.
    """

    model: str = field(metadata={"help": "a path, hub id, shipped name or random:<arch>"})
    dtype: str | None = None
    device: str | None = None
    attn_implementation: str = "sdpa"
    tokenizer: str | None = None
    random: dict = field(default_factory=dict)
    packed_linears: bool | str = False

    def __post_init__(self) -> None:
        _one_of("dtype", self.dtype, DTYPES)
        if not isinstance(self.packed_linears, bool):
            _one_of("packed_linears", self.packed_linears, LINEAR_KERNELS)
        if self.attn_implementation not in ATTENTION:
            raise ConfigError(f"attn_implementation {self.attn_implementation!r} cannot take a tree mask; "
                              f"use one of {', '.join(ATTENTION)}")
        if self.device is not None and not re.fullmatch(r"auto|cpu|cuda(:\d+)?|mps", self.device):
            raise ConfigError(f"device {self.device!r} is not auto, cpu, cuda, cuda:N or mps")

    @property
    def is_random(self) -> bool:
        """True for ``random:`` models (built from a config, no files)."""
        return self.model.startswith(RANDOM_PREFIX)

    @property
    def perturbed_of(self) -> str | None:
        """Alias of the model this one is a noisy copy of, if ``perturbed:``."""
        return self.model[len(PERTURBED_PREFIX):] if self.model.startswith(PERTURBED_PREFIX) else None

    def file_names(self) -> dict[str, str]:
        """``{"": model, "tokenizer": tokenizer}``: the names that may be files here (a
        ``random:`` or ``perturbed:`` model and the ``bytes`` tokenizer are decided by options)."""
        names = {} if self.is_random or self.perturbed_of is not None else {"": self.model}
        if self.tokenizer not in (None, BYTES_TOKENIZER):
            names["tokenizer"] = self.tokenizer
        return names


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
    #: For an arm written in an engine's vocabulary (``engine = "vllm"``): the engine, its
    #: configuration as written and the fidelity statement (docs/serving.md); empty otherwise.
    imported: dict = field(default_factory=dict)
    #: The arm's own batch allocator (``batch_allocator`` in its [[arm]] table; a load-aware one
    #: such as ``goodput``, docs/load.md); None: the experiment's ``batch_allocator``.
    batch_allocator: PluginRef | None = None

    @property
    def slug(self) -> str:
        """File-system-safe form of the name."""
        return slugify(self.name)

    def describe(self) -> dict:
        """Plain-data description (stored in run.json; changes here invalidate old answers)."""
        data = _plain(dataclasses.asdict(self))
        if not data["imported"]:
            del data["imported"]  # arms written in specframe's own keys describe as before
        if data["batch_allocator"] is None:
            del data["batch_allocator"]  # likewise arms without their own allocator
        return data


def lossy_label(arm: ArmConfig) -> str | None:
    """``"typical epsilon=0.3"``: the verifier and its options, for an arm whose verifier is
    not lossless (``Verifier.lossless``); None for lossless arms and baselines."""
    if arm.verifier is None:
        return None
    cls = get_registry().get("verifiers", arm.verifier.name)
    if getattr(cls, "lossless", True):
        return None
    options = " ".join(f"{k}={v}" for k, v in sorted(arm.verifier.options.items()))
    return f"{arm.verifier.name} {options}".strip()


@dataclass
class DataConfig:
    """The prompts: a JSONL file, an optional category filter and a limit.

    ``on_overflow``: a prompt whose tokens plus ``max_new_tokens`` exceed the target's
    context either stops the run (``error``) or is left out for every arm and listed in the
    report (``skip``).
    """

    path: Path = field(metadata={"help": "a JSONL file of prompts"})
    category: list[str] | None = None
    limit: int | None = None
    chat_template: bool = False
    on_overflow: str = "error"

    def __post_init__(self) -> None:
        if self.category is not None and not all(isinstance(c, str) for c in self.category):
            raise ConfigError(f"'category' must be a string or a list of strings, got {self.category!r}")
        _at_least(self, limit=1)
        _one_of("on_overflow", self.on_overflow, ON_OVERFLOW)


@dataclass
class OutputConfig:
    """Where results go and how much detail is kept."""

    dir: Path
    trees_per_answer: int = 2
    #: The first questions (data-file order) whose every step's tree, with token text, is
    #: recorded for trees.html; the others keep ``trees_per_answer`` trees.
    explorer_questions: int = 3

    def __post_init__(self) -> None:
        _at_least(self, trees_per_answer=0, explorer_questions=0)


@dataclass(kw_only=True)
class RunSettings:
    """The top-level scalar settings of an experiment file, with their defaults and checks."""

    max_new_tokens: int = 128
    warmup: int = 1
    repeats: int = 1
    seed: int = 0
    stop_at_eos: bool = True
    threads: int | None = None
    #: Prompts decoded together (docs/batching.md); specframe arms and ``autoregressive`` only.
    batch_size: int = 1
    #: How a batch's node budget is split (a registered batch allocator's name).
    batch_allocator: str = "equal"
    #: Nodes per sequence in the batch budget (total = batch_budget x batch_size); None = none.
    batch_budget: int | None = None
    #: Continuous batching: at most ``batch_size`` sequences live, a finished one's row going to
    #: the next question (``autoregressive`` refills the same way).
    batch_refill: bool = False
    #: Score every speculative answer: its negative log-likelihood under the target, from the
    #: verification forwards (no extra forward; docs/verifiers.md). None: on when some arm's
    #: verifier is lossy (then every speculative arm is scored, the lossless ones as the reference).
    score: bool | None = None

    def __post_init__(self) -> None:
        _at_least(self, max_new_tokens=1, warmup=0, repeats=1, threads=1, batch_size=1, batch_budget=1)
        if self.batch_refill and self.batch_size < 2:
            raise ConfigError(f"batch_refill = true needs batch_size >= 2 (the rows to refill), got {self.batch_size}")


@dataclass(kw_only=True)
class ExperimentConfig(RunSettings):
    """A whole validated experiment."""

    name: str
    target: ModelSpec
    arms: list[ArmConfig]
    data: DataConfig
    output: OutputConfig
    models: dict[str, ModelSpec] = field(default_factory=dict)
    drafter: PluginRef | None = None
    source: Path | None = None
    #: The [load] table as written (checked by ``specframe load``: docs/load.md).
    load: dict = field(default_factory=dict)

    def arm(self, name: str) -> ArmConfig:
        """The arm called ``name``; the error lists the arms."""
        for arm in self.arms:
            if arm.name == name:
                return arm
        raise ConfigError(f"no arm {name!r}; arms: {', '.join(a.name for a in self.arms)}")

    @property
    def scored(self) -> bool:
        """Whether speculative answers are scored (``score``, or by default: a lossy arm)."""
        return self.score if self.score is not None else any(lossy_label(a) for a in self.arms)

    def fingerprint(self) -> dict:
        """Settings shared by all arms that make old answers incomparable when they change."""
        return _plain({
            "target": dataclasses.asdict(self.target),
            "models": {k: dataclasses.asdict(v) for k, v in self.models.items()},
            "max_new_tokens": self.max_new_tokens, "seed": self.seed, "stop_at_eos": self.stop_at_eos,
            "data": {"path": str(self.data.path), "category": self.data.category,
                     "chat_template": self.data.chat_template},
            # Only batched runs carry the key, so unbatched runs resume as before.
            **({"batch": {"size": self.batch_size, "allocator": self.batch_allocator, "budget": self.batch_budget,
                          **({"refill": True} if self.batch_refill else {})}}
               if self.batch_size > 1 else {}),
            # Only scored runs carry it: an unscored run's answers have no NLL to report.
            **({"score": True} if self.scored else {}),
        })


@dataclass(kw_only=True)
class _File(RunSettings):
    """The top level of an experiment file as written (its tables are parsed separately)."""

    target: dict = field(metadata={"help": "the [target] table"})
    arm: list = field(metadata={"help": "one [[arm]] table per arm"})
    data: dict = field(metadata={"help": "the [data] table"})
    name: str = "experiment"
    models: dict = field(default_factory=dict)
    drafter: dict | None = None
    output: dict = field(default_factory=dict)
    load: dict = field(default_factory=dict, metadata={"help": "the [load] table (specframe load, docs/load.md)"})


@dataclass
class _Arm:
    """An ``[[arm]]`` table as written (before defaults, plugin checks and sweeps)."""

    name: str | None = None
    baseline: str | None = None
    baseline_options: dict | None = None
    policy: str | None = None
    policy_options: dict | None = None
    drafter: str | None = None
    drafter_options: dict | None = None
    verifier: str | None = None
    verifier_options: dict | None = None
    sweep: dict = field(default_factory=dict)
    engine: str | None = None
    speculative_config: dict | None = None
    server_args: dict | None = None
    generate_kwargs: dict | None = None
    args: dict | None = None
    batch_allocator: str | None = None
    batch_allocator_options: dict | None = None


# ---------------------------------------------------------------------- helpers
def _plain(value: Any) -> Any:
    """JSON-able copy (paths as strings, tuples as lists)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def _table(cls: type, raw: Any, where: str) -> Any:
    """The TOML table ``raw`` as the dataclass ``cls`` (:func:`~specframe.options.build_options`):
    an unknown key, a missing or ill-typed one, or a bad value names the key and the valid ones."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where} must be a table, got {type(raw).__name__} {raw!r}")
    try:
        return build_options(cls, raw, where, noun="key")
    except OptionError as err:
        raise ConfigError(str(err)) from err


def _at_least(obj: Any, **minimums: int) -> None:
    for key, minimum in minimums.items():
        value = getattr(obj, key)
        if value is not None and value < minimum:
            raise ConfigError(f"{key!r} must be >= {minimum}, got {value}")


def _one_of(key: str, value: Any, valid: tuple[str, ...]) -> None:
    if value is not None and value not in valid:
        raise ConfigError(f"{key} {value!r} is not one of {', '.join(valid)}")


# ---------------------------------------------------------------------- models
def _parse_model(table: Any, where: str, aliases: set[str]) -> ModelSpec:
    spec = _table(ModelSpec, table, where)
    _check_model_source(spec, where, aliases)
    return spec


def _check_model_source(spec: ModelSpec, where: str, aliases: set[str]) -> None:
    """Random/perturbed options are valid; a path or shipped name resolves (no loading)."""
    from specframe.models import synthetic

    if spec.is_random:
        arch = spec.model[len(RANDOM_PREFIX):]
        if arch not in synthetic.ARCHITECTURES:
            raise ConfigError(f"{where}: random architecture {arch!r} unknown; valid: {', '.join(synthetic.ARCHITECTURES)}")
        _table(synthetic.RandomModelOptions, spec.random, f"{where}.random")
        return
    if spec.perturbed_of is not None:
        if spec.perturbed_of not in aliases:
            raise ConfigError(
                f"{where}: perturbed:{spec.perturbed_of} names no declared model; declared: {', '.join(sorted(aliases))}"
            )
        _table(synthetic.PerturbedOptions, spec.random, f"{where}.random")
        return
    if spec.random:
        raise ConfigError(f"{where}: 'random' options apply only to random:<arch> and perturbed:<alias> models")
    from specframe.models.assets import resolve_model_path

    try:
        resolve_model_path(spec.model)
    except FileNotFoundError as err:
        raise ConfigError(f"{where}: {err}") from err


def _parse_models(raw: dict) -> dict[str, ModelSpec]:
    if "target" in raw:
        raise ConfigError("[models]: the alias 'target' is reserved for the [target] model")
    aliases = set(raw) | {"target"}
    return {alias: _parse_model(table, f"[models.{alias}]", aliases) for alias, table in raw.items()}


# ---------------------------------------------------------------------- plugins
def _plugin_ref(kind: str, name: str, options: dict | None, where: str) -> PluginRef:
    """Check ``name`` is registered as ``kind`` and ``options`` fit its options dataclass."""
    try:
        cls = get_registry().get(kind, name)
        build_options(cls.Options, options, f"{SINGULAR[kind]} {name!r}")
    except (PluginError, OptionError) as err:
        raise ConfigError(f"{where}: {err}") from err
    return PluginRef(name, dict(options or {}))


def _baseline_options(name: str, options: dict | None, where: str) -> dict:
    from specframe.experiments.baselines import BASELINES

    if name not in BASELINES:
        raise ConfigError(f"{where}: unknown baseline {name!r}; available baselines: {', '.join(BASELINES)}")
    try:
        build_options(BASELINES[name].Options, options, f"baseline {name!r}")
    except OptionError as err:
        raise ConfigError(f"{where}: {err}") from err
    return dict(options or {})


def _options_of(kind: str, name: str) -> set[str]:
    if kind == "baseline":
        from specframe.experiments.baselines import BASELINES

        return {f.name for f in dataclasses.fields(BASELINES[name].Options)}
    cls = get_registry().get({"policy": "policies", "drafter": "drafters", "verifier": "verifiers"}[kind], name)
    return {f.name for f in dataclasses.fields(cls.Options)}


# ---------------------------------------------------------------------- arms
def _parse_arm(raw: Any, index: int, default_drafter: PluginRef | None) -> list[ArmConfig]:
    t = _table(_Arm, raw, f"[[arm]] #{index + 1}")
    where = f"[[arm]] {t.name!r}" if t.name is not None else f"[[arm]] #{index + 1}"
    if t.engine is not None or any(getattr(t, k) is not None for k in _ENGINE_KEYS):
        return [_engine_arm(t, where)]
    plugin_keys = (t.policy, t.policy_options, t.drafter, t.drafter_options, t.verifier, t.verifier_options)
    if t.baseline is not None and any(v is not None for v in plugin_keys):
        raise ConfigError(f"{where}: a baseline arm takes no policy, drafter or verifier keys")
    if t.baseline is None and t.policy is None:
        raise ConfigError(f"{where}: set 'policy' (a specframe arm) or 'baseline' (autoregressive, hf-assisted, hf-prompt-lookup)")
    if t.baseline is None and t.baseline_options is not None:
        raise ConfigError(f"{where}: 'baseline_options' needs 'baseline'")
    arms = _expand_sweep(_base_arm(t, where, default_drafter), t.sweep, where, default_drafter)
    return _arm_allocator(arms, t, where)


#: The [[arm]] keys holding an engine's configuration, one per engine (docs/serving.md).
_ENGINE_KEYS = ("speculative_config", "server_args", "generate_kwargs", "args")


def _arm_allocator(arms: list[ArmConfig], t: _Arm, where: str) -> list[ArmConfig]:
    """The arms with the [[arm]]'s own ``batch_allocator`` (a specframe arm only), checked."""
    if t.batch_allocator is None:
        if t.batch_allocator_options is not None:
            raise ConfigError(f"{where}: 'batch_allocator_options' needs 'batch_allocator'")
        return arms
    if t.baseline is not None:
        raise ConfigError(f"{where}: a baseline arm takes no 'batch_allocator' (it does not speculate)")
    from specframe.decode.allocate import allocator_classes

    classes = allocator_classes()
    if t.batch_allocator not in classes:
        raise ConfigError(f"{where}: batch_allocator {t.batch_allocator!r} is not one of {', '.join(sorted(classes))}")
    cls = classes[t.batch_allocator]
    try:
        build_options(cls.Options, dict(t.batch_allocator_options or {}), f"allocator {t.batch_allocator!r}")
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{where}: {err}") from err
    for arm in arms:
        arm.batch_allocator = PluginRef(t.batch_allocator, dict(t.batch_allocator_options or {}))
    return arms


def _engine_arm(t: _Arm, where: str) -> ArmConfig:
    """An arm written in an engine's vocabulary, as the equivalent specframe arm."""
    from specframe.experiments.engines import ENGINES, EngineError, import_arm

    if t.engine not in ENGINES:
        raise ConfigError(f"{where}: engine {t.engine!r} is not one of {', '.join(ENGINES)}")
    key = ENGINES[t.engine][1]
    others = [k for k in ("policy", "policy_options", "drafter", "drafter_options", "verifier", "verifier_options",
                          "baseline", "baseline_options", *_ENGINE_KEYS) if k != key and getattr(t, k) is not None]
    if others or t.sweep:
        raise ConfigError(f"{where}: an engine = {t.engine!r} arm takes only name and {key}, not {', '.join(others or ['sweep'])}")
    table = getattr(t, key)
    if table is None:
        raise ConfigError(f"{where}: engine = {t.engine!r} needs {key} = {{ ... }}")
    try:
        drafter, policy, verifier, fidelity = import_arm(t.engine, dict(table), where)
    except EngineError as err:
        raise ConfigError(str(err)) from err
    arm = ArmConfig(name=t.name or f"{t.engine}:{drafter.name}+{policy.name}",
                    drafter=_plugin_ref("drafters", drafter.name, drafter.options, where),
                    policy=_plugin_ref("policies", policy.name, policy.options, where),
                    verifier=_plugin_ref("verifiers", verifier.name, verifier.options, where),
                    imported={"engine": t.engine, key: _plain(table), "fidelity": fidelity.statement})
    return arm


def _base_arm(t: _Arm, where: str, default_drafter: PluginRef | None) -> ArmConfig:
    if t.baseline is not None:
        opts = _baseline_options(t.baseline, t.baseline_options, where)
        if t.baseline == "hf-assisted" and opts.get("assistant") is None:
            default = default_drafter.options.get("model") if default_drafter else None
            if not isinstance(default, str):
                raise ConfigError(
                    f"{where}: hf-assisted needs an assistant model: set baseline_options.assistant "
                    "or a 'model' option in [drafter.options]"
                )
        return ArmConfig(name=t.baseline if t.name is None else t.name, baseline=t.baseline, baseline_options=opts)
    drafter_name = t.drafter or (default_drafter.name if default_drafter else None)
    if drafter_name is None:
        raise ConfigError(f"{where}: no drafter: set 'drafter' here or a default in [drafter]")
    drafter_opts = dict(t.drafter_options or {})
    if default_drafter is not None and drafter_name == default_drafter.name:
        # Defaults belong to the default drafter; another drafter starts from its own defaults.
        drafter_opts = {**default_drafter.options, **drafter_opts}
    drafter = _plugin_ref("drafters", drafter_name, drafter_opts, where)
    policy = _plugin_ref("policies", t.policy, t.policy_options, where)
    verifier = _plugin_ref("verifiers", t.verifier or "greedy", t.verifier_options, where)
    default_name = policy.name
    if default_drafter is None or drafter.name != default_drafter.name:
        default_name = f"{drafter.name}+{policy.name}"
    return ArmConfig(name=default_name if t.name is None else t.name, policy=policy, drafter=drafter, verifier=verifier)


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


# ---------------------------------------------------------------------- entry points
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
