"""Every answer tied to what produced it: run.json's checks, traces and curves, the answers store.

Cheap unit tests of the review findings of the staleness work (the command-line fault
injection is tests/test_fault_injection.py); each fails on a framework that lets the stale
result through.
"""

from __future__ import annotations

import json
import pathlib
import textwrap

import pytest
import torch

from specframe.experiments.config import ConfigError, parse_config
from specframe.errors import ExperimentError
from specframe.experiments.experiment import run_experiment
from specframe.replay.runner import _check_layers_of, step_model
from specframe.replay.trace import PromptTrace, Trace, TraceError, save_hidden
from specframe.experiments.runs import AnswerRecord, AnswerStore, Choice, RunFile, read_answers
from specframe.experiments.runs.jsonl import drop_partial_line
from specframe.experiments.runs.runfile import question_digest

ARM = {"policy": {"name": "chain"}}


# ---------------------------------------------------------------------- run.json
def test_a_fingerprint_key_only_the_old_run_has_is_a_difference(tmp_path) -> None:
    run = RunFile(tmp_path)
    run.check("x", {"seed": 0, "batch": {"size": 4}}, {"chain": ARM})
    with pytest.raises(ExperimentError, match="differs in: batch"):
        run.check("x", {"seed": 0}, {"chain": ARM})  # unbatched answers into a batched directory


def test_run_json_keeps_other_writers_blocks_through_a_check(tmp_path) -> None:
    run = RunFile(tmp_path)
    run.check("x", {"seed": 0}, {"chain": ARM})
    run.update(replay={"trace": "t"})
    run.check("x", {"seed": 0}, {"chain": ARM})
    assert run.read()["replay"] == {"trace": "t"}


def test_inputs_may_grow_but_not_change_or_shrink(tmp_path) -> None:
    run = RunFile(tmp_path)
    run.check("x", {}, {}, inputs={"0": "a", "1": "b"})
    run.check("x", {}, {}, inputs={"0": "a", "1": "b", "2": "c"})  # a question added
    with pytest.raises(ExperimentError, match=r"edited: questions 1"):
        run.check("x", {}, {}, inputs={"0": "a", "1": "B", "2": "c"})
    with pytest.raises(ExperimentError, match=r"no longer in the data: questions 2"):
        run.check("x", {}, {}, inputs={"0": "a", "1": "b"})


def test_the_digest_covers_text_and_prompt_ids() -> None:
    base = question_digest(1, "a", ["hello"], [1, 2])
    assert base != question_digest(1, "a", ["hellp"], [1, 2])
    assert base != question_digest(1, "a", ["hello"], [1, 3])  # another tokenizer or template
    assert base == question_digest(1, "a", ["hello"], [1, 2])


def test_an_arm_whose_file_name_clashes_ignoring_case_is_refused(tmp_path) -> None:
    run = RunFile(tmp_path)
    run.check("x", {}, {"Talon": ARM})
    with pytest.raises(ExperimentError, match="would share the answers file of arm 'Talon'"):
        run.check("x", {}, {"talon": ARM})


def test_arm_names_in_one_file_are_unique_ignoring_case(tmp_path) -> None:
    (tmp_path / "p.jsonl").write_text('{"prompt": "hi"}\n')
    raw = {"target": {"model": "random:llama"}, "data": {"path": "p.jsonl"},
           "arm": [{"name": "Chain", "policy": "chain", "drafter": "ngram"},
                   {"name": "chain", "policy": "chain", "drafter": "ngram"}]}
    with pytest.raises(ConfigError, match="duplicated"):
        parse_config(raw, base=tmp_path)


# ---------------------------------------------------------------------- answers store
def _record(arm: str, qid: int) -> AnswerRecord:
    return AnswerRecord(question_id=qid, category="a", answer_id="", model_id="m", arm=arm, repeat=0, greedy=True,
                        tstamp=0.0, choice=Choice(["t"], [1], [0.1], [1], [1]))


def test_done_counts_only_the_arms_own_records(tmp_path) -> None:
    store = AnswerStore(tmp_path)
    store.append(_record("talon", 0))
    store.close()
    # A record of another arm in the file (an arm whose name slugs alike wrote it).
    with store.path("talon").open("a") as fh:
        fh.write(json.dumps(_record("TALON", 1).to_dict()) + "\n")
    assert store.done("talon") == {("0", 0)}


def test_repairing_a_torn_file_truncates_in_place(tmp_path, monkeypatch) -> None:
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": 2}\n{"a": ')

    def crash(self, data):  # a rewrite that dies after opening: what a crash mid-repair leaves
        self.open("wb").close()
        raise OSError("disk full")

    monkeypatch.setattr(pathlib.Path, "write_bytes", crash)
    monkeypatch.setattr(pathlib.Path, "write_text", crash)
    drop_partial_line(path)
    assert path.read_bytes() == b'{"a": 1}\n{"a": 2}\n'


def test_a_torn_answers_file_keeps_every_finished_record(tmp_path) -> None:
    store = AnswerStore(tmp_path)
    for q in range(3):
        store.append(_record("chain", q))
    store.close()
    with store.path("chain").open("ab") as fh:
        fh.write(b'{"question_id": 3, "arm": "ch')
    with pytest.warns(UserWarning, match="half-written"):
        assert [r["question_id"] for r in read_answers(store.path("chain"))] == [0, 1, 2]


