"""The benchmark scripts run (CI runs the GPU suite's smoke mode on the CPU)."""

import json
import os
import subprocess
import sys
from pathlib import Path

from benchmark_scripts import benchmark_script

ROOT = Path(__file__).resolve().parent.parent


def test_gpu_suite_smoke_writes_json_and_summary(tmp_path):
    # --skip-compile: its check (a compiled talon target decodes the eager tokens) is the property
    # tests/test_compile.py asserts, and torch.compile took two thirds of this test's time.
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_suite.py"), "--smoke", "--skip-compile",
                           "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "gpu_suite_smoke.json").read_text())
    assert set(result["latency_ms"]) == {"16", "32"}
    assert all(len(row) == 4 and all(ms > 0 for ms in row.values()) for row in result["latency_ms"].values())
    assert set(result["step_split_ms"]) == {"chain", "eagle", "talon", "chain-auto", "talon-auto"}
    assert result["step_split_ms"]["eagle"]["draft_forwards"] == 8.0  # D + 1 with D = 7
    arms = result["demo"]["float32"]
    assert "autoregressive" in arms and "talon" in arms and arms["talon-auto"]["mean_tree_size"] >= 1
    assert result["demo_cost_curve"]["sizes"] == [1, 2, 4]
    assert all(m["mismatches"] in (0, None) for m in arms.values())
    assert set(result["projection"]) <= {"chain", "eagle", "talon"} and result["projection"]
    assert set(result["engine_paths"]) == {"reference", "fast"}
    assert result["compile"] == {}
    assert "PROJECTED" in (tmp_path / "gpu_suite_smoke.txt").read_text()


def test_auto_sizing_smoke_prints_the_table_and_its_checks(tmp_path):
    env = {**os.environ, "SPECFRAME_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "auto_sizing.py"), "--smoke", "--table", "chain",
                           "--drafter", "model", "--out", str(tmp_path)], capture_output=True, text=True,
                          timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = (tmp_path / "demo-model-chain" / "auto_sizing.txt").read_text()
    for arm in ("autoregressive", "chain-g2", "chain-g3", "chain-auto"):
        assert arm in text
    assert "of the best fixed arm" in text and "vs autoregressive" in text
    assert list((tmp_path / "cache" / "profiles").glob("*.json")), "the cost curve is measured before the run"


def test_auto_sizing_reports_the_noise_of_arms_that_did_the_same_work(tmp_path):
    auto_sizing = benchmark_script("auto_sizing")

    def write(arm: str, sizes: list[int]) -> None:
        steps = {"tree_size": sizes, "depth": [1] * len(sizes), "accepted": [0] * len(sizes)}
        rows = [{"question_id": q, "repeat": 0, "steps": steps} for q in (1, 0)]
        (tmp_path / f"{arm}.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")

    write("a", [4, 4]); write("b", [4, 4]); write("c", [8, 4]); write("auto", [5, 4])
    groups = auto_sizing.same_work_groups(tmp_path)
    assert groups == [["a", "b"]]
    arms = {"a": {"tokens_per_s": 10.0}, "b": {"tokens_per_s": 12.0}, "c": {"tokens_per_s": 9.0},
            "auto": {"tokens_per_s": 10.45}}
    (line,) = auto_sizing.noise_lines(arms, groups, "auto", "b")
    assert "spread 20.0%" in line and "auto = 95.0% of their mean (11.0)" in line
    (line,) = auto_sizing.noise_lines(arms, groups, "auto", "c")  # the best arm did other work
    assert "spread 20.0%" in line and "of their mean" not in line


def test_linears_ab_runs_both_linears_interleaved_in_one_table(tmp_path):
    """Both runs written, every arm in the table once per linears, 0 mismatches against the AR of
    its own linears, and the second question computed alone (the resume the script relies on).
    Holds where bf16 falls back to float32 (the label says so there)."""
    env = {**os.environ, "SPECFRAME_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "linears_ab.py"), str(ROOT / "examples" / "demo-tiny.toml"),
                           "--out", str(tmp_path / "ab"), "--limit", "2", "--max-new-tokens", "8",
                           "--arms", "chain,eagle3+talon"], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for linears in ("float32", "bf16"):
        assert json.loads((tmp_path / "ab" / linears / "run.json").read_text())["linears"].startswith(("bf16", "float32"))
        assert (tmp_path / "ab" / linears / "summary.json").exists()
    chunks = [line for line in proc.stdout.splitlines() if line.startswith("chunk ")]
    assert len(chunks) == 2 and chunks[1].count("3 computed, 3 reused") == 2, chunks
    text = (tmp_path / "ab" / "table.md").read_text()
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("| arm ")]
    assert sorted(r[0] for r in rows) == sorted(["autoregressive", "chain", "eagle3+talon"] * 2)
    assert all(r[5] == "0/2" for r in rows), rows
    assert all(r[6] != "-" for r in rows[1::2]) and all(r[6] == "-" for r in rows[0::2])
    assert "shape_confidence.png" in text


def test_linears_ab_resumes_at_the_questions_a_run_already_has():
    linears_ab = benchmark_script("linears_ab")
    assert linears_ab.chunk_limits(0, 5, 2) == [2, 4, 5]
    assert linears_ab.chunk_limits(3, 7, 2) == [3, 5, 7]  # a run may lag at 3 after a crash
    assert linears_ab.chunk_limits(4, 4, 1) == [4]


def test_linears_ab_exact_both_runs_the_stock_forward_beside_the_exact_one():
    """``--exact both`` on a file that turns the exact forward on (examples/demo.toml does) still
    runs its unsuffixed runs with the stock forward: otherwise all four runs are exact and the
    A/B compares nothing (it once did)."""
    linears_ab = benchmark_script("linears_ab")
    from specframe.experiments.config import load_config

    demo = load_config(ROOT / "examples" / "demo.toml")
    assert demo.target.exact
    both = linears_ab.with_exact(demo, "both")
    runs = {name: linears_ab.variant(both, name, 7).target for name in linears_ab.variants("both")}
    assert {name: (t.linears, t.exact) for name, t in runs.items()} == {
        "float32": ("float32", False), "bf16": ("bf16", False),
        "float32-exact": ("float32", True), "bf16-exact": ("bf16", True)}
    assert linears_ab.with_exact(demo, "file").target.exact and not linears_ab.with_exact(demo, "off").target.exact
