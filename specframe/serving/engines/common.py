"""What every engine mapping reads from an arm: model paths, the chain length, the static tree
(given, or fitted to measured acceptance for an adaptive policy) and the verifier's fidelity."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from specframe.serving.acceptance import Acceptance, AcceptanceError, basis, fit_static_tree, from_records
from specframe.serving.engines.fidelity import APPROXIMATED, NOT_EXPRESSIBLE, Fidelity, Ref

#: What :meth:`ExportContext.measured` writes under ``provenance["fallback"]`` when it counts
#: the run's own steps, and the fitted tree's fidelity statement quotes.
FALLBACK = "no acceptance file was passed"


@dataclass
class ArmSpec:
    """The parts of an arm a mapping reads (an experiment's ``Any`` has the same
    attributes; the engines do not import the experiment file's module, which imports them)."""

    name: str
    drafter: Ref | None = None
    policy: Ref | None = None
    verifier: Ref | None = None
    baseline: str | None = None
    baseline_options: dict = field(default_factory=dict)


@dataclass
class ExportContext:
    """What an export may read besides the arm.

    Attributes:
        models: model aliases of the experiment (``[models.<alias>]`` and ``target``) -> the
            model each names.
        acceptance: measured acceptance (``specframe acceptance``) to fit static trees to.
        records: the arm's recorded answers, when a run holds them (their steps give the
            acceptance when no file is passed, and the sizes ``auto`` settled on).
    """

    models: dict[str, str] = field(default_factory=dict)
    acceptance: Acceptance | None = None
    records: list[dict] = field(default_factory=list)

    @classmethod
    def of(cls, config: Any = None, **kwargs: Any) -> "ExportContext":
        """A context whose model aliases are ``config``'s (an ``ExperimentConfig``)."""
        models = {}
        if config is not None:
            models = {alias: spec.model for alias, spec in config.models.items()} | {"target": config.target.model}
        return cls(models=models, **kwargs)

    def measured(self, arm: Any) -> Acceptance | None:
        """The acceptance passed in, else the one the arm's recorded steps show, else None.
        Counted from the steps, it says so: ``provenance["fallback"]`` is :data:`FALLBACK`, and
        its ``unmarked_leaves`` how many steps predate the leaf column (see :func:`basis`)."""
        if self.acceptance is not None:
            return self.acceptance
        if self.records:
            try:
                return from_records(self.records, arm.name, "recorded steps", provenance={"fallback": FALLBACK})
            except AcceptanceError:
                return None
        return None

    def recorded(self, column: str) -> list[float]:
        """One ``steps`` column over the recorded answers (tree sizes, depths)."""
        return [v for r in self.records for v in r.get("steps", {}).get(column, [])]


def model_path(value: str, ctx: ExportContext) -> str:
    """A model option as a path the engine can load: a ``[models]`` alias as its model, a
    shipped name as its folder; anything else as given."""
    from specframe.models.assets import SHIPPED_MODELS

    value = ctx.models.get(value, value)
    shipped = SHIPPED_MODELS.get(value)
    return str(shipped) if shipped is not None else str(value)


def option_values(kind: str, ref: Any) -> dict[str, Any]:
    """``ref``'s options over its plugin's ``Options`` defaults: the values the plugin runs with,
    so a mapping reads a default from the plugin, never from a copy of it here. ``kind``: a
    plugin kind (``policies``, ``drafters``, ``verifiers``) or ``allocators``."""
    import dataclasses

    if kind == "allocators":
        from specframe.decode.allocate import allocator_classes

        plugin = allocator_classes()[ref.name]
    else:
        from specframe.plugins import get_registry

        plugin = get_registry().get(kind, ref.name)
    cls = getattr(plugin, "Options", None)
    defaults = {}
    if cls is not None and dataclasses.is_dataclass(cls):
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                defaults[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                defaults[f.name] = f.default_factory()
    return {**defaults, **ref.options}


def policy_depth(policy: Any) -> int:
    """How deep an adaptive policy's tree grows: its ``depth``, else its ``max_depth``, as the
    policy itself defaults them (4 for a policy that declares neither)."""
    o = option_values("policies", policy)
    return int(o.get("depth", o.get("max_depth", 4)))


def chain_length(policy: Any, ctx: ExportContext, fid: Fidelity) -> int:
    """Tokens a chain drafts per step; ``auto`` is approximated by what the run settled on."""
    o = option_values("policies", policy)
    gamma = o["gamma"]
    if gamma != "auto":
        return int(gamma)
    depths = ctx.recorded("depth")
    if depths:
        gamma = max(1, round(statistics.median(depths)))
        fid.add(APPROXIMATED, f"gamma = 'auto' sizes each step; served as the median recorded length {gamma}")
        return gamma
    gamma = int(o["max_gamma"])
    fid.add(APPROXIMATED, f"gamma = 'auto' sizes each step and no run is recorded: served at its bound max_gamma = {gamma}")
    return gamma


def tree_budget(policy: Any, ctx: ExportContext) -> int:
    """The node budget (root included) an adaptive policy's fitted tree gets."""
    o = option_values("policies", policy)
    budget = o.get("budget", 60)
    if budget != "auto":
        return int(budget)
    sizes = ctx.recorded("tree_size")
    return max(2, round(statistics.median(sizes))) if sizes else int(o.get("max_budget", 64))


def fixed_shape(policy: Any) -> tuple[tuple[int, ...], ...] | None:
    """The rank paths of ``policy``'s tree (a :class:`PluginRef`) when the policy fixes its shape
    before decoding (:meth:`~specframe.TreePolicy.fixed_shape`), else None."""
    from specframe.interfaces import TreePolicy
    from specframe.plugins import get_registry

    cls = get_registry().get("policies", policy.name)
    if cls.fixed_shape is TreePolicy.fixed_shape:  # adaptive: nothing to build
        return None
    return cls(cls.Options(**policy.options)).fixed_shape()


def static_paths(arm: Any, ctx: ExportContext, fid: Fidelity) -> tuple[tuple[int, ...], ...] | None:
    """The arm's tree as rank paths: its own when the policy fixes its shape (``static``,
    ``sequoia``) or, for an adaptive policy, the static tree fitted to measured acceptance
    (None when nothing is measured)."""
    policy = arm.policy
    fixed = fixed_shape(policy)
    if fixed is not None:
        return fixed
    acc = ctx.measured(arm)
    if acc is None:
        return None
    budget = tree_budget(policy, ctx)
    fallback = acc.provenance.get("fallback")
    source = f"{fallback}: {basis(acc)}" if fallback else basis(acc)
    fid.add(APPROXIMATED, f"the {policy.name} tree adapts each step; served as the static tree of {budget} nodes "
            f"fitted to the acceptance measured for this arm ({source}; Sequoia's DP)")
    return fit_static_tree(acc, budget)


def chain_of(paths: tuple[tuple[int, ...], ...]) -> int:
    """Depth of a rank-path tree (the chain its top path makes)."""
    return max((len(p) for p in paths), default=0)


def verifier_name(arm: Any) -> str:
    """The arm's verifier (``greedy`` when it names none, as the engine builds it)."""
    return arm.verifier.name if arm.verifier is not None else "greedy"


def verifier_fidelity(arm: Any, engine: str, sampling_note: str) -> Fidelity:
    """How ``engine`` verifies as the arm's verifier does."""
    from specframe.plugins import get_registry

    fid = Fidelity()
    name = verifier_name(arm)
    cls = get_registry().get("verifiers", name)
    if not cls.lossless:
        fid.add(NOT_EXPRESSIBLE, f"verifier {name!r} (lossy acceptance) has no counterpart in {engine}, "
                "which verifies losslessly only")
    elif cls.sampling:  # the same distribution as the engine's own sampled verification, not the same draws
        fid.add(APPROXIMATED, f"the {name} verifier: " + sampling_note)
    return fid


def note_unmapped(arm: Any, engine: str, mapped: set[str], fid: Fidelity) -> None:
    """Name every drafter option the mapping did not carry and the arm sets away from its
    default, so no setting is dropped without a word (a drafter the engine lacks is already
    not expressible and is left alone)."""
    import dataclasses

    from specframe.plugins import get_registry

    if fid.level == NOT_EXPRESSIBLE or arm.drafter is None:
        return
    cls = get_registry().get("drafters", arm.drafter.name)
    defaults = {f.name: f.default for f in dataclasses.fields(cls.Options)} if dataclasses.is_dataclass(cls.Options) else {}
    for key, value in arm.drafter.options.items():
        if key not in mapped and defaults.get(key, object()) != value:
            fid.add(APPROXIMATED, f"{arm.drafter.name} option {key} = {value!r} has no {engine} counterpart")
