"""benchmarks/step_overhead.py's core on the shipped tiny pair: every arm in the table, and the
engine's fields account for each generation's wall time."""

from __future__ import annotations

from benchmark_scripts import benchmark_script


def test_step_overhead_table_has_every_arm_and_its_fields_add_up():
    step_overhead = benchmark_script("step_overhead")
    rows, _ = step_overhead.measure_pair("tiny", prompts=1, tokens=4, threads=1, reps=2)
    names = [r["arm"] for r in rows]
    assert {"autoregressive", "hf-assisted", "hf-prompt-lookup", "chain", "eagle3+talon", "ngram+talon"} <= set(names)
    table = step_overhead.format_table(rows)
    assert all(name in table for name in names) and "engine" in table.splitlines()[0]
    for r in rows:
        assert r["step ms"] > 0 and r["TTFT ms"] > 0 and 0 < r["prefill %"] < 100, r
        if r["kind"] == "spec":
            assert r["check %"] < 2, r
            assert r["draft fwd"] > 0 or r["arm"].startswith("ngram"), r  # model-free: no modules
    assert next(r for r in rows if r["arm"] == "ngram+talon")["draft fwd"] == 0
    assert len(step_overhead.break_even(rows)) == sum(r["kind"] == "spec" for r in rows)
