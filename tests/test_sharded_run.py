"""specframe run --ray: a run sharded over a local Ray (2 workers x 1 thread) on the tiny demo
pair answers exactly as one process does, pairs speedups per device, survives a killed worker,
resumes without recomputing, and refuses what it cannot do in one line."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("ray")

from ray_faults import FAULTY_GAMMA, MESSAGE  # noqa: E402
from ray_session import local_ray, lose_node  # noqa: E402,F401 - the session's Ray fixtures
from specframe.cli import cli  # noqa: E402
from tiny_demo import ARMS, demo_config  # noqa: E402

_config = demo_config


def _run(config: Path, out: Path, *extra: str):
    # --no-plots: the figures were most of a run's time here and no test reads them.
    return CliRunner().invoke(cli, ["run", str(config), "--out", str(out), "--no-progress", "--no-plots", *extra])


def _answers(out: Path) -> dict[tuple, dict]:
    found = {}
    for file in sorted((out / "answers").glob("*.jsonl")):
        for line in file.read_text().splitlines():
            r = json.loads(line)
            key = (r["arm"], json.dumps(r["question_id"]), r["repeat"])
            assert key not in found, f"answer {key} written twice"
            found[key] = r
    return found


def _exact(record: dict) -> dict:
    """What does not depend on the clock: tokens, tau's and delta's counts, every step's tree
    shape and the kept trees' nodes."""
    steps = {k: v for k, v in record["steps"].items() if not any(isinstance(x, float) for x in _flat(v))}
    trees = [{k: v for k, v in t.items() if k in ("tokens", "parents", "accepted", "depth", "widths")}
             for t in record["trees"]]
    c = record["choices"][0]
    return {"output_ids": record["output_ids"], "accept_lengths": c["accept_lengths"],
            "decoding_steps": c["decoding_steps"], "draft_forwards": record["draft_forwards"], "steps": steps,
            "trees": trees}


def _same_answers(one_dir: Path, other_dir: Path) -> tuple[dict, dict]:
    """Both runs' answers, asserted to cover the same (arm, question, repeat)s with the same
    outputs, acceptance and steps."""
    one, other = _answers(one_dir), _answers(other_dir)
    assert set(one) == set(other) and len(one) == 3 * len(ARMS)
    for key in one:
        assert _exact(other[key]) == _exact(one[key]), key
    return one, other


