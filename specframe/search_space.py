"""Search spaces that plugins declare on their options: which fields are tunable, and over what.

A plugin marks a field of its options dataclass with :func:`tunable` in place of a plain
default::

    @dataclass
    class MyOptions:
        depth: int = tunable(4, low=1, high=12)                    # an int range
        decay: float = tunable(0.9, low=0.5, high=1.0)             # a float range
        budget: int = tunable(32, low=4, high=128, log=True)       # sampled on a log scale
        mode: str = tunable("merge", choices=("merge", "gate"))    # a set of choices
        threshold: float = tunable(0.5, low=0.0, high=1.0, when={"mode": "gate"})  # a condition

The default is the field's default as before; the rest sits in the field's metadata under
:data:`SEARCH_KEY`, so options are built and checked exactly as without it
(:func:`~specframe.options.build_options`). :func:`search_space` reads a class's declared space;
:func:`draw_point` draws one point from it with any source of values (``specframe tune``
passes Optuna's trial, the conformance suite Hypothesis). The core imports neither.
"""

from __future__ import annotations

import dataclasses
import linecache
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

#: The field-metadata key that holds a field's :class:`Dimension`.
SEARCH_KEY = "search"
#: What a dimension may be.
KINDS = ("int", "float", "choice")


class SearchSpaceError(ValueError):
    """A declared search space is malformed; the message names the field and what is wrong."""


@dataclass(frozen=True)
class Dimension:
    """One tunable option: its kind and range, and when it applies.

    Attributes:
        name: the option's name (the dataclass field's).
        kind: ``int`` or ``float`` (a range ``[low, high]``, ends included) or ``choice``.
        low, high: the range's ends (numeric kinds).
        log: sample the range on a log scale (``low`` > 0).
        step: the spacing of an int range (1 by default).
        choices: the values of a ``choice`` dimension (each a TOML scalar: bool, int, float, str).
        when: ``{other option: allowed values}``: the option applies only when every named option
            has one of its allowed values (else the option keeps its current value).
    """

    name: str
    kind: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: int = 1
    choices: tuple = ()
    when: Mapping[str, tuple] = field(default_factory=dict)

    def __post_init__(self) -> None:
        where = f"search space of option {self.name!r}"
        if self.kind not in KINDS:
            raise SearchSpaceError(f"{where}: kind {self.kind!r} is not one of {KINDS}")
        if self.kind == "choice":
            if not self.choices:
                raise SearchSpaceError(f"{where}: choices must be a non-empty tuple")
            if len(set(map(repr, self.choices))) != len(self.choices):
                raise SearchSpaceError(f"{where}: choices {self.choices!r} repeat a value")
            return
        if self.low is None or self.high is None or not self.low <= self.high:
            raise SearchSpaceError(f"{where}: needs low <= high, got low={self.low!r}, high={self.high!r}")
        if self.log and self.low <= 0:
            raise SearchSpaceError(f"{where}: a log range needs low > 0, got {self.low!r}")
        if self.kind == "int" and (self.low != int(self.low) or self.high != int(self.high) or self.step < 1):
            raise SearchSpaceError(f"{where}: an int range needs int ends and step >= 1, got "
                                   f"low={self.low!r}, high={self.high!r}, step={self.step!r}")
        if self.kind == "int" and self.log and self.step != 1:
            # Optuna (and any log-uniform draw) has no grid of equal steps on a log scale.
            raise SearchSpaceError(f"{where}: an int range on a log scale takes step 1, got log=True and "
                                   f"step={self.step!r}: drop one of them")

    def active(self, values: Mapping[str, Any]) -> bool:
        """Whether the option applies given the other options' ``values``."""
        return all(values.get(other) in allowed for other, allowed in self.when.items())

    def contains(self, value: Any) -> bool:
        """Whether ``value`` lies in the dimension (the conformance suite checks draws with it)."""
        if self.kind == "choice":
            return value in self.choices
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        return self.low <= value <= self.high and (self.kind == "float" or value == int(value))

    def describe(self) -> str:
        """One short line: ``int [1, 12]``, ``float [1e-3, 1] log``, ``choice (a, b)``, ``... when x in (..)``."""
        if self.kind == "choice":
            text = f"choice {self.choices!r}"
        else:
            text = f"{self.kind} [{self.low:g}, {self.high:g}]" + (" log" if self.log else "")
            text += f" step {self.step}" if self.step != 1 else ""
        if self.when:
            text += " when " + ", ".join(f"{k} in {v!r}" for k, v in self.when.items())
        return text


