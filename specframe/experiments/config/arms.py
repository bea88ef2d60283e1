"""The rules of arms: plugin names and options checked against the registry, baselines, arms
written in a serving engine's vocabulary, and the sweeps that expand one ``[[arm]]`` into many."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from specframe.options import OptionError, build_options
from specframe.plugins import SINGULAR, PluginError, get_registry
from specframe.experiments.config.schema import ArmConfig, ConfigError, PluginRef, _Arm, _plain, _table


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
    arms = expand_sweep(_base_arm(t, where, default_drafter), t.sweep, where, default_drafter)
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
    from specframe.serving.engines import ENGINES, EngineError, import_arm

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


def expand_sweep(arm: ArmConfig, sweep: dict, where: str, default_drafter: PluginRef | None) -> list[ArmConfig]:
    """One arm per combination of the swept values (cartesian product, TOML key order): the
    sweep rule an experiment file's ``sweep`` tables, replay's ``[grid]`` and tuning apply."""
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

