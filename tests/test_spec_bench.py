"""``specframe bench spec-bench``: Spec-Bench's speed rule by hand, the leaderboard's layout and
order, mismatch counting, summary.json's names, resume and staleness through the run, the
category check, and the shipped sample (tiny random models, no timing asserts)."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from specframe.cli import cli
from specframe.experiments.spec_bench.leaderboard import leaderboard, mean_accepted_tokens, speedup
from specframe.experiments.spec_bench.table import COLUMNS, equality_lines, markdown_table
from specframe.experiments.spec_bench.tasks import TASK_KEYS, VALID_CATEGORIES, task_of

ROOT = Path(__file__).resolve().parent.parent
QUESTIONS = Path(__file__).parent / "data" / "spec_bench" / "questions.jsonl"
SAMPLE = ROOT / "examples" / "prompts" / "spec-bench-sample.jsonl"


def record(qid, category, tokens, wall, accept=(1,), out=None, repeat=0, arm="a"):
    """One answer as the harness writes it (the keys the leaderboard reads)."""
    return {"question_id": qid, "category": category, "repeat": repeat, "arm": arm,
            "answer_id": f"{arm}/{qid}/{repeat}",
            "choices": [{"new_tokens": [tokens], "wall_time": [wall], "accept_lengths": list(accept)}],
            "output_ids": [out if out is not None else [qid] * tokens]}


# ---------------------------------------------------------------- the speed rule
def test_speedup_is_the_mean_speed_over_the_baselines_mean_speed():
    """By hand: the arm runs 10 tok/s on both questions (mean 10); the baseline 5 and 30 tok/s
    (mean 17.5): 10 / 17.5. Neither the ratio of totals (40/4 over 40/3 = 0.75) nor the mean of
    per-question ratios ((2 + 1/3) / 2) is Spec-Bench's rule."""
    arm = [record(1, "qa", 10, 1.0), record(2, "qa", 30, 3.0)]
    base = [record(1, "qa", 10, 2.0), record(2, "qa", 30, 1.0)]
    got = speedup(arm, base)
    assert got["speedup"] == pytest.approx(10 / 17.5)
    assert got["tokens_per_second"] == pytest.approx(10.0)
    assert got["baseline_tokens_per_second"] == pytest.approx(17.5)
    assert got["speedup"] != pytest.approx(0.75) and got["speedup"] != pytest.approx(7 / 6)


def test_repeats_average_their_ratios_as_get_mean_speedup_does():
    arm = [record(1, "qa", 10, 1.0, repeat=0), record(1, "qa", 10, 1.0, repeat=1)]
    base = [record(1, "qa", 10, 2.0, repeat=0), record(1, "qa", 10, 4.0, repeat=1)]
    got = speedup(arm, base)
    assert got["speedup_repeats"] == pytest.approx([2.0, 4.0])
    assert got["speedup"] == pytest.approx(3.0)


def test_mean_accepted_tokens_pools_every_step():
    assert mean_accepted_tokens([record(1, "qa", 4, 1.0, accept=(4,)), record(2, "qa", 2, 1.0, accept=(1, 1))]) \
        == pytest.approx(2.0)  # (4 + 1 + 1) / 3; the mean of per-answer means would be 2.5


def test_tasks_group_mt_benchs_categories_and_overall_pools_the_tasks():
    assert task_of("writing") == task_of("humanities") == task_of("mt_bench") == "mt_bench"
    assert task_of("rag") == "rag" and task_of("code") is None
    arms = {"base": [record(1, "writing", 10, 1.0), record(2, "rag", 10, 1.0)],
            "fast": [record(1, "writing", 10, 0.5), record(2, "rag", 10, 1.0)]}
    board = leaderboard(arms, "base", {"base": True, "fast": True})
    fast = next(a for a in board["arms"] if a["arm"] == "fast")
    assert set(fast["tasks"]) == {"mt_bench", "rag"} and board["tasks"] == ["mt_bench", "rag"]
    assert fast["tasks"]["mt_bench"]["speedup"] == pytest.approx(2.0)
    assert fast["speedup"] == pytest.approx(15 / 10)  # mean(20, 10) over mean(10, 10)


