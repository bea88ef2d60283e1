"""pytest plugin ``specframe`` (``pytest11`` entry point): what a plugin author's test run needs.

Loaded by every pytest run in an environment where specframe is installed, so it imports
nothing heavy: no torch, no transformers, no hypothesis (the conformance classes in
:mod:`specframe.testing.conformance` import those when a test module imports them).

It provides:

* the markers ``statistical`` (slow distribution tests) and ``conformance`` (added to every
  test of a conformance class, so ``-m conformance`` / ``-m "not conformance"`` select them);
* ``--conformance-examples N``: Hypothesis examples per conformance property (same as
  ``SPECFRAME_CONFORMANCE_EXAMPLES=N``);
* strict mode for every decoder the tests build: ``SPECFRAME_STRICT=1`` for the run, unless
  the environment already sets it (``SPECFRAME_STRICT=0 pytest`` runs the engine as users do),
  so each tree is checked in full before the target runs (``SpecDecoder(strict=...)``);
* the fixtures of :mod:`specframe.testing.fixtures` (``specframe_tiny_target``,
  ``specframe_target_model``, ``specframe_close_draft``, ``specframe_synthetic_drafter``);
* a report-header line saying how many examples each property runs.
"""

from __future__ import annotations

import os
from typing import Any

from specframe.testing.fixtures import (  # noqa: F401  (re-exported as fixtures)
    specframe_close_draft, specframe_synthetic_drafter, specframe_target_model, specframe_tiny_target,
)

EXAMPLES_VARIABLE = "SPECFRAME_CONFORMANCE_EXAMPLES"
#: ``specframe.decode.contract.STRICT_VARIABLE``, spelled out: importing the core would import torch.
STRICT_VARIABLE = "SPECFRAME_STRICT"


def pytest_addoption(parser: Any) -> None:
    """``--conformance-examples N``."""
    group = parser.getgroup("specframe", "specframe conformance suite")
    group.addoption("--conformance-examples", type=int, default=None, metavar="N",
                    help=f"Hypothesis examples per conformance property (default: ${EXAMPLES_VARIABLE}, "
                         "else 10 / 30 / 200 for HYPOTHESIS_PROFILE default / ci / thorough)")


def pytest_configure(config: Any) -> None:
    """Register the markers; export ``--conformance-examples`` before test modules import the
    suite, and strict mode before any test builds a decoder."""
    if STRICT_VARIABLE not in os.environ:
        config._specframe_set_strict = True
        os.environ[STRICT_VARIABLE] = "1"
    config.addinivalue_line("markers", "statistical: slow distribution tests of verifiers")
    config.addinivalue_line("markers", "conformance: a property of the specframe conformance suite")
    examples = config.getoption("conformance_examples", None)
    if examples is not None:
        config._specframe_saved_examples = os.environ.get(EXAMPLES_VARIABLE)
        os.environ[EXAMPLES_VARIABLE] = str(max(1, int(examples)))


def pytest_unconfigure(config: Any) -> None:
    """Restore the environment changed by ``--conformance-examples`` and strict mode."""
    if getattr(config, "_specframe_set_strict", False):
        os.environ.pop(STRICT_VARIABLE, None)
    if hasattr(config, "_specframe_saved_examples"):
        saved = config._specframe_saved_examples
        if saved is None:
            os.environ.pop(EXAMPLES_VARIABLE, None)
        else:
            os.environ[EXAMPLES_VARIABLE] = saved


def pytest_report_header(config: Any) -> str:
    """One line: how many examples each conformance property runs."""
    from specframe.testing.profiles import profile_examples

    raw = os.environ.get(EXAMPLES_VARIABLE, "").strip()
    examples = max(1, int(raw)) if raw else profile_examples()
    return f"specframe conformance: {examples} examples per property ({max(2, examples // 3)} for model-based ones)"


def pytest_collection_modifyitems(items: list[Any]) -> None:
    """Mark the tests of conformance classes ``conformance``."""
    import sys

    module = sys.modules.get("specframe.testing.conformance")
    if module is None:  # no test imported the suite
        return
    import pytest

    base = module.Conformance
    for item in items:
        cls = getattr(item, "cls", None)
        if cls is not None and issubclass(cls, base):
            item.add_marker(pytest.mark.conformance)
