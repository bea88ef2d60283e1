"""The conformance suite: the property tests every tree policy, drafter and verifier must pass.

Subclass one class per plugin, name the subclass ``Test...`` and set the plugin under test::

    from specframe.testing.conformance import TreePolicyConformance

    class TestWideTree(TreePolicyConformance):
        plugin = ("widetree", {"width": 4})      # or just "widetree"

pytest then runs every property below against it. The same classes check specframe's own
plugins (``tests/test_conformance_builtins.py``) and back ``specframe conformance --dist NAME``.

Class attributes and hooks:

* ``plugin``: the registered name, or ``(name, options)``.
* ``expected_failures = {"test_name": "reason"}``: known deviations. Each listed test runs as
  ``xfail(strict=True)`` with the reason, so it is reported, and an unexpected pass fails.
  Naming a test that does not exist is an error (a typo never hides a failure).
* ``make_policy(self)``, ``make_drafter(self, target)``, ``make_verifier(self, spec)``: override
  when the plugin needs construction arguments (``target`` is a
  :class:`~specframe.models.target.TargetModel` over the suite's tiny float64 model).

Hypothesis sizing: every property runs ``$SPECFRAME_CONFORMANCE_EXAMPLES`` examples, default
the count of the ``$HYPOTHESIS_PROFILE`` profile (default 10, ci 30, thorough 200; see
:mod:`specframe.testing.profiles`); model-based properties run a third of that (at least 2).
The counts are fixed when the package is imported, so the user's own Hypothesis profile never
makes the suite slow.

One module per plugin kind (:mod:`.policies`, :mod:`.drafters`, :mod:`.verifiers`) beside the
shared :mod:`.base`; every name a test module imports comes from here.
"""

from __future__ import annotations

import re
from typing import Any, Iterable

from specframe.options import takes_options
from specframe.testing import fixtures as fx
from specframe.testing.conformance.base import Conformance, suite_examples
from specframe.testing.conformance.drafters import DrafterConformance
from specframe.testing.conformance.policies import TreePolicyConformance
from specframe.testing.conformance.verifiers import VerifierConformance
from specframe.testing.distribution import chi_square_pvalue, emitted_distribution

__all__ = [
    "Conformance", "DrafterConformance", "TreePolicyConformance", "VerifierConformance", "conformance_classes",
    "emitted_distribution", "chi_square_pvalue", "suite_examples",
]


_BASES = {"policies": TreePolicyConformance, "drafters": DrafterConformance, "verifiers": VerifierConformance}
_PREFIX = {"policies": "Policy", "drafters": "Drafter", "verifiers": "Verifier"}


def conformance_classes(dist: str | None = None, module: str | None = None,
                        kinds: Iterable[str] = ("policies", "drafters", "verifiers"),
                        options: dict | None = None) -> dict[str, type]:
    """One ``Test<Kind>_<name>`` conformance class per registered plugin (of ``dist`` if given).

    ``specframe conformance`` and specframe's own tests use this: put the result in a test
    module's namespace (``globals().update(conformance_classes("my-dist", __name__))``).
    specframe's built-ins get their settings from :data:`fixtures.BUILTIN_SETTINGS`.
    ``options``: plugin options (e.g. ``{"budget": "auto"}``) for every plugin whose options
    take all of these keys (:func:`specframe.options.takes_options`), over its own settings; the others keep theirs.
    """
    from specframe.plugins import SINGULAR, get_registry, normalise_dist

    registry = get_registry()
    classes: dict[str, type] = {}
    for kind in kinds:
        for info in registry.infos(kind):
            if dist is not None and normalise_dist(info.dist) != normalise_dist(dist):
                continue
            attrs: dict[str, Any] = {"plugin": info.name, "__module__": module or __name__,
                                     "__doc__": f"Conformance of {SINGULAR[kind]} "
                                                f"{info.name!r} from {info.dist}."}
            if normalise_dist(info.dist) == "specframe":
                attrs.update(fx.BUILTIN_SETTINGS.get((kind, info.name), {}))
            if options and takes_options(info.cls.Options, options):
                own = attrs["plugin"][1] if isinstance(attrs["plugin"], tuple) else {}
                attrs["plugin"] = (info.name, {**own, **options})
            name = f"Test{_PREFIX[kind]}_{re.sub(r'[^0-9A-Za-z_]', '_', info.name)}"
            classes[name] = type(name, (_BASES[kind],), attrs)
    return classes
