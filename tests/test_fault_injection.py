"""Fault injection through the real command line, on the tiny pair: nothing stale is reported,
nothing finished is lost, and every configuration is there exactly once after a rerun.

Each case runs ``specframe`` in a process of its own as a user would (edits files between runs,
kills the process with SIGKILL) and then reads the run directory, trace or sweep directory back.
The processes are forked from a server that has already imported torch and transformers
(tests/cli_processes.py): a fresh interpreter would spend most of each command importing them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import cli_processes
from specframe.experiments.runs import RunDir, read_answers
from specframe.testing.fixtures import tiny_experiment_toml

CONFIG = tiny_experiment_toml("faults", 8)

SWEEP = """
base = "exp.toml"
arms = ["talon"]
chunk = 2
[grid]
"policy.budget" = [3, 4, 5, 6]
"policy.mu" = [0.01, 0.1]
"""

ARMS = ("autoregressive", "talon", "ngram+chain")
#: One thread each, and no hub: a missing model fails at once instead of after retries.
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
PROMPTS = [f"ab ab ab {i} ab ab ab" for i in range(4)]


def specframe(*args: str | Path, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    """Run the real CLI in a process of its own; ``check``: fail the test on a non-zero exit."""
    plots = ("--no-plots",) if args[0] == "run" else ()  # the figures would be most of a run's time
    done = cli_processes.run(*args, "--no-progress", *plots, cwd=cwd, env=ENV, timeout=300)
    if check:
        assert done.returncode == 0, done.stdout + done.stderr
    return done


def write_prompts(path: Path, prompts: list[str]) -> None:
    path.write_text("".join(json.dumps({"question_id": i, "category": "ab", "turns": [p]}) + "\n"
                            for i, p in enumerate(prompts)))


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """An experiment file, its prompts and a trace recorded once."""
    tmp = tmp_path_factory.mktemp("faults")
    write_prompts(tmp / "prompts.jsonl", PROMPTS)
    (tmp / "exp.toml").write_text(textwrap.dedent(CONFIG))
    (tmp / "sweep.toml").write_text(textwrap.dedent(SWEEP))
    specframe("record", "exp.toml", "--out", "trace", cwd=tmp)
    return tmp


def keys(run_dir: Path, arm: str) -> list[tuple]:
    """Every (question, repeat) answered by ``arm``, duplicates kept."""
    path = RunDir(run_dir).answers(arm)
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
    return sorted((r["question_id"], r["repeat"]) for r in lines)


def exactly_once(run_dir: Path, questions: int) -> None:
    for arm in ARMS:
        assert keys(run_dir, arm) == [(q, 0) for q in range(questions)], arm


def copy_case(project: Path, name: str) -> Path:
    """A directory of its own with the experiment (the prompts may then be edited there)."""
    case = project / name
    case.mkdir()
    (case / "exp.toml").write_text((project / "exp.toml").read_text())
    (case / "prompts.jsonl").write_text((project / "prompts.jsonl").read_text())
    return case


# ---------------------------------------------------------------------- data
def test_an_edited_prompt_is_refused_and_fresh_recomputes_it(project) -> None:
    case = copy_case(project, "edited")
    specframe("run", "exp.toml", "--out", "out", cwd=case)
    before = {arm: RunDir(case / "out").answers(arm).read_bytes() for arm in ARMS}
    write_prompts(case / "prompts.jsonl", [PROMPTS[0], "ab ab ab 1 ab ba ab", *PROMPTS[2:]])  # a typo fixed
    done = specframe("run", "exp.toml", "--out", "out", cwd=case, check=False)
    assert done.returncode == 1
    assert "edited: questions 1" in done.stderr and "--fresh" in done.stderr
    assert {arm: RunDir(case / "out").answers(arm).read_bytes() for arm in ARMS} == before, "answers were touched"
    inputs = json.loads((case / "out" / "run.json").read_text())["inputs"]
    specframe("run", "exp.toml", "--out", "out", "--fresh", cwd=case)
    exactly_once(case / "out", 4)
    now = json.loads((case / "out" / "run.json").read_text())["inputs"]
    assert [q for q in inputs if inputs[q] != now[q]] == ["1"], "run.json does not tie the answers to the new text"


def test_an_added_prompt_is_computed_alone_and_a_removed_one_refused(project) -> None:
    case = copy_case(project, "added")
    specframe("run", "exp.toml", "--out", "out", cwd=case)
    write_prompts(case / "prompts.jsonl", [*PROMPTS, "ab ab ab new ab ab"])
    done = specframe("run", "exp.toml", "--out", "out", cwd=case)
    assert "3 answers computed, 12 reused" in " ".join(done.stdout.split()), done.stdout
    exactly_once(case / "out", 5)
    write_prompts(case / "prompts.jsonl", PROMPTS[:3])
    done = specframe("run", "exp.toml", "--out", "out", cwd=case, check=False)
    assert done.returncode == 1 and "no longer in the data: questions 3, 4" in done.stderr
    exactly_once(case / "out", 5)


# ---------------------------------------------------------------------- replay
def test_another_curve_is_refused_then_recomputed(project) -> None:
    case = copy_case(project, "curve")
    specframe("run", "exp.toml", "--replay", project / "trace", "--out", "rep", cwd=case)
    curve = json.loads((project / "trace" / "curve.json").read_text())
    curve["seconds"] = [[2 * t for t in row] for row in curve["seconds"]]  # a machine twice as slow
    (case / "slow.json").write_text(json.dumps(curve))
    done = specframe("run", "exp.toml", "--replay", project / "trace", "--curve", "slow.json", "--out", "rep",
                     cwd=case, check=False)
    assert done.returncode == 1 and "another curve" in done.stderr
    walls = _walls(case / "rep")
    specframe("run", "exp.toml", "--replay", project / "trace", "--curve", "slow.json", "--out", "rep", "--fresh",
              cwd=case)
    exactly_once(case / "rep", 4)
    assert _walls(case / "rep") != walls, "the projected times did not follow the new curve"
    meta = json.loads((case / "rep" / "run.json").read_text())
    assert "slow.json" in meta["replay"]["curve"]


def test_a_rerecorded_trace_is_refused(project) -> None:
    case = copy_case(project, "rerecorded")
    shutil.copytree(project / "trace", case / "trace")
    specframe("run", "exp.toml", "--replay", "trace", "--out", "rep", cwd=case)
    specframe("record", "exp.toml", "--out", "trace", "--fresh", cwd=case)  # new timings: another trace
    done = specframe("run", "exp.toml", "--replay", "trace", "--out", "rep", cwd=case, check=False)
    assert done.returncode == 1 and "another trace" in done.stderr
    exactly_once(case / "rep", 4)


def test_live_and_replayed_answers_never_share_a_directory(project) -> None:
    case = copy_case(project, "modes")
    specframe("run", "exp.toml", "--out", "live", cwd=case)
    specframe("run", "exp.toml", "--replay", project / "trace", "--out", "rep", cwd=case)
    into_replay = specframe("run", "exp.toml", "--out", "rep", cwd=case, check=False)
    assert into_replay.returncode == 1 and "replayed answers" in into_replay.stderr
    into_live = specframe("run", "exp.toml", "--replay", project / "trace", "--out", "live", cwd=case, check=False)
    assert into_live.returncode == 1 and "live answers" in into_live.stderr
    assert "replay" in json.loads((case / "rep" / "run.json").read_text())
    assert "replay" not in json.loads((case / "live" / "run.json").read_text())
    exactly_once(case / "live", 4)
    exactly_once(case / "rep", 4)


def _walls(run_dir: Path) -> dict:
    return {(r["question_id"], r["repeat"]): r["choices"][0]["wall_time"]
            for r in read_answers(RunDir(run_dir).answers("talon"))}


# ---------------------------------------------------------------------- kill -9
def _kill_after(cmd: list[str], cwd: Path, seconds: float) -> int:
    """Start ``specframe CMD``, SIGKILL it after ``seconds`` (if still running); its exit code."""
    proc = cli_processes.start(*cmd, cwd=cwd, env=ENV)
    try:
        return proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


# A forked command starts at once (cli_processes): the delays span the recording's ~4 s on a
# loaded 2-core machine, so most kills land mid-recording and some after its end.
@settings(max_examples=3, deadline=None)
@given(delay=st.floats(min_value=0.2, max_value=5.0))
def test_a_killed_record_leaves_the_old_trace_whole(project, delay: float) -> None:
    from specframe.replay.record import clear_stale_temporaries
    from specframe.replay.trace import Trace

    case = project / f"killrec-{time.monotonic_ns()}"
    case.mkdir()
    for name in ("exp.toml", "prompts.jsonl"):
        os.symlink(project / name, case / name)
    shutil.copytree(project / "trace", case / "trace")
    old = Trace.load(case / "trace").identity()
    cmd = ["record", "exp.toml", "--out", "trace", "--fresh", "--no-progress"]
    code = _kill_after(cmd, case, delay)
    now = Trace.load(case / "trace")  # loads, hidden files and all: never half old, half new
    assert code in (0, -signal.SIGKILL)
    if now.identity() != old:  # the kill came after the rename: then the new trace is whole
        assert len(now.prompts) == len(PROMPTS) and (case / "trace" / "curve.json").is_file()
        for prompt in now.prompts.values():
            now.hidden(prompt, torch.device("cpu"))  # every hidden file is the one trace.json names
    clear_stale_temporaries(case / "trace")  # what the next `record` does first
    assert [p.name for p in case.iterdir() if p.name.startswith(".trace")] == [], "a dead recording's files stayed"


# ---------------------------------------------------------------------- sweeps
def sweep_rows(out: Path) -> list[dict]:
    """Every line of results.jsonl (duplicates kept; a torn last line dropped)."""
    path = out / "results.jsonl"
    rows = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return rows


def each_once(out: Path, expected: int) -> None:
    good = [r["name"] for r in sweep_rows(out) if not r.get("failed")]
    assert len(good) == len(set(good)) == expected, good


def sweep_case(project: Path, name: str) -> Path:
    case = copy_case(project, name)
    (case / "sweep.toml").write_text((project / "sweep.toml").read_text())
    return case


SWEEP_CMD = ["sweep", "sweep.toml", "--workers", "1", "--out", "sw"]


# The replayed sweep takes ~1-2 s in a forked command (cli_processes): kills land mid-sweep.
@settings(max_examples=2, deadline=None)
@given(delay=st.floats(min_value=0.1, max_value=2.0))
def test_a_killed_sweep_resumes_with_nothing_lost_or_twice(project, delay: float) -> None:
    case = sweep_case(project, f"killsweep-{time.monotonic_ns()}")
    cmd = [*SWEEP_CMD, "--replay", str(project / "trace"), "--no-progress"]
    _kill_after(cmd, case, delay)
    before = sweep_rows(case / "sw")
    specframe(*SWEEP_CMD, "--replay", project / "trace", cwd=case)
    after = sweep_rows(case / "sw")
    assert after[: len(before)] == before, "a finished row was lost or rewritten"
    each_once(case / "sw", 8)
    # A torn last line (a kill mid-write) is dropped with a warning naming the file, not fatal.
    with (case / "sw" / "results.jsonl").open("a") as fh:
        fh.write('{"name": "talon[budget=3')
    done = specframe(*SWEEP_CMD, "--replay", project / "trace", cwd=case)
    assert "results.jsonl" in done.stderr and "half-written" in done.stderr
    each_once(case / "sw", 8)


def test_two_sweeps_on_one_directory(project) -> None:
    case = sweep_case(project, "twosweeps")
    first = cli_processes.start(*SWEEP_CMD, "--replay", project / "trace", "--no-progress", cwd=case, env=ENV)
    deadline = time.monotonic() + 60
    while not (case / "sw" / ".specframe.lock").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    second = specframe(*SWEEP_CMD, "--replay", project / "trace", cwd=case, check=False)
    assert first.wait(timeout=300) == 0
    assert second.returncode == 1 and f"pid {first.pid}" in second.stderr, second.stderr
    each_once(case / "sw", 8)


def test_a_configuration_that_raises_is_named_and_alone_rerun(project) -> None:
    case = sweep_case(project, "raises")
    broken = textwrap.dedent("""
        [[arm]]
        name = "broken"
        policy = "talon"
        policy_options = { budget = 6, mu = 0.03 }
        drafter_options = { model = "no-such-draft" }
        """)
    (case / "exp.toml").write_text((project / "exp.toml").read_text().replace("[data]", broken + "\n[data]"))
    (case / "sweep.toml").write_text((project / "sweep.toml").read_text()
                                     .replace('arms = ["talon"]', 'arms = ["talon", "broken"]')
                                     .replace("[3, 4, 5, 6]", "[3, 4]"))
    done = specframe(*SWEEP_CMD, "--replay", project / "trace", cwd=case, check=False)
    assert done.returncode == 1
    failed = {r["name"]: r["error"] for r in sweep_rows(case / "sw") if r.get("failed")}
    assert sorted(failed) == ["broken[budget=3,mu=0.01]", "broken[budget=3,mu=0.1]",
                              "broken[budget=4,mu=0.01]", "broken[budget=4,mu=0.1]"]
    assert all("no-such-draft" in e for e in failed.values())
    assert "broken[budget=3,mu=0.01]" in done.stdout + done.stderr
    each_once(case / "sw", 4)
    # The fault fixed: the rerun replays the failed configurations only.
    (case / "exp.toml").write_text((case / "exp.toml").read_text().replace('"no-such-draft"', '"draft"'))
    good = {r["name"]: r for r in sweep_rows(case / "sw") if not r.get("failed")}
    specframe(*SWEEP_CMD, "--replay", project / "trace", cwd=case)
    each_once(case / "sw", 8)
    again = {r["name"]: r for r in sweep_rows(case / "sw") if not r.get("failed")}
    assert {n: again[n] for n in good} == good


def test_a_sweep_over_another_curve_is_refused(project) -> None:
    case = sweep_case(project, "sweepcurve")
    (case / "sweep.toml").write_text((project / "sweep.toml").read_text().replace("[3, 4, 5, 6]", "[3]"))
    specframe(*SWEEP_CMD, "--replay", project / "trace", cwd=case)
    curve = json.loads((project / "trace" / "curve.json").read_text())
    curve["seconds"] = [[3 * t for t in row] for row in curve["seconds"]]
    (case / "slow.json").write_text(json.dumps(curve))
    done = specframe(*SWEEP_CMD, "--replay", project / "trace", "--curve", "slow.json", cwd=case, check=False)
    assert done.returncode == 1 and "another curve" in done.stderr
    specframe(*SWEEP_CMD, "--replay", project / "trace", "--curve", "slow.json", "--fresh", cwd=case)
    each_once(case / "sw", 2)
