"""A 2-arm experiment on tiny random models end to end: files, metric consistency, resume."""

from __future__ import annotations

import json
import re
import textwrap

import pytest
import torch

from specframe.experiments.config import load_config
from specframe.experiments.experiment import ExperimentError, run_experiment
from specframe.experiments.loading import ModelPool
from specframe.experiments.report import write_report
from specframe.experiments.runs import AnswerRecord, RunDir, read_answers

N_PROMPTS, MAX_NEW, GAMMA = 3, 12, 3
SPEC_BENCH_TOP = {"question_id", "category", "model_id", "choices", "answer_id", "tstamp"}
SPEC_BENCH_CHOICE = {"turns", "new_tokens", "wall_time", "accept_lengths", "decoding_steps"}

CONFIG = f"""
name = "tiny"
max_new_tokens = {MAX_NEW}
warmup = 1
repeats = 1
stop_at_eos = false
threads = 1

[target]
model = "random:llama"
dtype = "float64"
device = "cpu"
random = {{ vocab_size = 64, hidden = 32, layers = 2, seed = 0 }}

[models.draft]
model = "perturbed:target"
random = {{ noise = 0.05, seed = 1 }}

[drafter]
name = "model"
options = {{ model = "draft" }}

[[arm]]
baseline = "autoregressive"

[[arm]]
policy = "chain"
policy_options = {{ gamma = {GAMMA} }}

[data]
path = "prompts.jsonl"

[output]
dir = "out"
trees_per_answer = 2
explorer_questions = 1
"""


class Interrupt(Exception):
    """Injected crash."""


def make_config(tmp_path):
    rows = [{"question_id": i, "category": "ab"[i % 2], "turns": [f"def f{i}(x):\n    return x + {i}"]}
            for i in range(N_PROMPTS)]
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = tmp_path / "exp.toml"
    path.write_text(textwrap.dedent(CONFIG))
    return path


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    """One uninterrupted run and its report, shared by the tests that only read its files."""
    tmp = tmp_path_factory.mktemp("full")
    cfg = load_config(make_config(tmp))
    outcome = run_experiment(cfg, progress=False)
    assert not RunDir(outcome.out_dir).report.exists()  # the report is the CLI's (or the caller's) step
    write_report(outcome.out_dir)
    return cfg, outcome


def records(out_dir, arm):
    return read_answers(out_dir / "answers" / f"{arm}.jsonl")


def test_files_and_spec_bench_format(full_run):
    cfg, outcome = full_run
    out = outcome.out_dir
    assert outcome.computed == 2 * N_PROMPTS and outcome.skipped == 0
    for name in ("run.json", "summary.json", "report.md"):
        assert (out / name).is_file(), name
    for arm in ("autoregressive", "chain"):
        recs = records(out, arm)
        assert [r["question_id"] for r in recs] == list(range(N_PROMPTS))
        for r in recs:
            assert SPEC_BENCH_TOP <= set(r)
            choice = r["choices"][0]
            assert SPEC_BENCH_CHOICE <= set(choice)
            assert choice["new_tokens"] == [MAX_NEW] == [len(ids) for ids in r["output_ids"]]
            assert sum(choice["accept_lengths"]) == MAX_NEW
            assert choice["decoding_steps"] == [len(choice["accept_lengths"])]
            assert isinstance(choice["turns"][0], str) and choice["wall_time"][0] > 0
    report = (out / "report.md").read_text()
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", report)
    assert {"plots/funnel.png", "plots/delta_tau.png", "plots/speedup.png", "plots/shapes.png",
            "plots/trees.png"} <= set(links)
    for link in links:
        assert (out / link).stat().st_size > 1000, link
    assert "| chain |" in report and "| autoregressive |" in report