def _load_speed_py():
    """Spec-Bench's own ``evaluation/speed.py`` (vendored unmodified, Apache-2.0), loaded by file
    path with a stand-in for the one name it imports from transformers: a tokenizer whose ids
    are a BOS and one id per space-separated word (speed.py drops one id, the BOS)."""
    import importlib.util
    import sys
    import types

    class Tokenizer:
        @classmethod
        def from_pretrained(cls, _path):
            return cls()

        def __call__(self, text):
            return types.SimpleNamespace(input_ids=[0] + text.split())

    fake = types.ModuleType("transformers")
    fake.AutoTokenizer = Tokenizer
    spec = importlib.util.spec_from_file_location("spec_bench_speed", QUESTIONS.parent / "speed.py")
    module = importlib.util.module_from_spec(spec)
    real = sys.modules.get("transformers")
    sys.modules["transformers"] = fake
    try:
        spec.loader.exec_module(module)
    finally:
        if real is not None:
            sys.modules["transformers"] = real
        else:
            del sys.modules["transformers"]
    return module


SPEED_PY = _load_speed_py()
#: speed.py's own task names, "overall" last; its MT-bench is the eight categories, not "mt_bench".
SPEED_TASKS = (*TASK_KEYS, "overall")
CATEGORIES = [c for c in VALID_CATEGORIES if c != "mt_bench"]


@st.composite
def answer_pairs(draw):
    """The same questions answered by an arm and by the baseline: turns, tokens, seconds and
    accept lengths drawn independently for each."""
    n = draw(st.integers(1, 8))
    cats = draw(st.lists(st.sampled_from(CATEGORIES), min_size=n, max_size=n))
    pair = []
    for arm in ("arm", "base"):
        rows = []
        for qid, cat in enumerate(cats):
            turns = draw(st.integers(1, 2))
            tokens = draw(st.lists(st.integers(1, 40), min_size=turns, max_size=turns))
            walls = draw(st.lists(st.floats(0.01, 3.0), min_size=turns, max_size=turns))
            accept = draw(st.lists(st.integers(1, 6), min_size=1, max_size=6))
            rows.append({"question_id": qid, "category": cat, "repeat": 0, "arm": arm,
                         "choices": [{"turns": [" ".join(["w"] * t) for t in tokens], "new_tokens": tokens,
                                      "wall_time": walls, "accept_lengths": accept}],
                         "output_ids": [[1] * t for t in tokens]})
        pair.append(rows)
    return pair


@settings(max_examples=60, deadline=None)
@given(answer_pairs())
def test_speedup_and_mat_equal_spec_benchs_speed_py(pair):
    """Per task and overall, the leaderboard's speedup and #MAT are what Spec-Bench's own
    ``speed()`` computes from the same two answer files."""
    import tempfile

    import numpy as np

    arm, base = pair
    board = leaderboard({"base": base, "arm": arm}, "base", {})
    row = next(a for a in board["arms"] if a["arm"] == "arm")
    with tempfile.TemporaryDirectory() as tmp:
        files = [Path(tmp) / "arm.jsonl", Path(tmp) / "base.jsonl"]
        for path, rows in zip(files, pair):
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        for task in SPEED_TASKS:
            ours = row if task == "overall" else row["tasks"].get(task)
            if ours is None:
                assert not [r for r in arm if task_of(r["category"]) == task]
                continue
            _, _, ratio, accepted = SPEED_PY.speed(str(files[0]), str(files[1]), "stand-in", task=task, report=False)
            assert ours["speedup"] == pytest.approx(ratio, rel=1e-12), task
            assert ours["mean_accepted_tokens"] == pytest.approx(float(np.mean(accepted)), rel=1e-12), task


