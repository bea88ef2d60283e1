"""The suite holds on a plugin author's machine: with a third party's policy installed, the tests
about specframe's built-ins leave it out, and the tests of a property every policy must have take
it in, at the options its own declared defaults give.

The plugin is a throw-away distribution (dist-info + module) on ``PYTHONPATH`` of a pytest
subprocess that collects the suite's enumerating modules, so nothing depends on which plugins the
environment running this test happens to hold (the tutorial's ``widetree``, or none).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from specframe import plugins
from specframe.testing.conformance import conformance_classes
from specframe.testing.fixtures import fixed_policy_spec, is_builtin
from plugin_sources import install_distribution

TESTS = Path(__file__).resolve().parent
NAME = "third-step"

#: Test functions that enumerate specframe's own plugins: a third party's must not appear.
BUILTIN_ONLY = [
    "test_engines.py::test_every_builtin_exports_with_a_statement_and_only_the_engines_names",
    "test_batch.py::test_one_sequence_takes_the_recorded_steps",
    "test_batch.py::test_batch_equals_greedy_alone_for_every_drafter",
    "test_conformance_builtins.py::TestPolicy_",
]
#: Test functions that must hold for every policy: a third party's appears among their cases.
EVERY_POLICY = [
    "test_lossless.py::test_greedy_output_equals_generate",
    "test_ngram.py::test_lossless_with_every_policy",
    "test_suffix.py::test_lossless_with_every_policy",
    "test_cascade.py::test_a_cascade_is_lossless_under_every_policy",
    "test_datastore.py::test_every_policy_with_a_datastore_is_lossless",
    "test_medusa.py::test_medusa_is_lossless_under_every_policy",
    "test_batch.py::test_batch_equals_greedy_alone_for_every_policy",
    "test_batch.py::test_every_policy_with_every_drafter_equals_greedy_alone",
    "test_batch_draft.py::test_batched_drafting_equals_each_sequence_alone",
    "test_architectures.py::",
    "test_sampling_distribution.py::test_verifier_keeps_the_target_distribution",
]


def _install(root: Path) -> Path:
    """The throw-away distribution in ``root`` (importable once ``root`` is on the path)."""
    return install_distribution(root, NAME, "third-step-dist", "0.1", "third_step_plugin", "thirdstep")


@pytest.fixture
def installed(tmp_path: Path, monkeypatch) -> Path:
    """The plugin installed for this process (fresh registry) and for its subprocesses."""
    root = _install(tmp_path)
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    plugins.reset_registry()
    yield root
    plugins.reset_registry()


def _collected(files: set[str], *args: str) -> list[str]:
    """Node ids that pytest collects (or runs, with ``args``) from ``files`` in a subprocess."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", *args,
         *sorted(str(TESTS / f) for f in files)],
        capture_output=True, text=True, cwd=TESTS.parent, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return [line.strip() for line in proc.stdout.splitlines() if "::" in line]


def test_the_fixtures_give_a_third_party_its_own_defaults(installed):
    assert not is_builtin("policies", NAME) and is_builtin("policies", "talon")
    assert fixed_policy_spec(NAME) == NAME  # its default budget (2), not the built-ins' 6
    assert fixed_policy_spec("talon") == ("talon", {"budget": 6})
    assert "TestPolicy_third_step" not in conformance_classes(dist="specframe")
    assert "TestPolicy_third_step" in conformance_classes()


def test_builtin_enumerations_leave_it_out_and_every_policy_ones_take_it_in(installed):
    ids = _collected({case.split("::")[0] for case in BUILTIN_ONLY + EVERY_POLICY}, "--collect-only")
    assert ids, "nothing collected"
    for case in BUILTIN_ONLY:
        mine = [i for i in ids if i.startswith(f"tests/{case}")]
        assert mine, f"{case} collected nothing"
        assert not [i for i in mine if NAME in i or "third_step" in i], f"{case} enumerates a third party's policy"
    for case in EVERY_POLICY:
        assert any(i.startswith(f"tests/{case}") and NAME in i for i in ids), f"{case} leaves out {NAME}"


def test_an_every_policy_test_passes_for_it_at_its_defaults(installed):
    ran = _collected({"test_ngram.py", "test_medusa.py"}, "-k", NAME, "-rA")
    passed = [line for line in ran if line.startswith("PASSED") and NAME in line]
    assert len(passed) == 2, ran
