"""An arm's search space: its drafter's, policy's and verifier's declared spaces, as one.

Keys are the sweep file's (``drafter.max_ngram``, ``policy.budget``), and a point becomes an
arm by the sweep's own rule (:func:`~specframe.experiments.config.expand_sweep`: set each
option, then check the plugins' options again), so a tuned arm is exactly the arm a sweep
would have built for those values.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from specframe.experiments.config import ArmConfig, ConfigError, expand_sweep
from specframe.options import build_options
from specframe.plugins import get_registry
from specframe.search_space import Dimension, search_space

#: What ``--space`` may name: every scope, or one.
SPACES = ("all", "drafter", "policy", "verifier")
#: The plugin kind behind each scope of an arm.
KIND = {"drafter": "drafters", "policy": "policies", "verifier": "verifiers"}


def arm_space(arm: ArmConfig, space: str = "all") -> dict[str, Dimension]:
    """``{"scope.option": Dimension}`` of ``arm``'s plugins (only ``space``'s scope unless
    ``all``); the others are held as the arm gives them. Conditions are re-keyed the same way."""
    if space not in SPACES:
        raise ConfigError(f"--space {space!r} is not one of {', '.join(SPACES)}")
    out: dict[str, Dimension] = {}
    for scope in (KIND if space == "all" else (space,)):
        ref = getattr(arm, scope)
        if ref is None:
            continue
        cls = getattr(get_registry().get(KIND[scope], ref.name), "Options", None)
        for name, dim in search_space(cls).items():
            key = f"{scope}.{name}"
            out[key] = dataclasses.replace(dim, name=key, when={f"{scope}.{k}": v for k, v in dim.when.items()})
    return out


def arm_values(arm: ArmConfig) -> dict[str, Any]:
    """``{"scope.option": value}`` of every option of ``arm``'s plugins as the arm runs them (its
    own values over the defaults): what conditions read and what the default trial holds."""
    values: dict[str, Any] = {}
    for scope, kind in KIND.items():
        ref = getattr(arm, scope)
        if ref is None:
            continue
        cls = getattr(get_registry().get(kind, ref.name), "Options", None)
        if cls is None or not dataclasses.is_dataclass(cls):
            continue
        options = build_options(cls, ref.options, f"{scope} {ref.name!r} of arm {arm.name!r}")
        values.update({f"{scope}.{f.name}": getattr(options, f.name) for f in dataclasses.fields(cls)})
    return values


def default_point(arm: ArmConfig, space: dict[str, Dimension]) -> dict[str, Any]:
    """The arm's own values of the dimensions that apply and hold them (``gamma = "auto"`` lies
    in no int range: the default trial then runs the arm as given without that value)."""
    values = arm_values(arm)
    return {k: values[k] for k, dim in space.items() if k in values and dim.active(values) and dim.contains(values[k])}


def tuned_arm(arm: ArmConfig, point: dict[str, Any], name: str | None = None) -> ArmConfig:
    """``arm`` with the options of ``point`` set (the sweep's rule), named ``name`` (default:
    the sweep's ``arm[option=value,...]``). Invalid combinations raise ConfigError naming them."""
    if not point:
        return dataclasses.replace(arm, name=name or arm.name)
    (new,) = expand_sweep(arm, {k: [v] for k, v in point.items()}, f"tuned arm {arm.name!r}", None)
    return dataclasses.replace(new, name=name) if name else new
