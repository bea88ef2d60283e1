"""The benchmark scripts run (CI runs the GPU suite's smoke mode on the CPU)."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_gpu_suite_smoke_writes_json_and_summary(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_suite.py"), "--smoke", "--out", str(tmp_path)],
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
    assert result["compile"]["same_tokens"] is True, result["compile"]
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
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import auto_sizing
    finally:
        sys.path.pop(0)

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
