"""The conformance suite's shared base: example counts, the plugin spec, declared search-space
points and :class:`Conformance` (the plugin under test, declared deviations, torch threads)."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, ClassVar, Iterator

import pytest
import torch
from hypothesis import HealthCheck, settings

from specframe.plugins import get_registry
from specframe.search_space import search_space
from specframe.testing import fixtures as fx
from specframe.testing.profiles import profile_examples
from specframe.testing.strategies import search_points


def suite_examples() -> int:
    """Examples per property: ``$SPECFRAME_CONFORMANCE_EXAMPLES``, else the profile's count."""
    raw = os.environ.get("SPECFRAME_CONFORMANCE_EXAMPLES", "").strip()
    return max(1, int(raw)) if raw else profile_examples()


# differing_executors: the same test function runs on many subclasses by design.
_HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.differing_executors]
#: Settings of the cheap (model-free) properties.
FAST = settings(max_examples=suite_examples(), deadline=None, suppress_health_check=_HEALTH)
#: Settings of the properties that run transformers models.
MODEL = settings(max_examples=max(2, suite_examples() // 3), deadline=None, suppress_health_check=_HEALTH)

VOCAB = fx.VOCAB


def split_spec(spec: Any, owner: type, attr: str = "plugin") -> Any:
    """Check a plugin spec (name or (name, options)) and return it; the error says what to set."""
    if isinstance(spec, str) or (
        isinstance(spec, (tuple, list)) and len(spec) == 2 and isinstance(spec[0], str) and isinstance(spec[1], dict)
    ):
        return spec
    raise TypeError(
        f"{owner.__name__}.{attr} must be a registered name or (name, {{options}}), got {spec!r}; "
        f"set e.g. `{attr} = \"my-plugin\"` on the class"
    )


_NOUN = {"policies": "policy", "drafters": "drafter", "verifiers": "verifier"}


def declared_point(kind: str, spec: Any, owner: type, data: Any) -> tuple[str, dict, dict]:
    """``(name, options, point)``: a point drawn (Hypothesis ``data``) from the search space the
    plugin ``spec`` declares on its options (:mod:`specframe.search_space`), laid over the
    spec's own options; each drawn value must lie in its dimension. A plugin that declares no
    tunable option skips the property, saying so."""
    spec = split_spec(spec, owner)
    name, options = (spec, {}) if isinstance(spec, str) else (spec[0], dict(spec[1]))
    space = search_space(getattr(get_registry().get(kind, name), "Options", None))
    if not space:
        pytest.skip(f"{_NOUN[kind]} {name!r} declares no search space (no tunable option)")
    point = data.draw(search_points(get_registry().get(kind, name).Options, options), label="point")
    outside = {k: v for k, v in point.items() if not space[k].contains(v)}
    assert not outside, f"drawn values {outside} lie outside their declared dimensions"
    return name, {**options, **point}, point


class Conformance:
    """Shared machinery: the plugin under test and declared deviations."""

    #: The plugin under test: a registered name or ``(name, options)``.
    plugin: ClassVar[Any] = None
    #: Known deviations ``{test_name: reason}``, run as strict xfails (never silently skipped).
    expected_failures: ClassVar[dict[str, str]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        declared = dict(cls.expected_failures)
        tests = sorted(name for name in dir(cls) if name.startswith("test_"))
        unknown = sorted(set(declared) - set(tests))
        if unknown:
            raise TypeError(
                f"{cls.__name__}.expected_failures names unknown test(s) {unknown}; "
                f"the suite's tests are: {', '.join(tests)}"
            )
        empty = sorted(name for name, reason in declared.items() if not isinstance(reason, str) or not reason.strip())
        if empty:
            raise TypeError(f"{cls.__name__}.expected_failures: give a reason for {empty}")

    #: torch intra-op threads during each test (None leaves torch's setting alone). The suite's
    #: models are tiny, so more threads only add synchronisation overhead (5x slower on a
    #: loaded 2-core machine).
    threads: ClassVar[int | None] = 1

    @pytest.fixture(autouse=True)
    def _torch_threads(self) -> Iterator[None]:
        """Run each test with ``threads`` torch threads, restoring the setting afterwards."""
        before = torch.get_num_threads()
        if self.threads is not None:
            torch.set_num_threads(self.threads)
        try:
            yield
        finally:
            torch.set_num_threads(before)

    @pytest.fixture(autouse=True)
    def _declared_deviation(self, request: pytest.FixtureRequest) -> None:
        """Turn a declared deviation into ``xfail(strict=True)``: reported, and an unexpected pass fails."""
        reason = self.expected_failures.get(getattr(request.node, "originalname", request.node.name))
        if reason:
            request.applymarker(pytest.mark.xfail(reason=f"declared deviation: {reason}", strict=True))


def options_text(plugin: Any) -> str:
    """``budget=60, mu=0.03``: a plugin's option values, for messages."""
    opts = getattr(plugin, "options", None)
    if opts is None or not dataclasses.is_dataclass(opts):
        return "default options"
    return ", ".join(f"{f.name}={getattr(opts, f.name)!r}" for f in dataclasses.fields(opts))
