"""Sequoia's acceptance vector, measured: counts from recorded steps, the probe over a trace, the
file the ``sequoia`` policy reads, and the static tree fitted to it (docs/policies.md#sequoia)."""

from __future__ import annotations

import itertools
import json
import math
import textwrap

import pytest
from click.testing import CliRunner

from specframe.cli import cli
from specframe.decode.engine import make_plugin
from specframe.serving.acceptance import (
    Acceptance, AcceptanceError, count_steps, expected_length, fit_static_tree, from_records, full_tree)
from specframe.options import OptionError
from specframe.testing.fixtures import tiny_experiment_toml


def _records(depths, ranks):
    return [{"steps": {"depth": depths, "accepted_ranks": ranks}}]


def test_counts_by_depth_and_rank_hand_example():
    # Step 1: tree depth 3, accepted ranks 0 then 1, depth 3 tested and missed.
    # Step 2: depth 3, rank 1 accepted at depth 1, depth 2 missed.  Step 3: depth 2, nothing accepted.
    steps, reached, hits = count_steps([{"depth": [3, 3, 2], "accepted_ranks": [[0, 1], [1], []]}])
    assert steps == 3
    assert reached == [3, 2, 1]
    assert hits == [[1, 1], [0, 1], [0, 0]]
    acc = from_records(_records([3, 3, 2], [[0, 1], [1], []]), "arm", "here")
    assert acc.by_rank == pytest.approx([1 / 6, 2 / 6])
    assert acc.by_depth[0] == pytest.approx([1 / 3, 1 / 3]) and acc.by_depth[2] == [0.0, 0.0]


def test_a_path_as_deep_as_its_tree_tests_nothing_deeper_and_unranked_nodes_are_not_misses():
    # A chain of 2 fully accepted: depths 1 and 2 tested and hit, nothing at depth 3.
    _, reached, hits = count_steps([{"depth": [2], "accepted_ranks": [[0, 0]]}])
    assert reached == [1, 1] and hits == [[1], [1]]
    # An unknown rank (-1) at depth 2 is neither a hit nor a miss there.
    _, reached, hits = count_steps([{"depth": [3, 1], "accepted_ranks": [[0, -1], [0]]}])
    assert reached == [2] and hits == [[2]]


def test_no_steps_is_refused():
    with pytest.raises(AcceptanceError, match="no recorded steps"):
        from_records([{"steps": {}}], "autoregressive", "run")


def test_file_round_trip_and_foreign_file_refused(tmp_path):
    acc = from_records(_records([2, 2], [[0, 0], [1]]), "arm", "run", width=3)
    path = acc.save(tmp_path / "a.json", {"fitted": {"budget": 4}})
    data = json.loads(path.read_text())
    assert data["by_rank"] == pytest.approx([2 / 4, 1 / 4, 0.0]) and data["fitted"] == {"budget": 4}
    assert Acceptance.load(path).by_rank == acc.by_rank
    (tmp_path / "b.json").write_text("[1, 2]")
    with pytest.raises(AcceptanceError, match="not an acceptance file"):
        Acceptance.load(tmp_path / "b.json")


def test_full_probe_tree():
    assert full_tree(2, 2) == [[0], [1], [0, 0], [0, 1], [1, 0], [1, 1]]
    assert len(full_tree(4, 4)) == 4 + 16 + 64 + 256


def _all_trees(nodes: int, width: int, depth: int):
    """Every rank-path tree of ``nodes`` drafted nodes (prefix-closed, ranks below width)."""
    candidates = [tuple(p) for p in full_tree(width, depth)]
    for combo in itertools.combinations(candidates, nodes):
        chosen = set(combo)
        closed = all(p[:-1] in chosen or len(p) == 1 for p in chosen)
        siblings = all(p[-1] == 0 or p[:-1] + (p[-1] - 1,) in chosen for p in chosen)
        if closed and siblings:
            yield combo


@pytest.mark.parametrize("vector,depth", [([0.6, 0.2], 3), ([0.3, 0.3, 0.2], 3), ([0.9], 5)])
def test_fitted_tree_is_the_best_tree_of_its_size(vector, depth):
    # Brute force over every tree of 5 drafted nodes: none beats the fitted one.
    fitted = fit_static_tree(vector, budget=6, max_depth=depth)
    assert len(fitted) == 5
    best = max(expected_length(t, vector) for t in _all_trees(5, len(vector), depth))
    assert math.isclose(expected_length(fitted, vector), best, rel_tol=1e-12)


# ---------------------------------------------------------------------- the sequoia option
def test_sequoia_reads_the_acceptance_file_and_named_vectors(tmp_path):
    acc = from_records(_records([3, 3, 3], [[0, 0, 1], [1], [0]]), "arm", "run")
    path = acc.save(tmp_path / "acc.json")
    policy = make_plugin("policies", ("sequoia", {"acceptance": str(path), "budget": 8}))
    assert policy.options.vector == pytest.approx(tuple(acc.by_rank))
    assert tuple(policy.shape()) == fit_static_tree(acc, 8)
    from specframe.strategies.sequoia import DEFAULT_ACCEPTANCE, MEASURED

    default = make_plugin("policies", "sequoia")
    assert default.options.vector == MEASURED[DEFAULT_ACCEPTANCE]