def tunable(default: Any = dataclasses.MISSING, *, low: float | None = None, high: float | None = None,
            log: bool = False, step: int = 1, choices: tuple | list | None = None,
            when: Mapping[str, Any] | None = None, help: str | None = None,
            default_factory: Any = dataclasses.MISSING) -> Any:
    """A dataclass field with ``default`` that declares its search space (see the module docstring).

    The kind follows from the arguments: ``choices`` makes a choice; else an int range when
    ``low`` and ``high`` are ints (and ``default`` is no float), a float range otherwise.
    ``when`` maps another option to a value or a tuple of values. ``help`` goes to the
    metadata as for a plain field. Errors name what is malformed (the name is filled in when
    the class's space is read)."""
    if choices is not None:
        kind = "choice"
    elif isinstance(low, int) and isinstance(high, int) and not isinstance(default, float):
        kind = "int"
    else:
        kind = "float"
    conditions = {k: tuple(v) if isinstance(v, (tuple, list)) else (v,) for k, v in (when or {}).items()}
    try:
        dim = Dimension("?", kind, None if low is None else low, None if high is None else high, log, step,
                        tuple(choices or ()), conditions)
    except SearchSpaceError as err:  # refused at declaration: name the option by its line
        raise SearchSpaceError(str(err).replace("option '?'", _declaring_line())) from None
    metadata: dict[str, Any] = {SEARCH_KEY: dim}
    if help is not None:
        metadata["help"] = help
    return field(default=default, default_factory=default_factory, metadata=metadata)


def _declaring_line() -> str:
    """``option declared at FILE:LINE (`x: int = tunable(...)`)``: the caller of :func:`tunable`,
    the only place the option's name is known when the declaration is refused."""
    frame = sys._getframe(2)
    source = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
    return f"option declared at {frame.f_code.co_filename}:{frame.f_lineno} (`{source}`)"


def search_space(options_cls: type) -> dict[str, Dimension]:
    """The declared space of an options dataclass: ``{option: Dimension}`` in field order (empty
    when it declares none, or is no dataclass). A condition must name another option of the
    class; a malformed one raises :class:`SearchSpaceError` naming the class and the option."""
    if not dataclasses.is_dataclass(options_cls):
        return {}
    fields = {f.name: f for f in dataclasses.fields(options_cls)}
    out: dict[str, Dimension] = {}
    for name, f in fields.items():
        dim = f.metadata.get(SEARCH_KEY)
        if dim is None:
            continue
        dim = dataclasses.replace(dim, name=name)
        for other in dim.when:
            if other not in fields or other == name:
                raise SearchSpaceError(f"{options_cls.__name__}: option {name!r} is conditioned on {other!r}, which is "
                                       f"no other option of it; options: {', '.join(fields)}")
        out[name] = dim
    return out


#: A source of values: given a dimension, one value in it.
Draw = Callable[[Dimension], Any]


def draw_point(space: Mapping[str, Dimension], draw: Draw, base: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One point of ``space``: ``{option: value}`` for every dimension that applies.

    Dimensions are drawn in order; a condition reads the value drawn earlier, else ``base``
    (the options held as given, e.g. the arm's), else nothing (the dimension does not apply).
    An option whose conditions fail is left out, so it keeps ``base``'s value or its default."""
    values: dict[str, Any] = dict(base or {})
    point: dict[str, Any] = {}
    for name, dim in drawing_order(space):
        if not dim.active(values):
            continue
        value = draw(dim)
        if dim.kind == "int":
            value = int(value)
        elif dim.kind == "float":
            value = float(value)
        point[name] = values[name] = value
    return point


def drawing_order(space: Mapping[str, Dimension]) -> list[tuple[str, Dimension]]:
    """The dimensions with each one after those its conditions name (else in field order), so a
    condition reads the value drawn for this point, not the base's."""
    order: list[tuple[str, Dimension]] = []
    left = dict(space)
    while left:
        ready = [(n, d) for n, d in left.items() if not set(d.when) & (set(left) - {n})]
        if not ready:
            raise SearchSpaceError(f"the conditions of options {sorted(left)} form a cycle")
        order += ready
        for name, _ in ready:
            del left[name]
    return order


def describe_space(options_cls: type) -> list[tuple[str, str]]:
    """``(option, description)`` for each declared dimension (``specframe plugins`` and docs)."""
    return [(name, dim.describe()) for name, dim in search_space(options_cls).items()]