# ---------------------------------------------------------------- mismatches
def test_mismatches_are_counted_per_arm_and_task():
    base = [record(1, "qa", 3, 1.0, out=[1, 2, 3]), record(2, "rag", 3, 1.0, out=[4, 5, 6]),
            record(3, "rag", 3, 1.0, out=[7, 8, 9])]
    good = [dict(r, arm="good") for r in base]
    bad = [record(1, "qa", 3, 1.0, out=[1, 2, 3]), record(2, "rag", 3, 1.0, out=[4, 5, 0]),
           record(3, "rag", 3, 1.0, out=[0, 8, 9])]
    board = leaderboard({"base": base, "good": good, "bad": bad}, "base", {n: True for n in ("base", "good", "bad")})
    rows = {a["arm"]: a for a in board["arms"]}
    assert rows["good"]["mismatches"] == 0 and rows["good"]["compared"] == 3
    assert rows["bad"]["mismatches"] == 2
    assert rows["bad"]["tasks"]["qa"]["mismatches"] == 0 and rows["bad"]["tasks"]["rag"]["mismatches"] == 2
    lines = equality_lines(board)
    assert lines[0].startswith("bad: 2 of 3 answers differ from base's (rag 2/2)")
    assert lines[1] == "Every other arm's answers equal base's token for token: good." and len(lines) == 2


def test_keep_leaves_out_answers_of_other_questions():
    base = [record(1, "qa", 10, 1.0), record(2, "qa", 10, 1.0)]
    arm = [record(1, "qa", 10, 1.0, out=[0]), record(2, "qa", 10, 0.1)]
    board = leaderboard({"base": base, "arm": arm}, "base", {}, keep={(json.dumps(1), 0)})
    row = next(a for a in board["arms"] if a["arm"] == "arm")
    assert row["answers"] == 1 and row["speedup"] == pytest.approx(1.0) and row["mismatches"] == 1


# ---------------------------------------------------------------- the table
def test_table_has_the_leaderboards_columns_sorted_by_overall():
    arms = {"base": [record(1, "qa", 10, 1.0), record(2, "rag", 10, 1.0)],
            "slow": [record(1, "qa", 10, 2.0), record(2, "rag", 10, 2.0)],
            "fast": [record(1, "qa", 10, 0.25, accept=(4,)), record(2, "rag", 10, 0.5, accept=(2,))]}
    board = leaderboard(arms, "base", {})
    assert [a["arm"] for a in board["arms"]] == ["fast", "base", "slow"]
    lines = markdown_table(board).splitlines()
    assert COLUMNS == ("MT-bench", "Translation", "Summarization", "QA", "Math", "RAG", "#MAT", "Overall")
    assert lines[0] == "| Method | MT-bench | Translation | Summarization | QA | Math | RAG | #MAT | Overall |"
    assert lines[2] == "| fast | - | - | - | 4.00x | - | 2.00x | 3.00 | 3.00x |"
    assert lines[3] == "| base | - | - | - | 1.00x | - | 1.00x | 1.00 | 1.00x |"
    assert lines[4].startswith("| slow |") and lines[4].endswith("| 0.50x |")


# ---------------------------------------------------------------- the command, end to end
SAMPLED = """[[arm]]
name = "sampled"
drafter = "ngram"
policy = "chain"
verifier = "sampling"
verifier_options = { temperature = 1.0 }
"""
CONFIG = """
name = "tiny-spec-bench"
max_new_tokens = 6
warmup = 0
repeats = 1
stop_at_eos = false
threads = 1

[target]
model = "random:llama"
dtype = "float64"
device = "cpu"
random = { vocab_size = 64, hidden = 32, layers = 2, seed = 0 }

[models.draft]
model = "perturbed:target"
random = { noise = 0.05, seed = 1 }

[[arm]]
baseline = "autoregressive"

[[arm]]
drafter = "model"
drafter_options = { model = "draft" }
policy = "chain"
policy_options = { gamma = 3 }

[[arm]]
name = "ngram"
drafter = "ngram"
policy = "chain"
policy_options = { gamma = 3 }

{SAMPLED}
[data]
path = "questions.jsonl"

[output]
dir = "out"
trees_per_answer = 0
explorer_questions = 0
""".replace("{SAMPLED}", SAMPLED)


def bench_config(tmp_path: Path, text: str = CONFIG) -> Path:
    shutil.copy(QUESTIONS, tmp_path / "questions.jsonl")
    path = tmp_path / "exp.toml"
    path.write_text(textwrap.dedent(text))
    return path


