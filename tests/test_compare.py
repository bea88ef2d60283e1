"""Metrics and the compare command on hand-built answer records (no models)."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from specframe.cli import cli
from specframe.experiments.metrics import common_prefix, compare, funnel, speedup, summarize, totals, tree_shapes


def rec(qid, wall, tokens, steps=None, repeat=0, ids=None, drafts=0, category="c"):
    """A minimal answer record in the experiment's format."""
    steps = steps if steps is not None else tokens
    return {
        "question_id": qid, "category": category, "repeat": repeat, "greedy": True,
        "choices": [{"index": 0, "turns": ["x"], "new_tokens": [tokens], "wall_time": [wall],
                     "accept_lengths": [1] * steps, "decoding_steps": [steps]}],
        "draft_forwards": [drafts], "output_ids": [ids if ids is not None else list(range(tokens))],
    }


def test_totals_definitions():
    rs = [rec(0, 2.0, 10, steps=4, drafts=8), rec(1, 3.0, 20, steps=6, drafts=12)]
    t = totals(rs)
    assert t["tau"] == pytest.approx(30 / 10)
    assert t["delta"] == pytest.approx(20 / 10)
    assert t["tokens_per_s"] == pytest.approx(30 / 5)
    assert t["target_forwards_per_token"] == pytest.approx(10 / 30)


def test_speedup_pairs_answers_and_spreads_over_repeats():
    base = [rec(q, 4.0, 8, repeat=r) for q in range(3) for r in range(2)]
    # repeat 0: twice as fast; repeat 1: four times; an unpaired answer is ignored.
    arm = [rec(q, 2.0 if r == 0 else 1.0, 8, repeat=r) for q in range(3) for r in range(2)] + [rec(9, 100.0, 8)]
    s = speedup(arm, base)
    assert s["paired"] == 6
    assert sorted(s["speedup_repeats"]) == pytest.approx([2.0, 4.0])
    assert s["speedup"] == pytest.approx(3.0)
    assert s["speedup_std"] == pytest.approx(math.sqrt(2.0))
    # Every question has the same pooled ratio 8 / 3, so the bootstrap CI collapses onto it.
    assert s["speedup_ci"] == pytest.approx([8 / 3, 8 / 3])


def test_funnel_counts_accepted_depth_and_rank():
    r = rec(0, 1.0, 6, steps=3)
    r["steps"] = {"accepted_ranks": [[0, 1], [0], []], "depth": [2, 1, 3], "widths": [[1, 2, 1], [1, 1], [1, 3, 2, 1]],
                  "tree_size": [4, 2, 7]}
    f = funnel([r])
    assert f["steps"] == 3
    assert f["counts"][0][0] == 2 and f["counts"][1][1] == 1 and sum(map(sum, f["counts"])) == 3
    assert f["frequency"][0][0] == pytest.approx(2 / 3)
    shapes = tree_shapes([r])
    assert shapes["depth_hist"] == [0, 1, 1, 1]
    assert shapes["width_profile"] == pytest.approx([1, 2, 1, 1 / 3])
    assert shapes["max_width_hist"] == [0, 1, 1, 1]  # max widths below the root: 2, 1, 3


def test_funnel_lumps_high_ranks_and_counts_unknown():
    r = rec(0, 1.0, 3, steps=1)
    r["steps"] = {"accepted_ranks": [[25, -1]]}
    f = funnel([r], max_rank=4)
    assert f["counts"][0][4] == 1 and f["unknown_rank"] == 1


def test_compare_paired_ratio_and_token_equality():
    a = [rec(0, 2.0, 4, ids=[1, 2, 3, 4]), rec(1, 4.0, 4, ids=[1, 2, 3, 4]), rec(2, 8.0, 4, ids=[5, 6, 7, 8])]
    b = [rec(0, 1.0, 4, ids=[1, 2, 3, 4]), rec(1, 2.0, 4, ids=[1, 2, 3, 4]), rec(2, 4.0, 4, ids=[5, 9, 7, 8])]
    res = compare(a, b)
    assert res["pairs"] == 3
    assert res["speedup_geomean"] == pytest.approx(2.0)
    assert res["speedup_ci"] == pytest.approx([2.0, 2.0])
    assert res["speedup_total"] == pytest.approx(14 / 7)
    assert res["identical_outputs"] == 2
    assert res["token_agreement"] == pytest.approx((4 + 4 + 1) / 12)


def test_compare_ci_brackets_the_estimate_and_within_extremes():
    walls_b = [1.0, 1.5, 2.0, 0.5, 1.2, 0.9, 3.0, 1.1]
    a = [rec(i, 2.0, 4) for i in range(len(walls_b))]
    b = [rec(i, w, 4) for i, w in enumerate(walls_b)]
    res = compare(a, b)
    lo, hi = res["speedup_ci"]
    assert res["ratio_min"] <= lo <= res["speedup_geomean"] <= hi <= res["ratio_max"]
    assert lo < hi


def test_compare_without_common_answers_fails():
    with pytest.raises(ValueError, match="share no"):
        compare([rec(0, 1.0, 2)], [rec(1, 1.0, 2)])


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([], [1]) == 0