def test_numbers_are_consistent(full_run):
    cfg, outcome = full_run
    out = outcome.out_dir
    summary = json.loads((out / "summary.json").read_text())
    arms = {a["name"]: a for a in summary["arms"]}
    chain = records(out, "chain")
    # tau and delta recomputed from the per-step columns, not from the summary's own fields.
    steps = [s for r in chain for s in zip(r["steps"]["emitted"], r["steps"]["draft_forwards"])]
    tokens = sum(e for e, _ in steps)
    assert tokens == N_PROMPTS * MAX_NEW
    assert arms["chain"]["overall"]["tau"] == pytest.approx(tokens / len(steps))
    assert arms["chain"]["overall"]["delta"] == pytest.approx(GAMMA)  # constant chain: gamma drafts per step
    assert 1.0 <= arms["chain"]["overall"]["tau"] <= GAMMA + 1
    assert arms["chain"]["overall"]["target_forwards_per_token"] == pytest.approx(len(steps) / tokens)
    assert arms["autoregressive"]["overall"]["tau"] == 1.0
    ar = records(out, "autoregressive")
    wall = lambda rs: sum(r["choices"][0]["wall_time"][0] for r in rs)  # noqa: E731
    assert arms["chain"]["overall"]["speedup"] == pytest.approx(wall(ar) / wall(chain), rel=1e-6)
    assert arms["chain"]["overall"]["tokens_per_s"] == pytest.approx(tokens / wall(chain), rel=1e-6)
    # Greedy chain in float64 is lossless: no answer differs from autoregressive.
    assert arms["chain"]["overall"]["mismatches"] == 0 and arms["chain"]["overall"]["compared"] == N_PROMPTS
    assert [r["output_ids"] for r in chain] == [r["output_ids"] for r in ar]
    # Funnel: every accepted depth-d node counted once per step.
    funnel = arms["chain"]["funnel"]
    accepted = sum(sum(r["steps"]["accepted"]) for r in chain)
    assert sum(map(sum, funnel["counts"])) + funnel["unknown_rank"] == accepted
    assert set(arms["chain"]["categories"]) == {"a", "b"}


def test_answer_records_round_trip_through_the_typed_record(full_run):
    _, outcome = full_run
    for arm in ("autoregressive", "chain"):
        for r in records(outcome.out_dir, arm):
            typed = AnswerRecord.from_dict(r)
            assert typed.to_dict() == r and typed.arm == arm and typed.choice.new_tokens == [MAX_NEW]


def test_recorded_trees_match_their_steps(full_run):
    _, outcome = full_run
    for r in records(outcome.out_dir, "chain"):
        if r["question_id"] == 0:  # the explorer question: every step's tree
            assert [t["step"] for t in r["trees"]] == list(range(len(r["steps"]["emitted"])))
        else:
            assert 1 <= len(r["trees"]) <= 2
        for t in r["trees"]:
            step = t["step"]
            assert len(t["tokens"]) == r["steps"]["tree_size"][step] == GAMMA + 1
            assert len(t["accepted"]) - 1 == r["steps"]["accepted"][step]
            assert t["parents"][0] == -1 and all(t["parents"][i] == i - 1 for i in range(1, len(t["parents"])))


def test_autoregressive_baseline_matches_transformers_greedy(full_run):
    cfg, outcome = full_run
    from specframe.experiments.data import ByteTokenizer

    model = ModelPool(cfg).target()
    tok = ByteTokenizer(64)
    rec = records(outcome.out_dir, "autoregressive")[1]
    prompt = torch.tensor([tok.encode("def f1(x):\n    return x + 1")])
    ref = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=MAX_NEW,
                         min_new_tokens=MAX_NEW, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert rec["output_ids"][0] == ref[0, prompt.shape[1]:].tolist()


