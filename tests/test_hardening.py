"""Issue 17: every user-facing fault is one line, runs cannot share a directory, a broken plugin
is skipped, caps are visible. Each case asserts the message, the exit code and no traceback."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import specframe
from specframe import plugins
from specframe.cli import cli
from specframe.errors import PluginWarning, SpecframeWarning
from specframe.experiment import read_answers
from specframe.runlock import DirectoryInUseError, RunLock
from specframe.testing.models import tiny_model

DEMO = Path(specframe.__file__).resolve().parent / "assets" / "demo-pair"

TINY = """
name = "tiny"
max_new_tokens = {max_new}
warmup = 0
stop_at_eos = false
threads = 1

[target]
model = "random:llama"
dtype = "float32"
device = "cpu"
random = {{ vocab_size = 64, hidden = 16, layers = 1, seed = 0, max_positions = {max_positions} }}

[models.draft]
model = "{draft}"
random = {draft_random}

[drafter]
name = "model"
options = {{ model = "draft" }}

[[arm]]
baseline = "autoregressive"

[[arm]]
name = "{arm_name}"
policy = "{policy}"
policy_options = {policy_options}

[data]
path = "prompts.jsonl"
{data_extra}

[output]
dir = "out"
"""


def write_config(tmp: Path, n_prompts: int = 2, prompt_len: int = 1, **kw) -> Path:
    """A tiny random-model experiment in ``tmp`` (two arms: autoregressive and ``kw['arm_name']``)."""
    values = dict(max_new=6, max_positions=128, draft="perturbed:target", draft_random="{ noise = 0.05, seed = 1 }",
                  arm_name="chain", policy="chain", policy_options="{ gamma = 2 }", data_extra="")
    values.update(kw)
    rows = [{"question_id": i, "turns": [f"x = {i}" * prompt_len]} for i in range(n_prompts)]
    (tmp / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = tmp / "exp.toml"
    path.write_text(textwrap.dedent(TINY.format(**values)))
    return path


def assert_one_line_error(result_output: str, *fragments: str) -> str:
    """The output's ``Error:`` line (exactly one, no traceback) contains every fragment."""
    assert "Traceback" not in result_output, result_output
    errors = [line for line in result_output.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, result_output
    for fragment in fragments:
        assert fragment in errors[0], (fragment, errors[0])
    return errors[0]


def invoke(*args: str) -> "click.testing.Result":  # noqa: F821
    return CliRunner().invoke(cli, list(args))


def specframe_cli(*args: str, cwd: Path, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """The real command line in a child process (plugin loading and warnings as a user sees them)."""
    return subprocess.run([sys.executable, "-m", "specframe.cli", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout)


@pytest.fixture
def fresh_registry():
    plugins.reset_registry()
    yield
    plugins.reset_registry()


# ---------------------------------------------------------------------- 1. output directory lock
def test_two_real_runs_on_one_directory_one_refuses_and_nothing_is_duplicated(tmp_path):
    cfg = write_config(tmp_path, n_prompts=40, max_new=24)
    first = subprocess.Popen([sys.executable, "-m", "specframe.cli", "run", str(cfg), "--no-progress"],
                             cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        answers = tmp_path / "out" / "answers"
        deadline = time.time() + 120
        while time.time() < deadline and first.poll() is None and not list(answers.glob("*.jsonl")):
            time.sleep(0.1)  # the first run is computing (it holds the lock) once an answer exists
        assert first.poll() is None, first.communicate()
        second = specframe_cli("run", str(cfg), "--no-progress", cwd=tmp_path)
        assert first.poll() is None, "the first run ended before the second tried: raise n_prompts"
        first.send_signal(signal.SIGINT)
        first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert second.returncode == 1, second.stderr
    assert_one_line_error(second.stderr, "output directory in use by another specframe run", str(first.pid), "--out")
    for path in answers.glob("*.jsonl"):
        keys = [(r["arm"], r["question_id"], r["repeat"]) for r in map(json.loads, path.read_text().splitlines())]
        assert len(keys) == len(set(keys)), path


def test_lock_of_a_killed_run_is_taken_over_and_a_live_one_refuses(tmp_path):
    (tmp_path / ".specframe.lock").write_text(json.dumps({"pid": 999999, "host": "gone"}))
    with pytest.warns(SpecframeWarning, match="locked by a run that is gone.*taking the lock over"):
        lock = RunLock(tmp_path).__enter__()
    try:
        with pytest.raises(DirectoryInUseError, match=f"pid {os.getpid()}"):
            RunLock(tmp_path).__enter__()
    finally:
        lock.__exit__(None, None, None)
    assert not (tmp_path / ".specframe.lock").exists()


def _record(qid, repeat=0, arm="a"):
    return json.dumps({"arm": arm, "question_id": qid, "repeat": repeat}) + "\n"


def test_answers_are_deduplicated_with_a_warning(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text(_record(0) + _record(1) + _record(0) + _record(0, repeat=1) + _record(1))
    with pytest.warns(SpecframeWarning, match="2 duplicate answer record"):
        recs = read_answers(path)
    assert [(r["question_id"], r["repeat"]) for r in recs] == [(0, 0), (1, 0), (0, 1)]


def test_half_written_last_line_warns(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text(_record(0) + '{"arm": "a", "quest')
    with pytest.warns(SpecframeWarning, match=r"a.jsonl:2: dropped a half-written last answer record"):
        assert len(read_answers(path)) == 1