@pytest.mark.parametrize("value,message", [
    ("no-such-vector", "names neither a measured vector"),
    ("{file}", "holds no 'by_rank' list"),
])
def test_sequoia_refuses_what_is_no_measured_vector(tmp_path, value, message):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"vector": [0.5]}))
    with pytest.raises(OptionError, match=message):
        make_plugin("policies", ("sequoia", {"acceptance": value.format(file=bad)}))


# ---------------------------------------------------------------------- over a tiny trace
@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """The tiny experiment (talon, ngram+chain over the model drafter), its live run and its trace."""
    tmp = tmp_path_factory.mktemp("acceptance")
    rows = [{"question_id": i, "category": "ab", "turns": [f"ab ab ab {i} ab ab"]} for i in range(3)]
    (tmp / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    chain = '\n[[arm]]\nname = "chain3"\npolicy = "chain"\npolicy_options = { gamma = 3 }\n'
    (tmp / "exp.toml").write_text(textwrap.dedent(tiny_experiment_toml("tiny-acc", 12, output="live")) + chain)
    runner = CliRunner()
    for args in (["run", str(tmp / "exp.toml"), "--no-progress", "--no-plots"],
                 ["record", str(tmp / "exp.toml"), "--out", str(tmp / "trace"), "--no-progress"]):
        result = runner.invoke(cli, args, catch_exceptions=False)
        assert result.exit_code == 0, result.output
    return tmp


def test_probe_of_width_one_is_the_chain_it_equals(traced):
    # A probe 1 wide and 3 deep drafts the same trees as chain gamma=3: two code paths
    # (static rank paths vs the chain policy) must count the same acceptance.
    from specframe.experiments.config import load_config
    from specframe.commands.probe import probe_acceptance, replay_taus

    config = load_config(traced / "exp.toml")
    probe = probe_acceptance(config, traced / "trace", "chain3", width=1, depth=3)
    taus = replay_taus(config, traced / "trace", [config.arm("chain3")], out_dir=traced / "chain-replay")
    from specframe.experiments.metrics import load_run

    chain = from_records(load_run(traced / "chain-replay")["arms"]["chain3"], "chain3", "replay", width=1)
    assert probe.reached == chain.reached and probe.hits == chain.hits
    assert probe.method == "probe" and taus["chain3"] > 1.0


def test_acceptance_command_counts_a_run_and_probes_a_trace_with_a_fitted_tree(traced):
    runner = CliRunner()
    out = traced / "talon-recorded.json"
    result = runner.invoke(cli, ["acceptance", str(traced / "live"), "--arm", "talon", "--out", str(out)],
                           catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "recorded acceptance of talon" in result.output and Acceptance.load(out).method == "recorded"
    probed = traced / "talon-probe.json"
    result = runner.invoke(cli, ["acceptance", str(traced / "exp.toml"), "--arm", "talon", "--trace",
                                 str(traced / "trace"), "--width", "3", "--depth", "3", "--fit", "6",
                                 "--out", str(probed)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    data = json.loads(probed.read_text())
    assert data["method"] == "probe" and data["width"] == 3 and len(data["reached"]) == 3
    fitted = data["fitted"]
    assert len(fitted["choices"]) == 5 and set(fitted["tau"]) == {"talon", "talon fitted static"}
    assert "replayed tau" in result.output
    # The fitted tree is the sequoia policy's shape under the measured vector.
    sequoia = make_plugin("policies", ("sequoia", {"acceptance": str(probed), "budget": 6}))
    assert [list(p) for p in sequoia.shape()] == fitted["choices"]


def test_acceptance_command_refuses_a_baseline_and_an_unknown_arm(traced):
    runner = CliRunner()
    result = runner.invoke(cli, ["acceptance", str(traced / "exp.toml"), "--arm", "autoregressive",
                                 "--trace", str(traced / "trace")])
    assert result.exit_code != 0 and "is a baseline" in result.output
    result = runner.invoke(cli, ["acceptance", str(traced / "live"), "--arm", "nope"])
    assert result.exit_code != 0 and "nope" in result.output


def test_export_from_a_run_directory_fits_the_adaptive_tree_to_its_recorded_steps(traced):
    result = CliRunner().invoke(cli, ["export", str(traced / "live"), "--arm", "talon", "--to", "sglang"])
    assert result.exit_code == 0, result.output
    assert "--speculative-algorithm STANDALONE" in result.output
    assert ("fitted to the acceptance measured for this arm (no acceptance file was passed: counted from"
            in result.output)
    assert "recorded without accepted_children" not in result.output  # a run of today records it
