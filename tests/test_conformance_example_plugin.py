"""The tutorial's example plugin (docs/examples/specframe-widetree) works as the docs say: it
pip-installs, `specframe plugins` lists it, `specframe conformance --dist specframe-widetree`
passes, and its experiment TOML runs losslessly.

The package is installed with ``pip install --target`` into a temporary directory put on
``sys.path`` (offline, no build isolation, nothing left in the environment afterwards).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from specframe import plugins
from specframe.cli import cli

EXAMPLE = Path(__file__).resolve().parent.parent / "docs" / "examples" / "specframe-widetree"


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The example installed into a fresh directory (built from a copy: the docs tree stays clean)."""
    root = tmp_path_factory.mktemp("widetree")
    source = shutil.copytree(EXAMPLE, root / "src", ignore=shutil.ignore_patterns("runs", "*.egg-info", "build"))
    target = root / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
         "--disable-pip-version-check", "--quiet", "--target", str(target), str(source)],
        capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert list(target.glob("specframe_widetree-*.dist-info")), "pip installed no dist-info"
    return target


@pytest.fixture
def on_path(installed, monkeypatch):
    """The installed example importable and its entry point visible, with a fresh registry."""
    monkeypatch.syspath_prepend(str(installed))
    plugins.reset_registry()
    yield installed
    plugins.reset_registry()


def test_listed_by_specframe_plugins(on_path):
    result = CliRunner().invoke(cli, ["plugins"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if "widetree" in line)
    assert "specframe-widetree" in row and "0.1.0" in row and "width" in row, row


def test_conformance_command_passes(on_path, monkeypatch, capfd):
    monkeypatch.setenv("SPECFRAME_CONFORMANCE_EXAMPLES", "4")
    result = CliRunner().invoke(cli, ["conformance", "--dist", "specframe-widetree"])
    out = capfd.readouterr().out  # pytest runs in a child process writing to the real stdout
    assert result.exit_code == 0, result.output + out
    assert "policy widetree" in result.output
    assert " passed" in out and "failed" not in out and "error" not in out, out


def test_conformance_command_refuses_an_unknown_distribution(on_path):
    result = CliRunner().invoke(cli, ["conformance", "--dist", "no-such-dist"])
    assert result.exit_code == 1
    assert "no-such-dist" in result.output and "specframe-widetree" in result.output


def test_usable_in_the_tutorial_experiment(on_path, tmp_path):
    result = CliRunner().invoke(
        cli, ["run", str(EXAMPLE / "widetree.toml"), "--out", str(tmp_path / "run"), "--no-progress"],
        env={"COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    arms = {arm["name"]: arm["overall"] for arm in summary["arms"]}
    assert {"widetree[width=2]", "widetree[width=8]", "talon"} <= set(arms), sorted(arms)
    for name in ("widetree[width=2]", "widetree[width=8]"):
        assert arms[name]["mismatches"] == 0 and arms[name]["compared"] == 3, (name, arms[name])


def test_auto_sized_through_the_public_route_passes_the_suite(on_path, tmp_path):
    """The tutorial's policy auto-sized as section 6 shows (budget = "auto", no private import):
    its own conformance class passes in a child pytest: lossless, within budget, and the sizer's
    invariants (the three properties an auto-sized policy adds to watch; the rest run above)."""
    tests = EXAMPLE / "tests" / "test_widetree_conformance.py"
    assert "specframe.strategies" not in (on_path / "specframe_widetree" / "__init__.py").read_text()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--conformance-examples", "3",
         f"{tests}::TestAutoWideTree", "-k", "auto_sized or within_budget or greedy_output"],
        capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(on_path)},
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "3 passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-2000:]


def test_auto_sized_widetree_decodes_losslessly_within_max_budget(on_path):
    from specframe import SpecDecoder
    from specframe.testing import fixtures

    target = fixtures.tiny_target()  # float64: greedy equality is exact
    dec = SpecDecoder.build(target=target, drafter=("model", {"model": fixtures.close_draft(target)}),
                            policy=("widetree", {"budget": "auto", "max_budget": 16, "width": 4}), strict=True)
    greedy = target.generate(torch.tensor([[5, 6, 7, 8]]), max_new_tokens=32, do_sample=False)[0, 4:].tolist()
    out = dec.generate([5, 6, 7, 8], max_new_tokens=32, eos_token_id=None)
    assert out.tokens == greedy
    sizes = [step.tree_size for step in out.steps]
    assert max(sizes) <= 16 and out.tau > 1.0, sizes
