"""The experiment file's format: what a file holds (the dataclasses every layer reads), its
tables as written, the readers that fill them (unknown keys named with the valid ones) and the
``[target]`` / ``[models]`` tables."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from specframe.models.linears import DEFAULT_LINEARS, LINEARS
from specframe.options import OptionError, build_options
from specframe.plugins import get_registry
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
        linears: ``"float32"`` (the default: as ``packed_linears`` says) or ``"bf16"``
            (:mod:`specframe.models.linears`: row-invariant bf16 linears where the CPU has
            ``amx_bf16`` or ``avx512_bf16``, else the float32 path with one warning line).
        exact: run the exact forward (:mod:`specframe.models.exact`): a token's logits depend
            only on its prefix, bit for bit, so every arm's greedy output is the autoregressive
            one by construction. CPU only; another device is refused in one line.
    """

    model: str = field(metadata={"help": "a path, hub id, shipped name or random:<arch>"})
    dtype: str | None = None
    device: str | None = None
    attn_implementation: str = "sdpa"
    tokenizer: str | None = None
    random: dict = field(default_factory=dict)
    packed_linears: bool | str = False
    linears: str = DEFAULT_LINEARS
    exact: bool = False

    def __post_init__(self) -> None:
        _one_of("dtype", self.dtype, DTYPES)
        _one_of("linears", self.linears, LINEARS)
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
            "target": _spec_print(self.target),
            "models": {k: _spec_print(v) for k, v in self.models.items()},
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
def _spec_print(spec: ModelSpec) -> dict:
    """A model table as the fingerprint keeps it: default ``linears`` and ``exact`` left out, so
    runs written before those switches existed still match."""
    data = dataclasses.asdict(spec)
    if data.get("linears") == DEFAULT_LINEARS:
        del data["linears"]
    if not data.get("exact"):
        data.pop("exact", None)
    return data


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