# ---------------------------------------------------------------------- traces and curves
def _trace(tmp_path, layers: list[int], rows: int | None = None) -> Trace:
    prompt, cont = [1, 2, 3], [4, 5]
    states = {i: torch.zeros(rows or len(prompt) + len(cont), 4) for i in layers}
    rel, sha = save_hidden(tmp_path, 0, states)
    trace = Trace({"model_label": "LlamaForCausalLM-3be4fface7", "dtype": "float64"}, {},
                  {"p": PromptTrace("p", prompt, cont, 2, hidden_file=rel, hidden_sha1=sha)}, {}, layers)
    trace.save(tmp_path, None)
    return trace


def test_hidden_states_of_the_wrong_length_are_refused_on_load(tmp_path) -> None:
    _trace(tmp_path, [1], rows=4)  # one row short: another prompt's states
    with pytest.raises(TraceError, match="5 positions expected"):
        Trace.load(tmp_path)


def test_a_hidden_file_replaced_after_recording_is_refused(tmp_path) -> None:
    trace = _trace(tmp_path, [1])
    save_hidden(tmp_path, 0, {1: torch.ones(5, 4)})  # same shape, other content
    loaded = Trace.load(tmp_path)
    with pytest.raises(TraceError, match="hash differs"):
        loaded.hidden(loaded.prompts["p"], torch.device("cpu"))
    del trace


class _Reader:
    """A drafter that reads hidden layer ``layer`` (as an EAGLE head with its own layer ids)."""

    name = "reader"
    needs_target_hidden = True

    def __init__(self, layer: int) -> None:
        self.layer = layer

    def begin(self, prompt_ids, target_hidden=None) -> None:
        target_hidden[self.layer].sum()


def test_a_drafter_reading_unrecorded_layers_is_named(tmp_path) -> None:
    from specframe.testing.fixtures import tiny_target

    trace = Trace.load(_trace(tmp_path, [1]).path)
    _check_layers_of(trace, _Reader(1), tiny_target(), "arm 'x'")
    with pytest.raises(TraceError, match=r"drafter 'reader' reads hidden layers \[2\].*stored \[1\]"):
        _check_layers_of(trace, _Reader(2), tiny_target(), "arm 'x'")


def _curve_file(tmp_path, key: str, sizes=(1, 2, 4)) -> pathlib.Path:
    path = tmp_path / f"{key[:5]}.json"
    path.write_text(json.dumps({"key": key, "sizes": list(sizes), "cache_lens": [0],
                                "seconds": [[0.01 * n for n in sizes]]}))
    return path


def test_a_curve_of_another_model_is_refused(tmp_path) -> None:
    trace = _trace(tmp_path, [1])
    other = _curve_file(tmp_path, "Qwen2ForCausalLM-0123456789_cpu_float64_t1_torch2.13.0")
    with pytest.raises(TraceError, match="measured for Qwen2ForCausalLM"):
        step_model(trace, other)
    same = _curve_file(tmp_path, "LlamaForCausalLM-3be4fface7-native_cuda_float64_t8_torch2.11.0")
    assert step_model(trace, same).identity["key"].startswith("LlamaForCausalLM")  # another machine: fine


def test_a_malformed_curve_is_refused_in_one_line(tmp_path) -> None:
    trace = _trace(tmp_path, [1])
    bad = _curve_file(tmp_path, "synthetic", sizes=(1, 2, 2))
    with pytest.raises(TraceError, match="not a valid curve"):
        step_model(trace, bad)


# ---------------------------------------------------------------------- context
SHORT = """
name = "short"
max_new_tokens = 16
warmup = 0
stop_at_eos = false

[target]
model = "random:llama"
dtype = "float64"
random = {{ vocab_size = 64, hidden = 32, layers = 2, seed = 0, max_positions = {target} }}

[models.draft]
model = "random:llama"
dtype = "float64"
random = {{ vocab_size = 64, hidden = 32, layers = 1, seed = 1, max_positions = {draft} }}

[[arm]]
name = "model"
policy = "chain"
policy_options = {{ gamma = 2 }}
drafter = "model"
drafter_options = {{ model = "draft" }}

[data]
path = "p.jsonl"
on_overflow = "{mode}"
"""


def _short(tmp_path, target: int, draft: int, mode: str, turns: list[list[str]]) -> pathlib.Path:
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"question_id": i, "turns": t}) + "\n"
                                              for i, t in enumerate(turns)))
    path = tmp_path / "exp.toml"
    path.write_text(textwrap.dedent(SHORT.format(target=target, draft=draft, mode=mode)))
    return path


def test_skip_leaves_out_a_question_whose_later_turn_cannot_fit(tmp_path) -> None:
    # Turn 2 comes after a 16-token answer: 10 + 16 + 10 + 16 > 48 positions.
    path = _short(tmp_path, 48, 48, "skip", [["a" * 9], ["b" * 9, "c" * 9]])
    run_experiment(path, out_dir=tmp_path / "out", progress=False)
    meta = json.loads((tmp_path / "out" / "run.json").read_text())
    assert [s["question_id"] for s in meta["overflow_skipped"]] == [1]
    assert [r["question_id"] for r in read_answers(tmp_path / "out" / "answers" / "model.jsonl")] == [0]


def test_a_draft_with_fewer_positions_bounds_the_context(tmp_path) -> None:
    path = _short(tmp_path, 128, 24, "error", [["a" * 12]])  # 13 + 16 > 24: the draft's limit
    with pytest.raises(ExperimentError, match="arm 'model''s draft model"):
        run_experiment(path, out_dir=tmp_path / "out", progress=False)
    path = _short(tmp_path, 128, 24, "skip", [["a" * 12], ["a" * 4]])
    run_experiment(path, out_dir=tmp_path / "out2", progress=False)
    meta = json.loads((tmp_path / "out2" / "run.json").read_text())
    assert [(s["question_id"], s["max_positions"]) for s in meta["overflow_skipped"]] == [(0, 24)]
