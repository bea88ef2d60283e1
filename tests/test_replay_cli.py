"""record -> run --replay -> sweep (local processes and Ray) on a tiny random experiment."""

from __future__ import annotations

import json
import textwrap

import pytest
from click.testing import CliRunner

from ray_session import start as start_local_ray  # the session's Ray (skips without ray)
from specframe.cli import cli
from specframe.testing.fixtures import tiny_experiment_toml

CONFIG = tiny_experiment_toml("tiny-replay", 10, output="live")

SWEEP = """
base = "exp.toml"
arms = ["talon"]
chunk = 2
[grid]
"policy.budget" = [3, 6]
"policy.mu" = [0.01, 0.1]
[output]
dir = "sweep"
"""


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """The experiment, its live run and its trace."""
    tmp = tmp_path_factory.mktemp("replay")
    rows = [{"question_id": i, "category": "ab"[i % 2], "turns": [f"ab ab ab {i} ab ab"]} for i in range(4)]
    (tmp / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp / "exp.toml").write_text(textwrap.dedent(CONFIG))
    (tmp / "sweep.toml").write_text(textwrap.dedent(SWEEP))
    runner = CliRunner()
    for args in (["run", str(tmp / "exp.toml"), "--no-progress", "--no-plots"],
                 ["record", str(tmp / "exp.toml"), "--out", str(tmp / "trace"), "--no-progress"]):
        result = runner.invoke(cli, args, catch_exceptions=False)
        assert result.exit_code == 0, result.output
    return tmp


def _summary(run_dir) -> dict:
    return {a["name"]: a for a in json.loads((run_dir / "summary.json").read_text())["arms"]}