def test_resume_after_crash_recomputes_nothing(tmp_path, full_run):
    cfg_path = make_config(tmp_path)
    seen: list[tuple[str, int]] = []

    def crash_after_two(arm, record):
        seen.append((arm, record["question_id"]))
        if len(seen) == 2:
            raise Interrupt

    with pytest.raises(Interrupt):
        run_experiment(cfg_path, on_record=crash_after_two, progress=False)
    out = tmp_path / "out"
    assert len(records(out, "autoregressive")) + len(records(out, "chain")) == 2
    # A crash in the middle of a write leaves half a line: it must not break the resume.
    with (out / "answers" / "chain.jsonl").open("a") as fh:
        fh.write('{"question_id": 2, "category": "a", "cho')

    again: list[tuple[str, int]] = []
    outcome = run_experiment(cfg_path, on_record=lambda arm, r: again.append((arm, r["question_id"])), progress=False)
    assert outcome.skipped == 2 and outcome.computed == 2 * N_PROMPTS - 2
    assert not set(again) & set(seen), "a finished answer was recomputed"
    assert sorted(seen + again) == sorted((a, q) for a in ("autoregressive", "chain") for q in range(N_PROMPTS))

    # Nothing left: a third run computes nothing.
    third = run_experiment(cfg_path, on_record=lambda *a: pytest.fail("recomputed"), progress=False)
    assert third.computed == 0 and third.skipped == 2 * N_PROMPTS

    full = full_run[1].out_dir
    for arm in ("autoregressive", "chain"):
        mine = sorted(records(out, arm), key=lambda r: r["question_id"])
        ref = sorted(records(full, arm), key=lambda r: r["question_id"])
        assert [r["output_ids"] for r in mine] == [r["output_ids"] for r in ref]
        assert [r["choices"][0]["decoding_steps"] for r in mine] == [r["choices"][0]["decoding_steps"] for r in ref]
    totals = lambda s: {a["name"]: (a["overall"]["tokens"], a["overall"]["target_forwards"],  # noqa: E731
                                    a["overall"]["draft_forwards"]) for a in s["arms"]}
    full_summary = json.loads(RunDir(full).summary.read_text())
    assert totals(write_report(out, plots=False)) == totals(full_summary)


def test_changed_settings_refuse_to_mix_with_old_answers(tmp_path):
    cfg_path = make_config(tmp_path)
    cfg = load_config(cfg_path)
    out = tmp_path / "out"
    out.mkdir()
    fingerprint = {**cfg.fingerprint(), "max_new_tokens": MAX_NEW + 1}
    (out / "run.json").write_text(json.dumps({"fingerprint": fingerprint, "arms": {}, "greedy": {}}))
    with pytest.raises(ExperimentError, match=r"differs in: max_new_tokens\)"):
        run_experiment(cfg_path, progress=False)
    arms = {a.name: a.describe() for a in cfg.arms}
    arms["chain"]["policy"]["options"]["gamma"] = GAMMA + 1
    (out / "run.json").write_text(json.dumps({"fingerprint": cfg.fingerprint(), "arms": arms, "greedy": {}}))
    with pytest.raises(ExperimentError, match="arm 'chain' changed"):
        run_experiment(cfg_path, progress=False)