def bench(path: Path, *args: str):
    return CliRunner().invoke(cli, ["bench", "spec-bench", str(path), "--no-progress", *args], env={"COLUMNS": "200"})


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    """One run of the command on the tiny pair, shared by the tests that read its files."""
    tmp = tmp_path_factory.mktemp("spec-bench")
    path = bench_config(tmp)
    result = bench(path)
    assert result.exit_code == 0, result.output
    return path, tmp / "out-spec-bench", result.output


def test_command_prints_the_table_and_writes_its_files(bench_run):
    _, out, output = bench_run
    assert "| Method | MT-bench | Translation | Summarization | QA | Math | RAG | #MAT | Overall |" in output
    for name in ("summary.json", "leaderboard.md", "spec-bench.png", "run/run.json", "run/report.md"):
        assert (out / name).is_file(), name
    assert "| Method | MT-bench |" in (out / "leaderboard.md").read_text()
    assert "sampled: " in output and "differ from autoregressive's" in output  # the sampling arm is named
    assert "28 answers computed" in output  # 7 questions x 4 arms


def test_summary_json_keeps_plain_names_per_arm_and_task(bench_run):
    _, out, _ = bench_run
    summary = json.loads((out / "summary.json").read_text())
    assert summary["baseline"] == "autoregressive" and summary["tasks"] == list(TASK_KEYS)
    assert {a["arm"] for a in summary["arms"]} == {"autoregressive", "model+chain", "ngram", "sampled"}
    overall = [a["speedup"] for a in summary["arms"]]
    assert overall == sorted(overall, reverse=True)
    for arm in summary["arms"]:
        assert {"arm", "speedup", "mean_accepted_tokens", "mismatches", "compared", "greedy", "tasks"} <= set(arm)
        assert set(arm["tasks"]) == set(TASK_KEYS)
        for cell in arm["tasks"].values():
            assert {"speedup", "mean_accepted_tokens", "mismatches", "compared", "answers"} <= set(cell)
    rows = {a["arm"]: a for a in summary["arms"]}
    assert rows["autoregressive"]["speedup"] == pytest.approx(1.0)
    assert rows["autoregressive"]["mean_accepted_tokens"] == pytest.approx(1.0)
    for name in ("model+chain", "ngram"):  # greedy arms equal the baseline token for token
        assert rows[name]["mismatches"] == 0 and rows[name]["compared"] == 7
    assert rows["sampled"]["greedy"] is False and rows["sampled"]["mismatches"] > 0
    assert rows["model+chain"]["mean_accepted_tokens"] > 1.0
    # MT-bench's two questions (categories writing and mt_bench) ran both turns
    assert rows["ngram"]["tasks"]["mt_bench"]["answers"] == 2
    answers = [json.loads(line) for line in (out / "run" / "answers" / "ngram.jsonl").read_text().splitlines()]
    assert [len(a["choices"][0]["new_tokens"]) for a in answers if a["question_id"] in (1, 7)] == [2, 2]
    assert summary["conditions"]["questions"] == {"mt_bench": 2, **{t: 1 for t in TASK_KEYS[1:]}}


def test_rerun_resumes_and_recomputes_the_leaderboard(bench_run, tmp_path):
    path, out, _ = bench_run
    (out / "summary.json").unlink()
    result = bench(path)
    assert result.exit_code == 0, result.output
    assert "0 answers computed, 28 reused" in result.output
    assert (out / "summary.json").is_file()
    # A dropped arm leaves the board, though its answers stay in the run directory.
    dropped = path.with_name("dropped.toml")
    dropped.write_text(path.read_text().replace(SAMPLED, ""))
    assert "sampled" not in dropped.read_text()
    result = bench(dropped, "--out", str(out))
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert {a["arm"] for a in summary["arms"]} == {"autoregressive", "model+chain", "ngram"}


def test_a_changed_arm_is_refused_not_mixed(bench_run):
    path, out, _ = bench_run
    changed = path.with_name("changed.toml")
    changed.write_text(path.read_text().replace("policy_options = { gamma = 3 }", "policy_options = { gamma = 2 }", 1))
    result = bench(changed, "--out", str(out))
    assert result.exit_code != 0
    assert "arm 'model+chain' changed" in result.output and "--fresh" in result.output


