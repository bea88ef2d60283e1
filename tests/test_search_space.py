"""Declared search spaces (specframe.search_space): declarations, conditions and draws."""

from dataclasses import dataclass

import pytest
from hypothesis import given, settings

from specframe.options import build_options
from specframe.plugins import get_registry
from specframe.search_space import SearchSpaceError, draw_point, search_space, tunable
from specframe.testing.strategies import search_points


@dataclass
class _Opts:
    depth: int = tunable(4, low=1, high=12)
    decay: float = tunable(0.9, low=0.5, high=1.0)
    budget: int = tunable(32, low=4, high=128, log=True)
    mode: str = tunable("merge", choices=("merge", "gate"))
    threshold: float = tunable(0.5, low=0.0, high=1.0, when={"mode": "gate"})
    plain: int = 3


def test_the_declared_space_lists_tunable_fields_in_order_with_their_kinds():
    space = search_space(_Opts)
    assert list(space) == ["depth", "decay", "budget", "mode", "threshold"]
    assert [d.kind for d in space.values()] == ["int", "float", "int", "choice", "float"]
    assert space["budget"].log and space["threshold"].when == {"mode": ("gate",)}
    assert _Opts().depth == 4 and build_options(_Opts, {"depth": 7}, "test").depth == 7


def test_a_condition_reads_the_value_drawn_for_the_same_point():
    space = search_space(_Opts)
    low = draw_point(space, lambda d: d.choices[1] if d.kind == "choice" else d.low)
    assert low["mode"] == "gate" and low["threshold"] == 0.0
    merge = draw_point(space, lambda d: d.choices[0] if d.kind == "choice" else d.low)
    assert "threshold" not in merge  # it applies only to the gate


@settings(max_examples=50, deadline=None)
@given(point=search_points(_Opts))
def test_every_drawn_point_lies_in_its_dimensions(point):
    space = search_space(_Opts)
    assert all(space[k].contains(v) for k, v in point.items())
    assert ("threshold" in point) == (point["mode"] == "gate")


@pytest.mark.parametrize("kwargs, message", [
    ({"low": 5, "high": 1}, "low <= high"),
    ({"low": 0, "high": 4, "log": True}, "low > 0"),
    ({"choices": ()}, "non-empty"),
    ({"choices": (1, 1)}, "repeat"),
])
def test_malformed_declarations_are_refused_naming_the_problem(kwargs, message):
    with pytest.raises(SearchSpaceError, match=message):
        @dataclass
        class Bad:
            x: int = tunable(2, **kwargs)


def test_a_condition_on_an_unknown_option_names_it_and_the_valid_ones():
    @dataclass
    class Bad:
        x: int = tunable(2, low=1, high=3, when={"nope": 1})

    with pytest.raises(SearchSpaceError, match="'nope'.*options: x"):
        search_space(Bad)


@pytest.mark.parametrize("kind, name", [("policies", "talon"), ("policies", "chain"), ("drafters", "suffix"),
                                        ("drafters", "ngram"), ("verifiers", "typical")])
def test_built_ins_declare_their_spaces_and_defaults_lie_in_them(kind, name):
    options_cls = get_registry().get(kind, name).Options
    space = search_space(options_cls)
    assert space, f"{kind} {name!r} declares no search space"
    defaults = options_cls()
    for option, dim in space.items():
        assert dim.contains(getattr(defaults, option)), f"{name}.{option}'s default lies outside {dim.describe()}"