def test_cli_run_resumes_and_prints_the_table(full_run):
    from click.testing import CliRunner

    from specframe.cli import cli

    cfg, outcome = full_run
    result = CliRunner().invoke(cli, ["run", str(cfg.source), "--no-progress"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "chain" in result.output and "autoregressive" in result.output
    assert f"0 answers computed, {2 * N_PROMPTS} reused" in result.output


def test_cli_run_without_plots_links_no_figure_and_report_draws_them(full_run, tmp_path):
    import shutil

    from click.testing import CliRunner

    from specframe.cli import cli

    cfg, outcome = full_run
    run = tmp_path / "copy"
    shutil.copytree(outcome.out_dir, run, ignore=shutil.ignore_patterns("plots"))
    result = CliRunner().invoke(cli, ["run", str(cfg.source), "--out", str(run), "--no-progress", "--no-plots"])
    assert result.exit_code == 0, result.output
    assert not (run / "plots").exists() and "plots/" not in (run / "report.md").read_text()
    assert CliRunner().invoke(cli, ["report", str(run)]).exit_code == 0  # the figures, later
    assert "plots/speedup.png" in (run / "report.md").read_text() and (run / "plots" / "speedup.png").is_file()


def test_cli_run_reports_config_errors_without_traceback(tmp_path):
    from click.testing import CliRunner

    from specframe.cli import cli

    path = make_config(tmp_path)
    path.write_text(path.read_text().replace('policy = "chain"', 'policy = "chian"'))
    result = CliRunner().invoke(cli, ["run", str(path)])
    assert result.exit_code != 0
    assert "unknown policy 'chian'" in result.output and "Traceback" not in result.output


def test_sigkill_loses_no_finished_answer(tmp_path):
    """A real crash: SIGKILL the run in a subprocess after two answers, then resume."""
    import os
    import signal
    import subprocess
    import sys
    import time

    cfg_path = make_config(tmp_path)
    script = (
        "import sys, time\n"
        "from specframe.experiments.experiment import run_experiment\n"
        "run_experiment(sys.argv[1], progress=False, on_record=lambda arm, r: time.sleep(30))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script, str(cfg_path)])
    answers = tmp_path / "out" / "answers"
    try:
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None:
            # The hook sleeps after the first answer: kill once it is written.
            if sum(len(read_answers(p)) for p in answers.glob("*.jsonl")) >= 1:
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the run ended before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    on_disk = {(p.stem, r["question_id"]) for p in answers.glob("*.jsonl") for r in read_answers(p)}
    assert len(on_disk) == 1
    again: list[tuple[str, int]] = []
    outcome = run_experiment(cfg_path, progress=False, on_record=lambda arm, r: again.append((arm, r["question_id"])))
    assert outcome.skipped == 1 and not on_disk & set(again)
    assert len(again) == 2 * N_PROMPTS - 1


def test_hf_baselines_are_greedy_and_count_forwards():
    from specframe.experiments.baselines import AutoregressiveRunner, HFGenerateRunner
    from specframe.models.target import TargetModel
    from specframe.testing.models import perturbed_copy, tiny_model

    torch.manual_seed(0)
    target = tiny_model("llama", seed=0)
    draft = perturbed_copy(target, 0.05, seed=1)
    prompt = [3, 4, 5, 6, 3, 4, 5, 6, 3, 4]
    ar = AutoregressiveRunner(TargetModel(target)).generate(prompt, MAX_NEW, set())
    assert ar.target_forwards == MAX_NEW and ar.accept_lengths == [1] * MAX_NEW
    gamma = 3
    assisted = HFGenerateRunner(target, {}, assistant=draft, assistant_generation={
        "num_assistant_tokens": gamma, "num_assistant_tokens_schedule": "constant",
        "assistant_confidence_threshold": 0.0}).generate(prompt, MAX_NEW, set())
    lookup = HFGenerateRunner(target, {"prompt_lookup_num_tokens": 4}).generate(prompt, MAX_NEW, set())
    for out in (assisted, lookup):
        assert out.tokens == ar.tokens
        assert sum(out.accept_lengths) == MAX_NEW and len(out.accept_lengths) == out.target_forwards
    # The assistant drafts gamma tokens per step (fewer only where max_new_tokens caps it).
    assert (gamma - 1) * assisted.target_forwards <= assisted.draft_forwards <= gamma * assisted.target_forwards
    assert draft.generation_config.num_assistant_tokens is None  # the shared model is left untouched
    assert lookup.draft_forwards == 0


def test_a_divergence_is_reported_with_the_targets_margin(tmp_path):
    """A greedy arm whose answer differs from autoregressive (here: a tampered record) is listed
    in the report with the first differing position and the target's logit margin there."""
    cfg_path = make_config(tmp_path)
    run_experiment(load_config(cfg_path), progress=False)
    out = tmp_path / "out"
    assert not (out / "divergences.json").exists()  # a lossless run has none
    answers = out / "answers" / "chain.jsonl"
    rows = [json.loads(line) for line in answers.read_text().splitlines()]
    rows[1]["output_ids"][0][4] = (rows[1]["output_ids"][0][4] + 1) % 64
    answers.write_text("".join(json.dumps(r) + "\n" for r in rows))
    outcome = run_experiment(load_config(cfg_path), progress=False)
    assert outcome.computed == 0
    write_report(out)
    (div,) = json.loads((out / "divergences.json").read_text())
    assert (div["arm"], div["question_id"], div["position"]) == ("chain", rows[1]["question_id"], 4)
    assert div["margin"] >= 0
    report = (out / "report.md").read_text()
    assert "differs from autoregressive at token 4" in report and "margin" in report