def test_run_replay_reproduces_tau_and_delta_and_marks_arms(recorded) -> None:
    tmp = recorded
    result = CliRunner().invoke(cli, ["run", str(tmp / "exp.toml"), "--replay", str(tmp / "trace"),
                                      "--out", str(tmp / "replayed"), "--no-progress"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "(replay)" in result.output
    live, replay = _summary(tmp / "live"), _summary(tmp / "replayed")
    for name in ("talon", "ngram+chain"):
        assert replay[name]["overall"]["tau"] == live[name]["overall"]["tau"]
        assert replay[name]["overall"]["delta"] == live[name]["overall"]["delta"]
        assert replay[name]["replay"] == "exact"
    assert "(replay)" in (tmp / "replayed" / "report.md").read_text()


def _records(run_dir) -> dict:
    from specframe.experiments.runs import read_answers

    return {(path.stem, r["question_id"]): r for path in sorted((run_dir / "answers").glob("*.jsonl"))
            for r in read_answers(path)}


@pytest.mark.parametrize("batch", ["batch_size = 2", "batch_size = 3\nbatch_refill = true"])
def test_a_replayed_batch_takes_the_live_batch_s_steps(recorded, batch) -> None:
    """The trace of the unbatched run replays a batched experiment: every sequence's tokens,
    target forwards and draft forwards equal the live batch's, and the projected shares of a
    batch's wall time add up to it."""
    tmp = recorded
    text = (tmp / "exp.toml").read_text().replace("threads = 1\n", f"threads = 1\n{batch}\n")
    (tmp / "batched.toml").write_text(text)
    runner = CliRunner()
    for args in (["run", str(tmp / "batched.toml"), "--no-progress", "--out", str(tmp / "live-batch"), "--fresh"],
                 ["run", str(tmp / "batched.toml"), "--replay", str(tmp / "trace"), "--out",
                  str(tmp / "replay-batch"), "--no-progress", "--fresh"]):
        result = runner.invoke(cli, args, catch_exceptions=False)
        assert result.exit_code == 0, result.output
    live, replay = _records(tmp / "live-batch"), _records(tmp / "replay-batch")
    assert live.keys() == replay.keys() and len(live) == 12
    for key, record in live.items():
        got = replay[key]
        assert got["output_ids"] == record["output_ids"], key
        assert got["choices"][0]["decoding_steps"] == record["choices"][0]["decoding_steps"], key
        assert got["choices"][0]["accept_lengths"] == record["choices"][0]["accept_lengths"], key
        assert got["draft_forwards"] == record["draft_forwards"], key
        assert (got.get("steps") or {}).get("tree_size") == (record.get("steps") or {}).get("tree_size"), key
        assert got["batch"]["size"] == record["batch"]["size"]
        assert got["batch"]["latency"] > 0 and got["choices"][0]["wall_time"][0] > 0
    for arm in ("autoregressive", "talon"):
        batches: dict = {}
        for (name, _qid), record in replay.items():
            if name == arm:
                batches.setdefault(record["batch"]["wall"], []).append(record["choices"][0]["wall_time"][0])
        for wall, shares in batches.items():
            assert sum(shares) == pytest.approx(wall, rel=1e-3)
    assert _summary(tmp / "replay-batch")["talon"]["overall"]["tau"] == _summary(tmp / "live-batch")["talon"]["overall"]["tau"]


def test_replay_refuses_a_trace_of_other_settings(recorded) -> None:
    tmp = recorded
    other = tmp / "other.toml"
    other.write_text(textwrap.dedent(CONFIG).replace("max_new_tokens = 10", "max_new_tokens = 8"))
    result = CliRunner().invoke(cli, ["run", str(other), "--replay", str(tmp / "trace"), "--out", str(tmp / "o")])
    assert result.exit_code == 1
    assert "max_new_tokens = 10" in result.output and len(result.output.strip().splitlines()) == 1


def _sweep(tmp, out: str, extra: list[str]) -> list[dict]:
    result = CliRunner().invoke(cli, ["sweep", str(tmp / "sweep.toml"), "--replay", str(tmp / "trace"),
                                      "--out", str(tmp / out), "--no-progress", *extra], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "(replay)" in result.output and "best for overall" in result.output
    rows = [json.loads(x) for x in (tmp / out / "results.jsonl").read_text().splitlines()]
    return sorted(rows, key=lambda r: r["name"])


def _exact_part(rows: list[dict]) -> list[tuple]:
    """What replay determines exactly (times are measured, so not compared)."""
    return [(r["name"], r["overall"]["tau"], r["overall"]["delta"], r["overall"]["tokens"]) for r in rows]


def test_sweep_local_then_ray_identical(recorded) -> None:
    tmp = recorded
    local = _sweep(tmp, "sweep-local", ["--workers", "1"])
    assert len(local) == 4 and (tmp / "sweep-local" / "plots" / "tau_delta.png").exists()
    # The session's local Ray, which `--ray` joins: a Ray of this test's own cost a start, and
    # the next Ray test a restart.
    start_local_ray()
    on_ray = _sweep(tmp, "sweep-ray", ["--ray"])
    assert _exact_part(on_ray) == _exact_part(local)


def test_sweep_without_ray_says_how_to_install(recorded, monkeypatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    result = CliRunner().invoke(cli, ["sweep", str(recorded / "sweep.toml"), "--replay", str(recorded / "trace"),
                                      "--out", str(recorded / "no-ray"), "--ray"])
    assert result.exit_code == 1
    assert "pip install 'specframe[ray]'" in result.output and len(result.output.strip().splitlines()) == 1


def test_replay_with_another_curve_says_which(recorded) -> None:
    tmp = recorded
    result = CliRunner().invoke(cli, ["run", str(tmp / "exp.toml"), "--replay", str(tmp / "trace"), "--curve",
                                      str(tmp / "trace" / "curve.json"), "--out", str(tmp / "curve-run"),
                                      "--no-progress"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert str(tmp / "trace" / "curve.json") in (tmp / "curve-run" / "report.md").read_text()


def test_sampling_verifier_is_refused_in_one_line(recorded) -> None:
    tmp = recorded
    sampled = tmp / "sampled.toml"
    sampled.write_text(textwrap.dedent(CONFIG).replace(
        'policy_options = { gamma = 3 }', 'policy_options = { gamma = 3 }\nverifier = "sampling"'))
    result = CliRunner().invoke(cli, ["run", str(sampled), "--replay", str(tmp / "trace"), "--out", str(tmp / "s")])
    assert result.exit_code == 1
    assert "greedy-only" in result.output and len(result.output.strip().splitlines()) == 1


def test_an_arm_whose_drafter_does_not_replay_is_left_out_and_named(recorded) -> None:
    tmp = recorded
    mixed = tmp / "mixed.toml"
    mixed.write_text(textwrap.dedent(CONFIG).replace("[data]", textwrap.dedent("""
        [[arm]]
        policy = "chain"
        drafter = "recycle"
        policy_options = { gamma = 3 }

        [data]""")))
    result = CliRunner().invoke(cli, ["run", str(mixed), "--replay", str(tmp / "trace"), "--out", str(tmp / "mixed"),
                                      "--no-progress"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "recycle+chain (its drafter 'recycle' does not replay)" in (tmp / "mixed" / "report.md").read_text()
    assert "recycle+chain" not in _summary(tmp / "mixed")
