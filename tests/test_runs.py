"""specframe.experiments.runs without any model: layout, answers store, run file, typed record."""

from __future__ import annotations

import json

import pytest

from specframe.errors import ExperimentError
from specframe.experiments.runs import AnswerRecord, AnswerStore, Choice, RunDir, RunFile, read_answers


def record(arm: str, qid, repeat: int = 0) -> AnswerRecord:
    choice = Choice(turns=["x"], new_tokens=[2], wall_time=[0.5], accept_lengths=[1, 1], decoding_steps=[2])
    return AnswerRecord(question_id=qid, category="c", answer_id=f"{arm}/{qid}/{repeat}", model_id="m", arm=arm,
                        repeat=repeat, greedy=True, tstamp=0.0, choice=choice, output_ids=[[3, 4]])


def test_store_appends_reads_back_and_repairs_a_half_written_line(tmp_path):
    with AnswerStore(tmp_path) as store:
        written = store.append(record("talon[mu=0.1]", 1))
    path = RunDir(tmp_path).answers("talon[mu=0.1]")
    assert path == tmp_path / "answers" / "talon.mu=0.1.jsonl"
    assert read_answers(path) == [written] and written["choices"][0]["new_tokens"] == [2]
    with path.open("a") as fh:
        fh.write('{"question_id": 2, "cho')  # a crash mid-write
    with AnswerStore(tmp_path) as store:
        with pytest.warns(UserWarning, match="half-written"):
            assert store.done("talon[mu=0.1]") == {("1", 0)}
        store.append(record("talon[mu=0.1]", "q2", repeat=1))
    assert [r["question_id"] for r in read_answers(path)] == [1, "q2"]
    assert AnswerRecord.from_dict(read_answers(path)[1]).key == ('"q2"', 1)


def test_foreign_spec_bench_records_read_with_defaults():
    rec = AnswerRecord.from_dict({"question_id": 7, "choices": [{"turns": ["a"], "new_tokens": [1]}], "x": 1})
    assert (rec.arm, rec.repeat, rec.choice.wall_time, rec.extra) == ("", 0, [], {"x": 1})


def test_run_file_refuses_other_experiments_and_changed_arms(tmp_path):
    run_file = RunFile(tmp_path)
    run_file.check("e", {"seed": 0}, {"a": {"policy": "chain"}}, repeats=1)
    run_file.record_greedy({"a": True})
    run_file.check("e", {"seed": 0}, {"b": {"policy": "talon"}}, repeats=2)  # a new arm: fine
    meta = run_file.read()
    assert set(meta["arms"]) == {"a", "b"} and meta["greedy"] == {"a": True} and meta["repeats"] == 2
    with pytest.raises(ExperimentError, match=r"differs in: seed"):
        run_file.check("e", {"seed": 1}, {}, repeats=1)
    with pytest.raises(ExperimentError, match="arm 'a' changed"):
        run_file.check("e", {"seed": 0}, {"a": {"policy": "eagle"}}, repeats=1)
    run_file.add_overflow_skipped([{"question_id": "long"}])
    assert run_file.overflow_skipped_ids() == {'"long"'}


def test_discard_removes_what_runs_write_and_nothing_else(tmp_path):
    run_dir = RunDir(tmp_path)
    for path in (run_dir.run_file, run_dir.summary, run_dir.report, run_dir.divergences, run_dir.answers("a"),
                 run_dir.plots / "speedup.png", tmp_path / "notes.txt"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({}))
    run_dir.discard()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
