"""sweep and tune on the one Ray layer: --workers N is N tasks, and a plugin that raises
inside a Ray task reaches the user as one line naming the arm."""

from __future__ import annotations

import json
import textwrap

import pytest
from click.testing import CliRunner

pytest.importorskip("optuna")
pytest.importorskip("ray")

from ray_faults import FAULTY_GAMMA, MESSAGE  # noqa: E402
from ray_session import local_ray, lose_node  # noqa: E402,F401 - the session's Ray fixtures
from specframe.cli import cli  # noqa: E402
from specframe.testing.fixtures import tiny_experiment_toml  # noqa: E402

FAULTY_ARM = f'\n[[arm]]\nname = "faulty"\npolicy = "chain"\ndrafter = "ngram"\npolicy_options = {{ gamma = {FAULTY_GAMMA} }}\n'


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A tiny experiment (4 questions, plus an arm whose policy raises) and its trace."""
    tmp = tmp_path_factory.mktemp("raytune")
    rows = [{"question_id": i, "category": "ab"[i % 2], "turns": [f"ab ab ab {i} ab ab"]} for i in range(4)]
    (tmp / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp / "exp.toml").write_text(tiny_experiment_toml("ray-tune", 6) + FAULTY_ARM)
    result = CliRunner().invoke(cli, ["record", str(tmp / "exp.toml"), "--out", str(tmp / "trace"), "--no-progress"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return tmp


def _tune(tmp, out, *extra):
    return CliRunner().invoke(cli, ["tune", str(tmp / "exp.toml"), "--trace", str(tmp / "trace"), "--out",
                                    str(tmp / out), "--no-progress", *extra])


def _one_line_naming(output: str, arm: str) -> str:
    """The error line of a failed command; it names ``arm`` and the plugin's own error."""
    errors = [line for line in output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, output
    assert f"'{arm}'" in errors[0] and MESSAGE in errors[0], errors[0]
    assert "Traceback" not in output
    return errors[0]


def test_tune_on_ray_runs_as_many_tasks_as_workers(recorded, local_ray):
    result = _tune(recorded, "three", "--trials", "3", "--arms", "ngram+chain", "--space", "drafter",
                   "--ray", "--workers", "3")
    assert result.exit_code == 0, result.output
    # Each task replays into a scratch directory of its own.
    assert sorted(p.name for p in (recorded / "three" / "replay").iterdir() if p.name != "main") == \
        ["worker0", "worker1", "worker2"]


def test_a_plugin_raising_in_a_tune_task_is_one_line_naming_the_arm(recorded, local_ray):
    result = _tune(recorded, "faulty", "--trials", "2", "--arms", "faulty", "--space", "drafter",
                   "--ray", "--workers", "2")
    assert result.exit_code == 1
    _one_line_naming(result.output, "faulty")


def test_a_plugin_raising_in_a_sweep_task_is_one_line_naming_the_configuration(recorded, local_ray):
    sweep = recorded / "sweep.toml"
    sweep.write_text(textwrap.dedent(f"""\
        base = "{recorded / 'exp.toml'}"
        arms = ["ngram+chain"]
        [grid]
        "policy.gamma" = [2, {FAULTY_GAMMA}]
        [output]
        dir = "{recorded / 'sweep-out'}"
        """))
    result = CliRunner().invoke(cli, ["sweep", str(sweep), "--replay", str(recorded / "trace"), "--ray",
                                      "--workers", "2", "--no-progress"])
    assert result.exit_code == 1, result.output
    failed = [line for line in result.output.splitlines() if f"gamma={FAULTY_GAMMA}" in line and MESSAGE in line]
    assert len(failed) == 1 and "ngram+chain" in failed[0], result.output
    assert "Traceback" not in result.output


def test_a_lost_node_stops_a_sweep_in_one_line_and_the_rerun_replays_only_the_rest(recorded, local_ray, lose_node):
    out = recorded / "lost-out"
    sweep = recorded / "lost.toml"
    sweep.write_text(textwrap.dedent(f"""\
        base = "{recorded / 'exp.toml'}"
        arms = ["ngram+chain"]
        chunk = 1
        [grid]
        "policy.gamma" = [2, 3, 4, 5]
        [output]
        dir = "{out}"
        """))
    results = out / "results.jsonl"
    lost = {"on": True}
    lose_node(lambda: lost["on"] and results.exists() and results.read_text().strip() != "")
    command = ["sweep", str(sweep), "--replay", str(recorded / "trace"), "--ray", "--workers", "1", "--no-progress"]
    result = CliRunner().invoke(cli, command)
    assert result.exit_code == 1, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "was lost mid-job" in errors[0] and "replay only the rest" in errors[0], result.output
    first = [json.loads(line)["name"] for line in results.read_text().splitlines()]
    assert 1 <= len(first) < 4

    lost["on"] = False
    again = CliRunner().invoke(cli, command)
    assert again.exit_code == 0, again.output
    names = [json.loads(line)["name"] for line in results.read_text().splitlines()]
    assert len(names) == len(set(names)) == 4 and names[:len(first)] == first  # each configuration once
