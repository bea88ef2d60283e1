"""The run report's time to first token and prefill share: recorded per turn by every arm that
can time them honestly, shown per arm, and "-" for records written before them."""

from __future__ import annotations

import json
import textwrap

import pytest

from specframe.experiments.experiment import run_experiment
from specframe.experiments.metrics import first_token, load_run, summarize
from specframe.experiments.report import COLUMNS, first_token_cells, markdown, row, summary_table, write_report
from specframe.experiments.runs import AnswerRecord, RunDir, read_answers

CONFIG = """
name = "ttft"
max_new_tokens = 8
warmup = 1
repeats = 1
stop_at_eos = false
threads = 1

[target]
model = "demo-target"
dtype = "float32"
device = "cpu"

[models.draft]
model = "demo-draft"

[drafter]
name = "model"
options = { model = "draft" }

[[arm]]
baseline = "autoregressive"

[[arm]]
baseline = "hf-prompt-lookup"

[[arm]]
policy = "chain"
policy_options = { gamma = 3 }

[data]
path = "prompts.jsonl"
chat_template = false

[output]
dir = "out"
trees_per_answer = 0
"""


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A run of the shipped tiny pair (2 prompts x 8 tokens) and its summary."""
    tmp = tmp_path_factory.mktemp("ttft")
    rows = [{"question_id": i, "turns": [f"def add_{i}(a, b):\n    return a + b\n\n\ndef"]} for i in range(2)]
    (tmp / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp / "exp.toml").write_text(textwrap.dedent(CONFIG))
    outcome = run_experiment(tmp / "exp.toml", progress=False)
    return outcome.out_dir, write_report(outcome.out_dir, plots=False)


def test_records_keep_prefill_and_first_token_per_turn(tiny_run):
    out, _ = tiny_run
    run_dir = RunDir(out)
    for arm in ("autoregressive", "chain"):
        for rec in read_answers(run_dir.answers(arm)):
            wall = rec["choices"][0]["wall_time"][0]
            (prefill,), (ttft,) = rec["prefill_time"], rec["time_to_first_token"]
            assert 0 < prefill <= ttft <= wall, (arm, prefill, ttft, wall)
            assert AnswerRecord.from_dict(rec).to_dict()["prefill_time"] == [prefill]
    for rec in read_answers(run_dir.answers("hf-prompt-lookup")):
        # transformers merges the prefill into its first verification forward: not timed apart
        assert "prefill_time" not in rec
        assert 0 < rec["time_to_first_token"][0] <= rec["choices"][0]["wall_time"][0]


def test_report_shows_ttft_and_prefill_share_per_arm(tiny_run):
    out, summary = tiny_run
    assert "TTFT ms" in COLUMNS and "prefill %" in COLUMNS
    arms = {a["name"]: a for a in summary["arms"]}
    for name in ("autoregressive", "chain"):
        m = arms[name]["overall"]
        assert 0 < m["prefill_share"] < 1
        assert 0 < m["ttft"] <= m["wall_time"] / m["answers"]
    hf = arms["hf-prompt-lookup"]["overall"]
    assert hf["prefill_share"] is None and 0 < hf["ttft"] <= hf["wall_time"] / hf["answers"]
    cells = dict(zip(COLUMNS, row(arms["hf-prompt-lookup"], hf, summary["baseline"])))
    assert cells["prefill %"] == "-" and cells["TTFT ms"] != "-"
    report = RunDir(out).report.read_text()
    assert "| TTFT ms | prefill % |" in report
    headers = [c.header for c in summary_table(summary).columns]
    assert headers.index("TTFT ms") + 1 == headers.index("prefill %")


def test_old_records_without_the_keys_still_report(tiny_run, tmp_path):
    out, _ = tiny_run
    run = load_run(out)
    for records in run["arms"].values():
        for rec in records:  # as written before these keys existed
            rec.pop("prefill_time", None)
            rec.pop("time_to_first_token", None)
    summary = summarize(run)
    for arm in summary["arms"]:
        assert arm["overall"]["ttft"] is None and arm["overall"]["prefill_share"] is None
        cells = dict(zip(COLUMNS, row(arm, arm["overall"], summary["baseline"])))
        assert cells["TTFT ms"] == "-" and cells["prefill %"] == "-"
    assert "| TTFT ms | prefill % |" in markdown(summary, {})
    old = AnswerRecord.from_dict(run["arms"]["chain"][0])
    assert old.prefill_time is None and "prefill_time" not in old.to_dict()


def test_first_token_uses_only_turns_that_recorded_it():
    def rec(walls, prefill=None, ttft=None):
        r = {"choices": [{"wall_time": walls}]}
        if prefill is not None:
            r["prefill_time"], r["time_to_first_token"] = prefill, ttft
        return r

    got = first_token([rec([1.0, 3.0], [0.5, None], [0.6, 0.2]), rec([10.0])])
    assert got["prefill_share"] == pytest.approx(0.5)  # the second turn and the old record are left out
    assert got["ttft"] == pytest.approx(0.4)
    assert first_token([rec([1.0])]) == {"ttft": None, "prefill_share": None}
    assert first_token_cells({"ttft": 0.0123, "prefill_share": 0.25}) == ["12.3", "25.0"]