def test_unknown_categories_are_refused_naming_the_valid_ones(tmp_path):
    path = bench_config(tmp_path)
    (tmp_path / "questions.jsonl").write_text(
        QUESTIONS.read_text() + json.dumps({"question_id": 99, "category": "poetry", "turns": ["A poem."]}) + "\n")
    result = bench(path)
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "'poetry' (1 question)" in result.output
    for valid in ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag", "writing"):
        assert valid in result.output
    assert not (tmp_path / "out-spec-bench").exists()  # refused before anything runs


def test_an_experiment_without_a_baseline_is_refused(tmp_path):
    path = bench_config(tmp_path, CONFIG.replace('[[arm]]\nbaseline = "autoregressive"\n', ""))
    result = bench(path)
    assert result.exit_code != 0 and 'baseline = "autoregressive"' in result.output


# ---------------------------------------------------------------- the shipped sample and roster
def test_shipped_sample_has_eight_questions_per_task_round_robin():
    rows = [json.loads(line) for line in SAMPLE.read_text(encoding="utf-8").splitlines()]
    assert len(rows) == 48 and all(r["category"] in VALID_CATEGORIES for r in rows)
    tasks = [task_of(r["category"]) for r in rows]
    assert tasks == list(TASK_KEYS) * 8  # so [data] limit = 6 k takes k of every task
    assert all(len(r["turns"]) == 2 for r in rows if task_of(r["category"]) == "mt_bench")
    assert "Apache License" in (SAMPLE.parent / "spec-bench-sample.LICENSE").read_text()
    assert "hemingkx/Spec-Bench" in (SAMPLE.parent / "spec-bench-sample.md").read_text()


def test_sample_script_draws_seeded_and_interleaves():
    import importlib.util

    spec = importlib.util.spec_from_file_location("spec_bench_sample", ROOT / "scripts" / "spec_bench_sample.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = [{"question_id": i, "category": c, "turns": ["a", "b"] if c == "writing" else ["a"]}
            for i, c in enumerate(["writing", "qa", "rag"] * 5)]
    first = module.sample(rows, 3, seed=0)
    assert first == module.sample(rows, 3, seed=0) and first != module.sample(rows, 3, seed=1)
    assert [r["category"] for r in first] == ["mt_bench"] * 3 + ["qa"] * 3 + ["rag"] * 3
    assert all(len(r["turns"]) == 1 for r in first)
    full = module.sample(rows, 3, seed=0, all_turns=True, interleave=True)
    assert [r["category"] for r in full] == ["writing", "qa", "rag"] * 3
    assert sorted(r["question_id"] for r in full) == sorted(r["question_id"] for r in first)
    assert all(len(r["turns"]) == 2 for r in full if r["category"] == "writing")


def test_roster_arms_load_and_unknown_drafters_are_refused(tmp_path):
    """examples/spec-bench.toml's arms load (on a tiny target standing in for SmolLM2), the
    Lookahead and SAM rows among them, and a row naming an unregistered drafter is refused by name."""
    from specframe.experiments.config import ConfigError, load_config

    text = (ROOT / "examples" / "spec-bench.toml").read_text()
    text = text.replace('model = "smollm2-135m-instruct"',
                        'model = "random:llama"\nrandom = { vocab_size = 64, hidden = 32, layers = 2, seed = 0 }')
    (tmp_path / "prompts").mkdir()
    shutil.copy(SAMPLE, tmp_path / "prompts" / SAMPLE.name)
    path = tmp_path / "roster.toml"
    path.write_text(text)
    names = [a.name for a in load_config(path).arms]
    assert names[0] == "autoregressive"
    assert {"pld", "recycling", "eagle3", "medusa", "suffix", "lookahead", "sam", "samd[recycle]", "samd[eagle3]"} <= set(names)
    path.write_text(text + '\n[[arm]]\nname = "nowhere"\ndrafter = "no-such-drafter"\npolicy = "chain"\n')
    with pytest.raises(ConfigError, match="unknown drafter 'no-such-drafter'; available drafters: .*lookahead.*sam"):
        load_config(path)
