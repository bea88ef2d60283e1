"""``batch_size`` in an experiment file: prompts decoded in batches, batched autoregressive as the
baseline, every batched answer equal to the unbatched run's, wall times that add up to the batch's."""

from __future__ import annotations

import json
import textwrap

import pytest

from specframe.decode.allocate import allocator_classes
from specframe.experiments.config import ConfigError, load_config
from specframe.experiments.experiment import run_experiment
from specframe.experiments.runs import read_answers
from specframe.testing.fixtures import TINY_PAIR_TOML

CONFIG = """
name = "tiny-batch"
max_new_tokens = 10
warmup = 1
stop_at_eos = false
threads = 1
{batch}
{pair}
[[arm]]
baseline = "autoregressive"

[[arm]]
policy = "talon"
policy_options = {{ budget = 6 }}
{extra_arm}
[data]
path = "prompts.jsonl"

[output]
dir = "{out}"
"""


def write(tmp_path, batch: str, out: str, extra_arm: str = "", turns: int = 1):
    rows = [{"question_id": i, "category": "a", "turns": [f"q{i} " + "x" * (3 * i + 1)] * turns} for i in range(5)]
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = tmp_path / f"{out}.toml"
    path.write_text(textwrap.dedent(CONFIG.format(batch=batch, pair=TINY_PAIR_TOML, out=out, extra_arm=extra_arm)))
    return path


def answers(out_dir) -> dict:
    """Every record of a run by (arm, question_id)."""
    return {(path.stem, r["question_id"]): r for path in sorted((out_dir / "answers").glob("*.jsonl"))
            for r in read_answers(path)}


def test_batched_run_answers_like_the_unbatched_one(tmp_path):
    single = run_experiment(write(tmp_path, "", "single")).out_dir
    batched = run_experiment(write(tmp_path, 'batch_size = 2\nbatch_allocator = "shared"\nbatch_budget = 4',
                                   "batched")).out_dir
    one, many = answers(single), answers(batched)
    assert one.keys() == many.keys() and len(many) == 10
    for key, record in many.items():
        assert record["output_ids"] == one[key]["output_ids"], key
        assert record["batch"]["size"] in (1, 2)
        assert "batch" not in one[key]
    for arm in {name for name, _ in many}:
        # Shares of one batch's wall time add up to it (5 prompts: batches of 2, 2, 1).
        by_batch: dict = {}
        for (name, qid), record in many.items():
            if name == arm:
                by_batch.setdefault(qid // 2, []).append(record)
        assert sorted(len(rows) for rows in by_batch.values()) == [1, 2, 2]
        for rows in by_batch.values():
            total = sum(r["choices"][0]["wall_time"][0] for r in rows)
            assert total == pytest.approx(rows[0]["batch"]["wall"], rel=1e-3)


def test_batched_runs_refuse_what_cannot_batch(tmp_path):
    with pytest.raises(ConfigError, match="batch_allocator 'nope' is not one of ") as refused:
        load_config(write(tmp_path, 'batch_size = 2\nbatch_allocator = "nope"', "bad"))
    named = str(refused.value).rsplit("is not one of ", 1)[1].split(", ")
    assert sorted(named) == sorted(allocator_classes())  # every valid one, whatever plugins add
    assert {"equal", "shared", "acceptance"} <= set(named)
    with pytest.raises(ConfigError, match="arms \\['hf-prompt-lookup'\\] are baselines that do not batch"):
        load_config(write(tmp_path, "batch_size = 2", "bad2", '\n[[arm]]\nbaseline = "hf-prompt-lookup"\n'))
    with pytest.raises(Exception, match="has 2 turns; batched runs take single-turn questions only"):
        run_experiment(write(tmp_path, "batch_size = 2", "multi", turns=2))


def test_a_refilled_run_answers_like_the_unbatched_one(tmp_path):
    """batch_refill: one window of all questions with at most B live, autoregressive refilled too."""
    single = run_experiment(write(tmp_path, "", "single")).out_dir
    refilled = run_experiment(write(tmp_path, "batch_size = 2\nbatch_refill = true", "refilled")).out_dir
    one, many = answers(single), answers(refilled)
    assert one.keys() == many.keys() and len(many) == 10
    for key, record in many.items():
        assert record["output_ids"] == one[key]["output_ids"], key
        assert record["batch"]["size"] == 2 and record["batch"]["refill"] is True
        assert 0 < record["batch"]["latency"] <= record["batch"]["wall"]
    for arm in {name for name, _ in many}:
        rows = [r for (name, _), r in many.items() if name == arm]
        # One window: the shares of its wall time add up to it.
        assert sum(r["choices"][0]["wall_time"][0] for r in rows) == pytest.approx(rows[0]["batch"]["wall"], rel=1e-3)


def test_batch_refill_needs_rows_to_refill(tmp_path):
    with pytest.raises(ConfigError, match="batch_refill = true needs batch_size >= 2"):
        load_config(write(tmp_path, "batch_refill = true", "bad"))