def _flat(value):
    if isinstance(value, list):
        for v in value:
            yield from _flat(v)
    else:
        yield value


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same config run in one process, then sharded over 2 workers."""
    tmp = tmp_path_factory.mktemp("sharded")
    config = _config(tmp)
    single = _run(config, tmp / "one")
    assert single.exit_code == 0, single.output
    return tmp, config


def test_sharded_answers_equal_one_process_and_the_report_pairs_per_device(runs, local_ray):
    tmp, config = runs
    result = _run(config, tmp / "sharded", "--ray", "--workers", "2")
    assert result.exit_code == 0, result.output
    one, sharded = _same_answers(tmp / "one", tmp / "sharded")
    devices = {sharded[k]["device"]["index"] for k in sharded}
    assert devices == {0, 1}  # both workers answered
    for (arm, qid, repeat), record in sharded.items():  # an arm and its baseline ran side by side
        assert record["device"] == sharded[("autoregressive", qid, repeat)]["device"]
    summary = json.loads((tmp / "sharded" / "summary.json").read_text())
    assert len(summary["devices"]) == 2 and "mixed_devices" not in summary
    chain = next(a for a in summary["arms"] if a["name"] == "chain")
    assert sum(d["paired"] for d in chain["devices"].values()) == chain["overall"]["paired"] == 3
    one_summary = json.loads((tmp / "one" / "summary.json").read_text())
    for a, b in zip(summary["arms"], one_summary["arms"]):  # device-free metrics pool as before
        assert (a["overall"]["tau"], a["overall"]["delta"], a["overall"]["tokens"]) == \
            (b["overall"]["tau"], b["overall"]["delta"], b["overall"]["tokens"])
    assert "## Devices" in (tmp / "sharded" / "report.md").read_text()

    again = _run(config, tmp / "sharded", "--ray", "--workers", "2")  # resumes: nothing is missing
    assert again.exit_code == 0, again.output
    assert "0 answers computed" in again.output and _answers(tmp / "sharded") == sharded


def test_a_worker_killed_mid_run_loses_only_its_question(runs, local_ray):
    from specframe.experiments.cluster.driver import ShardedExperiment
    from specframe.experiments.config import load_config

    tmp, config = runs
    killed: list[int] = []

    def kill_the_other_worker(arm: str, record) -> None:
        if killed:
            return
        pool = experiment.pool
        victim = next(pid for index, pid in pool.pids.items() if index != record.extra["device"]["index"])
        os.kill(victim, signal.SIGKILL)  # it is mid-question: the driver has not handed out all 3 yet
        killed.append(victim)

    experiment = ShardedExperiment(load_config(config), tmp / "killed", "local", 2, progress=False,
                                   on_record=kill_the_other_worker)
    outcome = experiment.run()
    assert killed and outcome.computed == 3 * len(ARMS)
    assert len(experiment.pool.actors) == 1  # the driver saw the death and went on with the other worker
    answers = _answers(tmp / "killed")  # each (arm, question, repeat) exactly once
    assert set(answers) == set(_answers(tmp / "one"))


def test_a_lost_node_stops_the_run_in_one_line_and_the_rerun_finishes_each_answer_once(runs, local_ray, lose_node):
    tmp, config = runs
    out = tmp / "lost"
    lost = {"on": True}

    def written() -> int:
        return sum(len(f.read_text().splitlines()) for f in (out / "answers").glob("*.jsonl"))

    lose_node(lambda: lost["on"] and written() >= 2)
    result = _run(config, out, "--ray", "--workers", "2")
    assert result.exit_code == 1
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and re.search(r"Ray node \w{12} at \S+ was lost mid-job: the cluster marked it dead",
                                          errors[0]), result.output
    assert str(out) in errors[0] and "run the same command again" in errors[0], errors[0]
    kept = _answers(out)
    assert 2 <= len(kept) < 3 * len(ARMS)

    lost["on"] = False
    again = _run(config, out, "--ray", "--workers", "2")
    assert again.exit_code == 0, again.output
    answers = _answers(out)  # each (arm, question, repeat) exactly once
    assert set(answers) == set(_answers(tmp / "one")) and all(answers[k] == kept[k] for k in kept)
    assert f"{len(answers) - len(kept)} answers computed" in again.output


def test_unlike_device_kinds_are_refused_unless_allowed_and_old_runs_report_as_before(runs, tmp_path):
    tmp, _ = runs
    run = tmp_path / "mixed"
    shutil.copytree(tmp / "one", run)
    for i, file in enumerate(sorted((run / "answers").glob("*.jsonl"))):
        rows = [json.loads(x) for x in file.read_text().splitlines()]
        for r in rows:  # two fake devices: the first question's answers on a GPU
            if r["question_id"] == rows[0]["question_id"]:
                r["device"] = {"host": "node2", "kind": "cuda", "name": "NVIDIA H100", "index": 0}
        file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    refused = CliRunner().invoke(cli, ["report", str(run), "--no-plots"])
    assert refused.exit_code == 1
    assert re.fullmatch(r"Error: the answers ran on devices of 2 kinds .*--allow-mixed-devices.*\n", refused.output)
    allowed = CliRunner().invoke(cli, ["report", str(run), "--no-plots", "--allow-mixed-devices"])
    assert allowed.exit_code == 0, allowed.output
    assert "pool unlike devices" in (run / "report.md").read_text()

    old = tmp_path / "old"  # a run written before devices were recorded: one device
    shutil.copytree(tmp / "one", old)
    for file in (old / "answers").glob("*.jsonl"):
        rows = [{k: v for k, v in json.loads(x).items() if k != "device"} for x in file.read_text().splitlines()]
        file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert CliRunner().invoke(cli, ["report", str(old), "--no-plots"]).exit_code == 0
    before, now = (json.loads((d / "summary.json").read_text()) for d in (tmp / "one", old))
    assert "devices" not in now and [a["overall"] for a in now["arms"]] == [a["overall"] for a in before["arms"]]


def test_a_plugin_raising_in_a_worker_is_one_line_naming_the_arm(tmp_path, local_ray):
    arm = f'\n[[arm]]\nname = "faulty"\npolicy = "chain"\npolicy_options = {{ gamma = {FAULTY_GAMMA} }}\n'
    result = _run(_config(tmp_path, arm), tmp_path / "out", "--ray", "--workers", "1")
    assert result.exit_code == 1
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "'faulty'" in errors[0] and MESSAGE in errors[0], result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("settings", ["batch_size = 2", "batch_size = 2\nbatch_refill = true"],
                         ids=["windows", "refill"])
def test_a_batched_run_sharded_by_window_answers_as_one_process(tmp_path, local_ray, settings):
    config = _config(tmp_path, settings=settings)
    single = _run(config, tmp_path / "one")
    assert single.exit_code == 0, single.output
    sharded = _run(config, tmp_path / "sharded", "--ray", "--workers", "2")
    assert sharded.exit_code == 0, sharded.output
    one, many = _same_answers(tmp_path / "one", tmp_path / "sharded")
    assert all("batch" in many[key] and "batch" in one[key] for key in one)  # both ran batched
    # a window is one unit: its questions ran on one device (3 questions: windows {0, 1} and {2}
    # with batch_size = 2; with batch_refill the repeat's 3 questions are one window)
    by_question = {}
    for (arm, qid, repeat), record in many.items():
        by_question.setdefault(qid, set()).add(json.dumps(record["device"], sort_keys=True))
    assert all(len(d) == 1 for d in by_question.values())
    from specframe.experiments.config import load_config
    from specframe.experiments.data import load_questions

    data = load_config(config).data
    ids = [json.dumps(q.question_id) for q in load_questions(data.path, data.category, data.limit)]
    windows = [ids] if "refill" in settings else [ids[:2], ids[2:]]
    for window in windows:
        assert len({next(iter(by_question[q])) for q in window}) == 1, window


def test_a_drafter_keeping_state_across_requests_is_refused_naming_the_arm(tmp_path, local_ray):
    arm = '\n[[arm]]\nname = "learning"\npolicy = "chain"\ndrafter = "recycle"\n'
    result = _run(_config(tmp_path, arm), tmp_path / "out", "--ray", "--workers", "1")
    assert result.exit_code == 1
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "arm 'learning'" in errors[0] and "run it without --ray" in errors[0], result.output
    answers = tmp_path / "out" / "answers"
    assert not answers.exists() or _answers(tmp_path / "out") == {}  # refused before any answer
