"""The pytest plugin is registered through ``pytest11``, stays cheap to import, and its option works."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from importlib import metadata

import pytest

pytest_plugins = ["pytester"]

HEAVY = ("torch", "transformers", "hypothesis", "numpy", "matplotlib")


def test_registered_as_a_pytest11_entry_point():
    eps = [ep for ep in metadata.entry_points(group="pytest11") if ep.value == "specframe.testing.pytest_plugin"]
    assert eps, "pyproject.toml must declare [project.entry-points.pytest11] specframe = ...; re-run pip install -e ."
    assert eps[0].name == "specframe"


def test_importing_the_plugin_imports_nothing_heavy():
    code = textwrap.dedent(f"""
        import sys
        import specframe.testing.pytest_plugin
        print(sorted(m for m in {HEAVY!r} if m in sys.modules))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", f"the pytest plugin imported heavy modules: {out.stdout}"


def test_the_check_can_fail():
    """Guards the test above: the same probe sees torch once the suite itself is imported."""
    code = "import sys, specframe.testing.conformance; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


def test_examples_option_and_header(pytester):
    pytester.makepyfile(test_probe='''
        import os

        def test_env():
            assert os.environ["SPECFRAME_CONFORMANCE_EXAMPLES"] == "7"
    ''')
    result = pytester.runpytest_subprocess("--conformance-examples", "7", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["specframe conformance: 7 examples per property (2 for model-based ones)"])


def test_markers_are_registered(pytester):
    # Both markers in one pytest run (a subprocess costs seconds of imports): under
    # --strict-markers an unregistered one fails its test's collection.
    pytester.makepyfile(test_marked='''
        import pytest

        @pytest.mark.conformance
        def test_conformance_marked():
            pass

        @pytest.mark.statistical
        def test_statistical_marked():
            pass
    ''')
    result = pytester.runpytest_subprocess("--strict-markers", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)


def test_conformance_options_reach_the_plugins_that_take_them() -> None:
    from specframe.testing.conformance import conformance_classes

    classes = conformance_classes(dist="specframe", kinds=("policies",), options={"budget": "auto"})
    assert classes["TestPolicy_talon"].plugin == ("talon", {"budget": "auto"})
    assert classes["TestPolicy_static"].plugin != ("static", {"budget": "auto"})  # static takes no budget


def test_conformance_options_that_no_plugin_takes_are_refused() -> None:
    from click.testing import CliRunner

    from specframe.cli import cli

    result = CliRunner().invoke(cli, ["conformance", "--dist", "specframe", "--options", '{"bogus": 1}'])
    assert result.exit_code == 1 and "no selected plugin takes all of these keys" in result.output
    result = CliRunner().invoke(cli, ["conformance", "--options", "[1]"])
    assert result.exit_code == 1 and "must be a JSON object" in result.output