def test_summary_counts_mismatches_only_for_greedy_arms():
    ar = [rec(q, 2.0, 3, ids=[q, 1, 2]) for q in range(4)]
    good = [rec(q, 1.0, 3, ids=[q, 1, 2]) for q in range(4)]
    bad = [rec(q, 1.0, 3, ids=[q, 1, 2] if q else [9, 9, 9]) for q in range(4)]
    run = {"arms": {"ar": ar, "good": good, "bad": bad, "sampled": good}, "baseline": "ar",
           "greedy": {"ar": True, "good": True, "bad": True, "sampled": False}, "descriptions": {}}
    arms = {a["name"]: a["overall"] for a in summarize(run)["arms"]}
    assert (arms["good"]["mismatches"], arms["good"]["compared"]) == (0, 4)
    assert (arms["bad"]["mismatches"], arms["bad"]["compared"]) == (1, 4)
    assert "mismatches" not in arms["sampled"]
    assert arms["good"]["speedup"] == pytest.approx(2.0)


# ---------------------------------------------------------------------- CLI
def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_compare_command_on_two_files(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", [rec(q, 3.0, 4) for q in range(5)])
    b = write_jsonl(tmp_path / "b.jsonl", [rec(q, 1.0, 4) for q in range(5)])
    result = CliRunner().invoke(cli, ["compare", str(a), str(b)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "3.000" in result.output and "5/5" in result.output


def test_compare_command_on_arms_of_a_run_dir(tmp_path):
    (tmp_path / "answers").mkdir()
    arms = {"autoregressive": {"baseline": "autoregressive"}, "talon[mu=0.1]": {"baseline": None}}
    (tmp_path / "run.json").write_text(json.dumps({"arms": arms, "greedy": {}}))
    write_jsonl(tmp_path / "answers" / "autoregressive.jsonl", [rec(q, 2.0, 4) for q in range(3)])
    write_jsonl(tmp_path / "answers" / "talon.mu=0.1.jsonl", [rec(q, 0.5, 4) for q in range(3)])
    runner = CliRunner()
    for args in (["compare", str(tmp_path), "autoregressive", "talon[mu=0.1]"], ["compare", str(tmp_path)]):
        result = runner.invoke(cli, args, env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output
        assert "talon[mu=0.1]" in result.output and "4.000" in result.output
    result = runner.invoke(cli, ["compare", str(tmp_path), "autoregressive", "nope"], env={"COLUMNS": "200"})
    assert result.exit_code != 0 and "no answers for arm 'nope'" in result.output


# ---------------------------------------------------------------------- properties
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from specframe.experiments.plots import tidy_layout, tree_graph  # noqa: E402
from specframe.testing.strategies import draft_trees  # noqa: E402

answers = st.lists(
    st.tuples(st.integers(0, 5), st.integers(0, 2), st.floats(0.01, 10), st.integers(1, 50),
              st.integers(1, 50), st.integers(0, 200), st.sampled_from("xyz")),
    min_size=1, max_size=20, unique_by=lambda t: (t[0], t[1]),
)


@given(answers, st.floats(0.1, 10))
def test_summary_matches_a_slow_reference(rows, slowdown):
    arm = [rec(q, w, n, steps=min(s, n), repeat=r, drafts=d, category=c) for q, r, w, n, s, d, c in rows]
    base = [rec(q, w * slowdown, n, repeat=r, category=c) for q, r, w, n, s, d, c in rows]
    run = {"arms": {"ar": base, "arm": arm}, "baseline": "ar", "greedy": {"ar": True, "arm": True}, "descriptions": {}}
    summary = {a["name"]: a for a in summarize(run)["arms"]}["arm"]
    tokens = sum(n for _, _, _, n, _, _, _ in rows)
    forwards = sum(min(s, n) for _, _, _, n, s, _, _ in rows)
    o = summary["overall"]
    assert o["tau"] == pytest.approx(tokens / forwards)
    assert o["delta"] == pytest.approx(sum(d for _, _, _, _, _, d, _ in rows) / forwards)
    # Every answer is slower by the same factor in the baseline: every ratio is exactly that.
    assert o["speedup"] == pytest.approx(slowdown)
    assert all(x == pytest.approx(slowdown) for x in o["speedup_ci"] or [slowdown])
    assert sum(c["tokens"] for c in summary["categories"].values()) == tokens
    assert o["mismatches"] == 0 and o["compared"] == len(rows)


@given(draft_trees(max_nodes=40))
def test_tidy_layout_draws_trees_without_crossings(tree):
    data = {"tokens": tree.tokens.tolist(), "parents": tree.parents.tolist(), "depths": tree.depths.tolist(),
            "ranks": tree.ranks.tolist(), "accepted": [0]}
    graph = tree_graph(data)
    pos = tidy_layout(graph)
    assert set(pos) == set(range(len(tree)))
    for node, (x, y) in pos.items():
        assert y == -data["depths"][node]
        kids = sorted(pos[k][0] for k in graph.successors(node))
        if kids:
            assert kids[0] <= x <= kids[-1]
    # No crossings: at every depth, the left-to-right order of nodes follows their parents' order.
    by_depth: dict[int, list[int]] = {}
    for node in sorted(pos, key=lambda n: pos[n][0]):
        by_depth.setdefault(data["depths"][node], []).append(node)
    for nodes in by_depth.values():
        parent_x = [pos[data["parents"][n]][0] for n in nodes if data["parents"][n] >= 0]
        assert parent_x == sorted(parent_x)
