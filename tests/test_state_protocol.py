"""The timing protocol for drafters that keep state across requests (``persistent_state``).

The warm-up leaves no trace in such a drafter, each repeat starts from a fresh one, and within
a repeat the state carries across questions in file order, also across a resumed run. Token
Recycling on the tiny pair learns visibly from one generation (its table holds the target's
top-k of every node it saw), so a leak shows as other trees and other accept lengths.
"""

from __future__ import annotations

import json
import textwrap

import pytest

from specframe.experiments.experiment import run_experiment
from specframe.experiments.runs import RunDir, read_answers
from specframe.testing.fixtures import TINY_PAIR_TOML

N_PROMPTS = 4


class Interrupt(Exception):
    """Stands for a crash between two answers."""


def _config(tmp_path, warmup: int, repeats: int = 1, batch: str = "") -> str:
    rows = [{"question_id": i, "category": "a", "turns": [f"the cat sat on the mat {i} the cat sat"]}
            for i in range(N_PROMPTS)]
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = textwrap.dedent(f"""
        name = "state"
        max_new_tokens = 12
        warmup = {warmup}
        repeats = {repeats}
        stop_at_eos = false
        {batch}
        """) + TINY_PAIR_TOML + textwrap.dedent("""
        [[arm]]
        name = "recycle"
        policy = "chain"
        policy_options = { gamma = 3 }
        drafter = "recycle"

        [data]
        path = "prompts.jsonl"
        """)
    path = tmp_path / "exp.toml"
    path.write_text(text)
    return str(path)


def _shapes(out_dir, arm: str = "recycle") -> dict[tuple, list]:
    """Per (question, repeat): the accept lengths, which follow from the drafts the state made."""
    return {(r["question_id"], r["repeat"]): r["choices"][0]["accept_lengths"]
            for r in read_answers(RunDir(out_dir).answers(arm))}


def test_warmup_leaves_no_trace_and_each_repeat_starts_fresh(tmp_path) -> None:
    cold, warm = tmp_path / "cold", tmp_path / "warm"
    cold.mkdir(), warm.mkdir()
    run_experiment(_config(cold, warmup=0, repeats=2), out_dir=cold / "out", progress=False)
    run_experiment(_config(warm, warmup=2, repeats=2), out_dir=warm / "out", progress=False)
    a, b = _shapes(cold / "out"), _shapes(warm / "out")
    assert a == b, "the warm-up changed what a timed answer's drafter knew"
    for q in range(N_PROMPTS):
        assert a[q, 1] == a[q, 0], f"repeat 2 of question {q} drafted with what repeat 1 taught"
    # The state does carry within a repeat: the drafter is not simply reset per question.
    meta = json.loads((cold / "out" / "run.json").read_text())
    assert meta["protocol"]["stateful_arms"] == ["recycle"]
    from specframe.experiments.report import write_report

    write_report(cold / "out", plots=False)
    assert "draft with state kept across requests" in (cold / "out" / "report.md").read_text()


def test_a_resumed_repeat_rebuilds_the_state_it_would_have_had(tmp_path) -> None:
    full, cut = tmp_path / "full", tmp_path / "cut"
    full.mkdir(), cut.mkdir()
    run_experiment(_config(full, warmup=1), out_dir=full / "out", progress=False)
    seen: list = []

    def crash_after_two(arm: str, record: dict) -> None:
        seen.append(record["question_id"])
        if len(seen) == 2:
            raise Interrupt

    path = _config(cut, warmup=1)
    with pytest.raises(Interrupt):
        run_experiment(path, out_dir=cut / "out", progress=False, on_record=crash_after_two)
    outcome = run_experiment(path, out_dir=cut / "out", progress=False)
    assert outcome.computed == N_PROMPTS - 2
    assert _shapes(cut / "out") == _shapes(full / "out")


def test_batched_rows_start_fresh_after_the_warmup(tmp_path) -> None:
    cold, warm = tmp_path / "cold", tmp_path / "warm"
    cold.mkdir(), warm.mkdir()
    run_experiment(_config(cold, warmup=0, batch="batch_size = 2"), out_dir=cold / "out", progress=False)
    run_experiment(_config(warm, warmup=2, batch="batch_size = 2"), out_dir=warm / "out", progress=False)
    assert _shapes(cold / "out") == _shapes(warm / "out")
