"""specframe tune on a tiny recorded experiment: outputs, resume after kill -9, refusals."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from click.testing import CliRunner

pytest.importorskip("optuna")

from ray_session import start as start_local_ray  # noqa: E402 - the session's Ray (skips without ray)
from specframe.cli import cli  # noqa: E402
from specframe.testing.fixtures import tiny_experiment_toml  # noqa: E402

CONFIG = tiny_experiment_toml("tiny-tune", 8)
RECYCLE_ARM = '\n[[arm]]\nname = "recycle+chain"\npolicy = "chain"\ndrafter = "recycle"\n'


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A tiny experiment (6 questions) and its trace."""
    tmp = tmp_path_factory.mktemp("tune")
    rows = [{"question_id": i, "category": "ab"[i % 2], "turns": [f"ab ab ab {i} ab ab"]} for i in range(6)]
    (tmp / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp / "exp.toml").write_text(CONFIG)
    result = CliRunner().invoke(cli, ["record", str(tmp / "exp.toml"), "--out", str(tmp / "trace"), "--no-progress"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return tmp


def _tune(tmp, out, *extra, config="exp.toml", trace="trace"):
    return CliRunner().invoke(cli, ["tune", str(tmp / config), "--trace", str(tmp / trace), "--out", str(tmp / out),
                                    "--no-progress", *extra])


def _trials(out_dir, arm):
    from specframe.tuning.study import JOURNAL, journal_storage

    import optuna

    study = optuna.load_study(study_name=arm, storage=journal_storage(out_dir / JOURNAL))
    return study.get_trials(deepcopy=False)


def _trials_so_far(out_dir, arm):
    """The trials of a tune still starting: none until its journal holds the study (the file
    exists a moment before the study is written into it)."""
    try:
        return _trials(out_dir, arm) if (out_dir / "study.journal").exists() else []
    except KeyError:  # optuna: "Record does not exist." (the study is not in the journal yet)
        return []


def test_tune_writes_a_runnable_best_toml_tune_json_and_the_report(recorded):
    tmp = recorded
    result = _tune(tmp, "out", "--trials", "4", "--arms", "ngram+chain")
    assert result.exit_code == 0, result.output
    out = tmp / "out"
    from specframe.experiments.config import load_config

    best = load_config(out / "best.toml")
    assert [a.name for a in best.arms] == ["autoregressive", "ngram+chain", "ngram+chain-tuned"]
    confirm = [json.loads(line)["question_id"] for line in (out / "confirm.jsonl").read_text().splitlines()]
    assert confirm == [3, 4, 5]  # --split 0.5: the first three are searched, never confirmed on
    data = json.loads((out / "tune.json").read_text())
    arm = data["arms"]["ngram+chain"]
    assert data["questions"] == {"searched": 3, "confirmation": 3}
    assert arm["trials"]["complete"] + arm["trials"]["pruned"] == 4 and arm["tuned"] == "ngram+chain-tuned"
    assert set(arm["default"]) == {"searched", "confirmation"} and arm["best"]["confirmation"]["tau"] > 0
    trials = _trials(out, "ngram+chain")
    assert trials[0].user_attrs.get("default") and trials[0].params == {
        "drafter.max_ngram": 3, "drafter.min_ngram": 1, "drafter.decay": 1.0, "policy.gamma": 3,
        "policy.schedule": "constant", "policy.confidence_stop": False}  # the arm's own options come first
    report = (out / "report.md").read_text()
    assert "fANOVA" in report and "ngram+chain-history.png" in report
    assert (out / "plots" / "ngram+chain-history.png").is_file()
    # A rerun of the finished tune runs no trial.
    again = _tune(tmp, "out", "--trials", "4", "--arms", "ngram+chain")
    assert again.exit_code == 0, again.output
    assert len(_trials(out, "ngram+chain")) == len(trials)


SLOW_TUNE = """
import sys, time
from specframe.tuning import evaluate
evaluate_one = evaluate.Evaluator.evaluate
def slow(self, *args, **kwargs):
    time.sleep(0.4)  # a trial long enough to be killed inside
    return evaluate_one(self, *args, **kwargs)
evaluate.Evaluator.evaluate = slow
from specframe.cli import main
sys.argv = ["specframe", *sys.argv[1:]]
main()
"""


def test_a_tune_killed_mid_trial_resumes_without_repeating_a_finished_trial(recorded):
    from optuna.trial import TrialState

    tmp = recorded
    out = tmp / "killed"
    args = ["tune", str(tmp / "exp.toml"), "--trace", str(tmp / "trace"), "--out", str(out), "--no-progress",
            "--arms", "talon", "--trials", "8"]
    proc = subprocess.Popen([sys.executable, "-c", SLOW_TUNE, *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert time.monotonic() < deadline, "the tune never reached its third trial"
            assert proc.poll() is None, "the tune ended before it could be killed"
            trials = _trials_so_far(out, "talon")
            done = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
            if len(done) >= 2 and any(t.state == TrialState.RUNNING for t in trials):
                break
            time.sleep(0.05)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    before = {t.number: (t.state, t.params, t.value) for t in _trials(out, "talon")}
    finished_before = [n for n, (state, _, _) in before.items() if state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(finished_before) < 8
    result = _tune(tmp, "killed", "--arms", "talon", "--trials", "8")
    assert result.exit_code == 0, result.output
    assert "killed mid-run are run again" in result.output
    after = _trials(out, "talon")
    for number in finished_before:  # kept as they were
        assert (after[number].state, after[number].params, after[number].value) == before[number]
    new = [t for t in after if t.number not in before]
    assert len(new) == 8 - len(finished_before)  # only the missing trials ran
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in new)
    assert sum(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in after) == 8
    assert sum(t.state == TrialState.FAIL for t in after) == sum(s == TrialState.RUNNING for s, _, _ in before.values())


def test_a_re_recorded_trace_edited_data_or_a_changed_arm_is_refused_by_name(recorded):
    tmp = recorded
    assert _tune(tmp, "stale", "--trials", "2", "--arms", "talon").exit_code == 0
    # A re-recorded trace: same prompts, another recording (its content hash differs).
    shutil.copytree(tmp / "trace", tmp / "trace2")
    trace = json.loads((tmp / "trace2" / "trace.json").read_text())
    trace["prompts"][0]["prefill_seconds"] += 1e-3
    (tmp / "trace2" / "trace.json").write_text(json.dumps(trace))
    result = _tune(tmp, "stale", "--trials", "2", "--arms", "talon", trace="trace2")
    assert result.exit_code == 1 and "holds a tune over another trace:" in result.output
    assert "--fresh" in result.output and len(result.output.strip().splitlines()) == 1
    # Edited data: the same file name, another content.
    shutil.copy(tmp / "prompts.jsonl", tmp / "prompts.bak")
    try:
        with (tmp / "prompts.jsonl").open("a") as fh:
            fh.write(json.dumps({"question_id": 99, "category": "a", "turns": ["new"]}) + "\n")
        result = _tune(tmp, "stale", "--trials", "2", "--arms", "talon")
        assert result.exit_code == 1 and "over another data:" in result.output
    finally:
        shutil.move(tmp / "prompts.bak", tmp / "prompts.jsonl")
    # A changed arm definition.
    (tmp / "changed.toml").write_text(CONFIG.replace("mu = 0.03", "mu = 0.05"))
    result = _tune(tmp, "stale", "--trials", "2", "--arms", "talon", config="changed.toml")
    assert result.exit_code == 1 and "another definition or search space of arm(s) talon" in result.output
    # --fresh starts over on the new trace.
    result = _tune(tmp, "stale", "--trials", "2", "--arms", "talon", "--fresh", trace="trace2")
    assert result.exit_code == 0, result.output


def test_an_arm_that_does_not_replay_or_a_bad_split_is_refused_with_the_reason(recorded):
    tmp = recorded
    (tmp / "recycle.toml").write_text(CONFIG.replace("\n[data]", RECYCLE_ARM + "\n[data]"))
    result = _tune(tmp, "recycle", "--trials", "2", "--arms", "recycle+chain", config="recycle.toml")
    assert result.exit_code == 1
    assert "no arm can be tuned, not replayed: recycle+chain (its drafter 'recycle' does not replay)" in result.output
    result = _tune(tmp, "split", "--trials", "2", "--split", "1.0")
    assert result.exit_code == 1 and "--split must lie strictly between 0 and 1" in result.output


def test_an_arm_that_replays_approximately_is_named_as_such(recorded, monkeypatch):
    from specframe.plugins import get_registry

    monkeypatch.setattr(get_registry().get("drafters", "ngram"), "replay", "approximate")
    result = _tune(recorded, "approx", "--trials", "2", "--arms", "ngram+chain")
    assert result.exit_code == 0, result.output
    # the note is prose that rich wraps at the console's width (a terminal's, or COLUMNS): compare words
    flat = " ".join(result.output.split())
    assert "ngram+chain: replays approximately (drafter 'ngram'): its projected figures are approximate" in flat
    assert json.loads((recorded / "approx" / "tune.json").read_text())["arms"]["ngram+chain"]["replay"] == "approximate"


def test_confirm_runs_best_toml_live_beside_the_arm_as_given(recorded):
    result = _tune(recorded, "confirmed", "--trials", "2", "--arms", "ngram+chain", "--confirm")
    assert result.exit_code == 0, result.output
    assert "confirmation (live): as given vs tuned" in result.output
    summary = json.loads((recorded / "confirmed" / "confirm" / "summary.json").read_text())
    arms = {a["name"]: a for a in summary["arms"]}
    assert set(arms) == {"autoregressive", "ngram+chain", "ngram+chain-tuned"}
    assert all(a["overall"]["answers"] == 3 and "replay" not in a for a in arms.values())  # live, on 3 questions


@pytest.fixture(scope="module")
def serial_tune(recorded):
    """The one-process tune both parallel variants compare with (run once for both)."""
    # tau: replay decides it exactly (projected seconds include the drafter's measured time).
    single = _tune(recorded, "serial", "--trials", "4", "--arms", "ngram+chain", "--objective", "tau")
    assert single.exit_code == 0, single.output
    return recorded / "serial"


@pytest.mark.parametrize("parallel", [("--workers", "2"), ("--ray", "local")], ids=["processes", "ray"])
def test_parallel_trials_score_each_point_as_one_process_does(recorded, serial_tune, parallel):
    """Trials in spawned processes or Ray tasks share the journal study and replay exactly, so a
    point's tau is what the one-process tune scored it (the arm's own options, trial 0, at least)."""
    tmp = recorded
    if parallel[0] == "--ray":
        # The session's local Ray, which `--ray local` joins: starting and shutting down a Ray
        # of its own here cost a start, and the next Ray test a restart.
        start_local_ray()
    out = f"parallel-{parallel[0].strip('-')}"
    result = _tune(tmp, out, "--trials", "4", "--arms", "ngram+chain", "--objective", "tau", *parallel)
    assert result.exit_code == 0, result.output
    serial = {tuple(sorted(t.params.items())): t.value for t in _trials(serial_tune, "ngram+chain")
              if t.state.name == "COMPLETE"}
    done = [t for t in _trials(tmp / out, "ngram+chain") if t.state.name in ("COMPLETE", "PRUNED")]
    assert len(done) >= 4, [t.state.name for t in _trials(tmp / out, "ngram+chain")]
    first = _trials(tmp / out, "ngram+chain")[0]
    assert first.user_attrs.get("default") and first.state.name == "COMPLETE"
    shared = [t for t in done if t.state.name == "COMPLETE" and tuple(sorted(t.params.items())) in serial]
    assert shared, "not even the default point was scored by both"
    for t in shared:
        assert t.value == pytest.approx(serial[tuple(sorted(t.params.items()))], rel=1e-12), t.params
