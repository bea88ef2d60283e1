"""Typed plugin options: every plugin declares a dataclass, and user dicts are checked against it.

Errors name the bad key or value and list the valid ones, because a researcher editing a TOML
file should never have to read plugin source to find the option's name.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path, PurePath
from typing import Any, Mapping

from specframe.search_space import tunable


class OptionError(ValueError):
    """An option is unknown, ill-typed or out of range; the message names it."""


@dataclasses.dataclass
class NoOptions:
    """Options of a plugin that takes none."""


@dataclasses.dataclass
class BudgetOptions:
    """Base of a tree policy's options: the node budget, declared and checked once.

    Inherit it and :class:`~specframe.TreePolicy` reads the policy's largest tree
    (:attr:`~specframe.TreePolicy.max_budget`) from ``budget``; a subclass may redeclare the
    field to change its default (``budget: int = 32``). A subclass with its own
    ``__post_init__`` calls ``super().__post_init__()`` so the budget stays checked.

    Attributes:
        budget: N, the largest tree the policy builds, root included (N = 60: at most 59
            drafted nodes; EAGLE's ``total_token``).
    """

    budget: int = tunable(60, low=2, high=64, log=True)

    def __post_init__(self) -> None:
        require(isinstance(self.budget, int) and self.budget >= 2, "budget",
                f"must be an int >= 2 (the root counts), got {self.budget!r}")


def _allowed_types(hint: Any) -> tuple[type, ...] | None:
    """The runtime types a type hint admits, or None when it cannot be checked simply."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        out: list[type] = []
        for arg in typing.get_args(hint):
            sub = _allowed_types(arg)
            if sub is None:
                return None
            out.extend(sub)
        return tuple(out)
    if hint is Any:
        return None
    if origin is not None:
        return (origin,) if isinstance(origin, type) else None
    if hint is type(None):
        return (type(None),)
    return (hint,) if isinstance(hint, type) else None


def _coerce(value: Any, allowed: tuple[type, ...]) -> Any:
    """Accept ints for floats, lists for tuples and strings for paths (TOML has neither);
    reject bools as numbers."""
    if isinstance(value, str) and str not in allowed and any(issubclass(t, PurePath) for t in allowed):
        return Path(value)
    if isinstance(value, bool):
        return value if bool in allowed else _Reject
    if isinstance(value, int) and int not in allowed and float in allowed:
        return float(value)
    if isinstance(value, list) and tuple in allowed and list not in allowed:
        return tuple(value)
    return value if isinstance(value, allowed) else _Reject


class _Reject:
    pass


def build_options(options_cls: type, values: Mapping[str, Any] | None, owner: str, noun: str = "option") -> Any:
    """Instantiate ``options_cls`` from ``values``, checking names and types.

    Args:
        options_cls: the plugin's options dataclass (or any dataclass of user-written values,
            e.g. a table of an experiment file). A field without a default is required; its
            ``metadata["help"]`` says what to give.
        values: user-supplied options (may be None).
        owner: what the options belong to, used in messages (e.g. ``policy 'talon'``).
        noun: what one value is called in messages (``option``; ``key`` for file tables).
    """
    values = dict(values or {})
    fields = {f.name: f for f in dataclasses.fields(options_cls) if f.init}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        valid = ", ".join(sorted(fields)) or "(none)"
        raise OptionError(f"unknown {noun}(s) {unknown} for {owner}; valid {noun}s: {valid}")
    for name, f in fields.items():
        if name not in values and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            help_text = f.metadata.get("help")
            raise OptionError(f"{owner}: {noun} {name!r} is required" + (f" ({help_text})" if help_text else ""))
    hints = typing.get_type_hints(options_cls)
    for key, value in list(values.items()):
        allowed = _allowed_types(hints.get(key, Any))
        if allowed is None:
            continue
        coerced = _coerce(value, allowed)
        if coerced is _Reject:
            names = " | ".join("str (a path)" if issubclass(t, PurePath) else t.__name__ for t in allowed)
            raise OptionError(
                f"{noun} {key!r} of {owner} must be {names}, got {type(value).__name__} {value!r}"
            )
        values[key] = coerced
    try:
        return options_cls(**values)
    except (ValueError, TypeError) as err:
        raise OptionError(f"{owner}: {err}") from err


def require(condition: bool, option: str, message: str) -> None:
    """Raise :class:`OptionError` naming ``option`` unless ``condition`` holds (for __post_init__)."""
    if not condition:
        raise OptionError(f"option {option!r} {message}")


def describe_options(options_cls: type) -> list[tuple[str, str, Any]]:
    """``(name, type, default)`` for each option, for ``specframe plugins`` and docs."""
    hints = typing.get_type_hints(options_cls)
    out = []
    for f in dataclasses.fields(options_cls):
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            default = f.default_factory()  # type: ignore[misc]
        else:
            default = "(required)"
        hint = hints.get(f.name, Any)
        out.append((f.name, getattr(hint, "__name__", str(hint)).replace("typing.", ""), default))
    return out


def takes_options(options_cls: type, keys: Mapping[str, Any]) -> bool:
    """True when the options dataclass ``options_cls`` has every key of ``keys``."""
    names = {f.name for f in dataclasses.fields(options_cls)} if dataclasses.is_dataclass(options_cls) else set()
    return set(keys) <= names
