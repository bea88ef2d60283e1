"""Task accuracy: answer extraction, scoring, reference answers in questions, metrics and report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specframe.experiments.accuracy import extract_answer, is_correct, normalize_number, score
from specframe.experiments.data import DataError, Question, load_questions
from specframe.experiments.metrics import load_run, summarize
from specframe.experiments.report import markdown, summary_table, write_report
from specframe.experiments.runs import AnswerRecord, AnswerStore, Choice, RunDir, RunFile

GSM8K_STYLE = Path(__file__).resolve().parent.parent / "examples" / "prompts" / "gsm8k-style.jsonl"


# ---------------------------------------------------------------------- extraction and scoring
@pytest.mark.parametrize("text, expected", [
    ("She has 3 apples, then 4 more.\n#### 7", "7"),
    ("#### 42 and later text mentions 99", "42"),  # the number after the marker wins
    ("First 5, then #### 6, then #### 8", "8"),  # the last marker counts
    ("12 + 30 = 42. The answer is 42.", "42"),  # no marker: the last number, trailing "." dropped
    ("The total is 1,234,567 items", "1234567"),
    ("It costs $1,200 in all.", "1200"),
    ("Each costs $4.50", "4.5"),
    ("So x = 12.0", "12"),
    ("The temperature fell to -5 degrees", "-5"),
    ("Pages 3-4 are missing", "4"),  # a hyphen after a digit is no minus sign
    ("13 apples in all.\n#### none", "13"),  # a marker with no number: the last number
    ("There is no number in this answer.", None),
    ("", None),
])
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_normalize_number():
    assert normalize_number("$1,000.00") == "1000"
    assert normalize_number("-0") == "0"
    assert normalize_number("7.") == "7"
    assert normalize_number("seven") is None
    assert normalize_number("nan") is None


def test_is_correct():
    assert is_correct("so she pays 20 dollars. #### 20", 20)
    assert is_correct("The answer is $1,200.", "1200")
    assert is_correct("The answer is 12.0", 12)
    assert is_correct("The answer is 2.5", 2.5)
    assert not is_correct("The answer is 21", 20)
    assert not is_correct("I do not know", 20)
    assert not is_correct("The answer is 20", None)
    # A non-numeric reference matches the text after the marker (or the last line).
    assert is_correct("Reasoning...\n#### Paris.", "paris")
    assert is_correct("Reasoning...\nParis", "Paris")
    assert not is_correct("Reasoning...\nLyon", "Paris")


def test_score_skips_questions_without_references():
    assert score([("#### 1", None)]) is None
    assert score([]) is None
    assert score([("#### 1", 1), ("#### 2", 3), ("#### 5", None)]) == {"accuracy": 0.5, "correct": 1, "scored": 2}


# ---------------------------------------------------------------------- questions
def write_lines(path: Path, lines: list) -> Path:
    path.write_text("".join(json.dumps(obj) + "\n" for obj in lines), encoding="utf-8")
    return path


def test_question_answer_is_optional(tmp_path):
    path = write_lines(tmp_path / "q.jsonl", [
        {"question_id": 0, "category": "math", "turns": ["1 + 1?"], "answer": 2},
        {"question_id": 1, "category": "math", "turns": ["Capital of France?"], "answer": "Paris"},
        {"question_id": 2, "category": "writing", "turns": ["A poem"]},
        {"prompt": "plain", "answer": 2.5},
    ])
    qs = load_questions(path)
    assert [q.answer for q in qs] == [2, "Paris", None, 2.5]
    assert qs[2] == Question(2, "writing", ("A poem",))


@pytest.mark.parametrize("bad", [[1], {"x": 1}, True])
def test_question_answer_of_another_type_is_refused(tmp_path, bad):
    path = write_lines(tmp_path / "q.jsonl", [{"question_id": 0, "turns": ["q"], "answer": bad}])
    with pytest.raises(DataError) as err:
        load_questions(path)
    message = str(err.value)
    assert "q.jsonl:1" in message and "'answer' must be a number or a string" in message
    assert "\n" not in message


def test_gsm8k_style_prompts_load_with_numeric_answers():
    qs = load_questions(GSM8K_STYLE)
    assert [q.question_id for q in qs] == list(range(20))
    assert {q.category for q in qs} == {"math"}
    for q in qs:
        assert isinstance(q.answer, (int, float)) and not isinstance(q.answer, bool), q
        assert len(q.turns) == 1 and q.turns[0].strip()


# ---------------------------------------------------------------------- metrics and report
def make_record(arm: str, qid, category: str, text: str) -> AnswerRecord:
    choice = Choice(turns=["first turn", text], new_tokens=[2, 2], wall_time=[0.5, 0.5],
                    accept_lengths=[1, 1, 1, 1], decoding_steps=[2, 2])
    return AnswerRecord(question_id=qid, category=category, answer_id=f"{arm}/{qid}/0", model_id="m", arm=arm,
                        repeat=0, greedy=True, tstamp=0.0, choice=choice)


def make_run(tmp_path: Path, references: dict | None) -> Path:
    """A run directory of two arms over four questions (two math, two chat), no model needed."""
    arms = {"autoregressive": {"baseline": "autoregressive"}, "chain": {"drafter": "ngram"}}
    run_file = RunFile(tmp_path)
    run_file.check("acc", {"target": "m"}, arms, max_new_tokens=8, repeats=1, target="m", torch="x")
    if references is not None:
        # What the experiment is to record: question id as JSON -> reference answer.
        run_file.update(references=references)
    texts = {
        "autoregressive": {0: "so #### 12", 1: "it is 7", "c1": "Paris", "c2": "hello"},
        "chain": {0: "so #### 12.0", 1: "it is 8", "c1": "Lyon", "c2": "hello"},
    }
    categories = {0: "math", 1: "math", "c1": "chat", "c2": "chat"}
    store = AnswerStore(tmp_path)
    for arm, by_q in texts.items():
        for qid, text in by_q.items():
            store.append(make_record(arm, qid, categories[qid], text))
    store.close()
    return tmp_path


REFERENCES = {json.dumps(0): 12, json.dumps(1): "7", json.dumps("c1"): "Paris"}  # "c2" has none


def test_metrics_accuracy_overall_and_per_category(tmp_path):
    summary = summarize(load_run(make_run(tmp_path, REFERENCES)))
    arms = {a["name"]: a for a in summary["arms"]}
    ar, chain = arms["autoregressive"], arms["chain"]
    assert (ar["overall"]["accuracy"], ar["overall"]["correct"], ar["overall"]["scored"]) == (1.0, 3, 3)
    assert (chain["overall"]["correct"], chain["overall"]["scored"]) == (1, 3)
    assert chain["overall"]["accuracy"] == pytest.approx(1 / 3)
    assert chain["categories"]["math"]["accuracy"] == 0.5
    assert (chain["categories"]["chat"]["correct"], chain["categories"]["chat"]["scored"]) == (0, 1)
    assert chain["categories"]["chat"]["accuracy"] == 0.0


def test_metrics_accuracy_absent_without_references(tmp_path):
    summary = summarize(load_run(make_run(tmp_path, None)))
    for arm in summary["arms"]:
        assert "accuracy" not in arm["overall"]
        assert all("accuracy" not in m for m in arm["categories"].values())
    text = markdown(summary, {})
    assert "accuracy" not in text
    assert [c.header for c in summary_table(summary).columns][-1] == "mismatches vs AR"


def test_metrics_accuracy_absent_for_a_category_without_references(tmp_path):
    summary = summarize(load_run(make_run(tmp_path, {json.dumps(0): 12})))
    chain = next(a for a in summary["arms"] if a["name"] == "chain")
    assert chain["overall"]["accuracy"] == 1.0 and chain["overall"]["scored"] == 1
    assert "accuracy" in chain["categories"]["math"]
    assert "accuracy" not in chain["categories"]["chat"]


def test_report_shows_the_accuracy_column(tmp_path):
    run_dir = make_run(tmp_path, REFERENCES)
    summary = write_report(run_dir, plots=False)
    text = RunDir(run_dir).report.read_text(encoding="utf-8")
    header = next(line for line in text.splitlines() if line.startswith("| arm |"))
    assert header.rstrip(" |").endswith("accuracy")
    assert "| 1.00 (3/3) |" in text and "| 0.33 (1/3) |" in text  # overall
    assert "| 0.50 (1/2) |" in text and "| 0.00 (0/1) |" in text  # per category (math, chat)
    assert "- accuracy:" in text  # the definition
    table = summary_table(summary)
    assert [c.header for c in table.columns][-1] == "accuracy"
    assert list(table.columns[-1].cells) == ["1.00 (3/3)", "0.33 (1/3)"]
    saved = json.loads(RunDir(run_dir).summary.read_text(encoding="utf-8"))
    assert saved["arms"][0]["overall"]["accuracy"] == 1.0


def test_report_shows_dash_for_an_arm_without_accuracy(tmp_path):
    # Only the chain arm answered a referenced question: the autoregressive arm gets "-".
    run_dir = make_run(tmp_path, REFERENCES)
    summary = summarize(load_run(run_dir))
    for arm in summary["arms"]:
        if arm["name"] == "autoregressive":
            for metrics in [arm["overall"], *arm["categories"].values()]:
                for key in ("accuracy", "correct", "scored"):
                    metrics.pop(key, None)
    text = markdown(summary, {})
    ar_row = next(line for line in text.splitlines() if line.startswith("| autoregressive |"))
    assert ar_row.rstrip(" |").endswith("| -")
    assert list(summary_table(summary).columns[-1].cells) == ["-", "0.33 (1/3)"]


def test_an_experiment_records_the_references_it_is_scored_against(tmp_path) -> None:
    from specframe.experiments.experiment import run_experiment
    from specframe.experiments.report import write_report

    (tmp_path / "exp.toml").write_text(
        'name = "acc"\nmax_new_tokens = 4\nwarmup = 0\nstop_at_eos = false\n'
        '[target]\nmodel = "random:llama"\ndtype = "float64"\n'
        'random = { vocab_size = 64, hidden = 32, layers = 2, seed = 0 }\n'
        '[[arm]]\nbaseline = "autoregressive"\n'
        f'[data]\npath = "{GSM8K_STYLE}"\nlimit = 3\n')
    outcome = run_experiment(tmp_path / "exp.toml", out_dir=tmp_path / "out", progress=False)
    meta = json.loads((tmp_path / "out" / "run.json").read_text())
    want = {json.dumps(q.question_id): q.answer for q in load_questions(GSM8K_STYLE, None, 3)}
    assert meta["references"] == want
    summary = write_report(outcome.out_dir, plots=False)
    assert summary["arms"][0]["overall"]["scored"] == 3
