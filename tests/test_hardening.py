"""Issue 17: every user-facing fault is one line, runs cannot share a directory, a broken plugin
is skipped, caps are visible. Each case asserts the message, the exit code and no traceback."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import specframe
from specframe import plugins
from specframe.cli import cli
from specframe.errors import PluginWarning, SpecframeWarning
from specframe.experiments.runs import read_answers
from specframe.experiments.runlock import DirectoryInUseError, RunLock
from specframe.testing.models import tiny_model

DEMO = Path(specframe.__file__).resolve().parent / "assets" / "demo-pair"

TINY = """
name = "tiny"
max_new_tokens = {max_new}
warmup = 0
stop_at_eos = false
threads = 1

[target]
model = "random:llama"
dtype = "float32"
device = "cpu"
random = {{ vocab_size = 64, hidden = 16, layers = 1, seed = 0, max_positions = {max_positions} }}

[models.draft]
model = "{draft}"
random = {draft_random}

[drafter]
name = "model"
options = {{ model = "draft" }}

[[arm]]
baseline = "autoregressive"

[[arm]]
name = "{arm_name}"
policy = "{policy}"
policy_options = {policy_options}

[data]
path = "prompts.jsonl"
{data_extra}

[output]
dir = "out"
"""


def write_config(tmp: Path, n_prompts: int = 2, prompt_len: int = 1, **kw) -> Path:
    """A tiny random-model experiment in ``tmp`` (two arms: autoregressive and ``kw['arm_name']``)."""
    values = dict(max_new=6, max_positions=128, draft="perturbed:target", draft_random="{ noise = 0.05, seed = 1 }",
                  arm_name="chain", policy="chain", policy_options="{ gamma = 2 }", data_extra="")
    values.update(kw)
    rows = [{"question_id": i, "turns": [f"x = {i}" * prompt_len]} for i in range(n_prompts)]
    (tmp / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = tmp / "exp.toml"
    path.write_text(textwrap.dedent(TINY.format(**values)))
    return path


def assert_one_line_error(result_output: str, *fragments: str) -> str:
    """The output's ``Error:`` line (exactly one, no traceback) contains every fragment."""
    assert "Traceback" not in result_output, result_output
    errors = [line for line in result_output.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, result_output
    for fragment in fragments:
        assert fragment in errors[0], (fragment, errors[0])
    return errors[0]


def invoke(*args: str) -> "click.testing.Result":  # noqa: F821
    # A run's figures would be most of its time, and no test here reads them.
    plots = ["--no-plots"] if args[:1] == ("run",) and "--help" not in args else []
    return CliRunner().invoke(cli, [*args, *plots])


def specframe_cli(*args: str, cwd: Path, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """The real command line in a child process (plugin loading and warnings as a user sees them)."""
    return subprocess.run([sys.executable, "-m", "specframe.cli", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout)


@pytest.fixture
def fresh_registry():
    plugins.reset_registry()
    yield
    plugins.reset_registry()


# ---------------------------------------------------------------------- 1. output directory lock
def test_two_real_runs_on_one_directory_one_refuses_and_nothing_is_duplicated(tmp_path):
    # Long enough that a fast machine is still computing when the second run starts: it is
    # interrupted as soon as the second has refused, so the size costs nothing on slow ones.
    cfg = write_config(tmp_path, n_prompts=300, max_new=32)
    first = subprocess.Popen([sys.executable, "-m", "specframe.cli", "run", str(cfg), "--no-progress", "--no-plots"],
                             cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        answers = tmp_path / "out" / "answers"
        deadline = time.time() + 120
        while time.time() < deadline and first.poll() is None and not list(answers.glob("*.jsonl")):
            time.sleep(0.1)  # the first run is computing (it holds the lock) once an answer exists
        assert first.poll() is None, first.communicate()
        second = specframe_cli("run", str(cfg), "--no-progress", "--no-plots", cwd=tmp_path)
        assert first.poll() is None, "the first run ended before the second tried: raise n_prompts"
        first.send_signal(signal.SIGINT)
        first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert second.returncode == 1, second.stderr
    assert_one_line_error(second.stderr, "output directory in use by another specframe run", str(first.pid), "--out")
    for path in answers.glob("*.jsonl"):
        keys = [(r["arm"], r["question_id"], r["repeat"]) for r in map(json.loads, path.read_text().splitlines())]
        assert len(keys) == len(set(keys)), path


def test_lock_of_a_killed_run_is_taken_over_and_a_live_one_refuses(tmp_path):
    (tmp_path / ".specframe.lock").write_text(json.dumps({"pid": 999999, "host": "gone"}))
    with pytest.warns(SpecframeWarning, match="locked by a run that is gone.*taking the lock over"):
        lock = RunLock(tmp_path).__enter__()
    try:
        with pytest.raises(DirectoryInUseError, match=f"pid {os.getpid()}"):
            RunLock(tmp_path).__enter__()
    finally:
        lock.__exit__(None, None, None)
    assert not (tmp_path / ".specframe.lock").exists()


def _record(qid, repeat=0, arm="a"):
    return json.dumps({"arm": arm, "question_id": qid, "repeat": repeat}) + "\n"


def test_answers_are_deduplicated_with_a_warning(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text(_record(0) + _record(1) + _record(0) + _record(0, repeat=1) + _record(1))
    with pytest.warns(SpecframeWarning, match="2 duplicate answer record"):
        recs = read_answers(path)
    assert [(r["question_id"], r["repeat"]) for r in recs] == [(0, 0), (1, 0), (0, 1)]


def test_half_written_last_line_warns(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text(_record(0) + '{"arm": "a", "quest')
    with pytest.warns(SpecframeWarning, match=r"a.jsonl:2: dropped a half-written last answer record"):
        assert len(read_answers(path)) == 1


# ---------------------------------------------------------------------- 2. one-line errors
def test_missing_hub_id_is_one_line(tmp_path):
    cfg = write_config(tmp_path)
    cfg.write_text(cfg.read_text().replace('model = "random:llama"', 'model = "no-such-org/no-such-model"')
                   .replace("random = { vocab_size = 64, hidden = 16, layers = 1, seed = 0, max_positions = 128 }", ""))
    # Offline mode fails at once; without it transformers retries for ~50 s before the same error.
    result = specframe_cli("run", str(cfg), "--no-progress", cwd=tmp_path, env={"HF_HUB_OFFLINE": "1"})
    assert result.returncode == 1
    assert_one_line_error(result.stderr, "'no-such-org/no-such-model'", "([target])", "shipped name")


def test_draft_with_another_vocabulary_is_one_line(tmp_path):
    cfg = write_config(tmp_path, draft="random:llama", draft_random="{ vocab_size = 48, hidden = 16, layers = 1 }")
    result = invoke("run", str(cfg), "--no-progress")
    assert result.exit_code == 1
    assert_one_line_error(result.output, "vocabulary size 48, the target has 64", "(arm 'chain', drafter 'model'")


def test_debug_switch_shows_the_traceback(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECFRAME_DEBUG", "0")  # --debug exports it for child processes: restore after
    cfg = write_config(tmp_path, draft="random:llama", draft_random="{ vocab_size = 48, hidden = 16, layers = 1 }")
    result = invoke("--debug", "run", str(cfg), "--no-progress")
    assert result.exit_code == 1 and isinstance(result.exception, specframe.errors.ContextError)
    child = specframe_cli("run", str(cfg), "--no-progress", cwd=tmp_path, env={"SPECFRAME_DEBUG": "1"})
    assert child.returncode == 1 and "Traceback" in child.stderr


EAGLE_CONFIG = """
name = "eagle"
max_new_tokens = 4
warmup = 0
threads = 1
[target]
model = "demo-target"
[[arm]]
name = "head"
policy = "chain"
drafter = "{drafter}"
drafter_options = {{ path = "{path}" }}
[data]
path = "prompts.jsonl"
[output]
dir = "out"
"""


def _eagle_run(tmp_path, drafter, path):
    (tmp_path / "prompts.jsonl").write_text(json.dumps({"question_id": 0, "turns": ["def f(x):"]}) + "\n")
    cfg = tmp_path / "eagle.toml"
    cfg.write_text(EAGLE_CONFIG.format(drafter=drafter, path=path))
    return invoke("run", str(cfg), "--no-progress")


@pytest.mark.parametrize("content", [b"", b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\""], ids=["empty", "truncated"])
def test_corrupt_head_weights_name_the_file(tmp_path, content):
    head = tmp_path / "head"
    shutil.copytree(DEMO / "eagle", head)
    (head / "model.safetensors").write_bytes(content)
    result = _eagle_run(tmp_path, "eagle3", head)
    assert result.exit_code == 1
    assert_one_line_error(result.output, f"cannot read the weights {head / 'model.safetensors'}", "arm 'head'",
                          "copy or export the checkpoint again")


def test_eagle_drafter_given_an_eagle3_head_is_one_line(tmp_path):
    result = _eagle_run(tmp_path, "eagle", "demo-eagle")
    assert result.exit_code == 1
    assert_one_line_error(result.output, "is an EAGLE-3 head; use drafter 'eagle3'", "(arm 'head', drafter 'eagle'")


def _plugin_object(**hooks):
    return type("Plugin", (), {k: staticmethod(specframe.hookimpl(v)) for k, v in hooks.items()})


class _Clash(specframe.TreePolicy):
    name = "chain"

    def build(self, session, budget):
        return session.new_tree()


def test_two_plugins_registering_one_name_is_one_line(fresh_registry):
    specframe.register_plugin(_plugin_object(register_tree_policies=lambda register: register(_Clash)),
                              dist="clashing-dist")
    result = invoke("plugins")
    assert result.exit_code == 1
    assert_one_line_error(result.output, "policy name 'chain' registered twice", "clashing-dist",
                          "SPECFRAME_LOAD_PLUGINS")


@dataclass
class _BoomOptions(specframe.BudgetOptions):
    budget: int = 4


class _Boom(specframe.TreePolicy):
    """Builds two valid trees (the first question), then raises (a bug mid-run)."""

    name = "boom"
    Options = _BoomOptions
    calls = 0

    def build(self, session, budget):
        type(self).calls += 1
        if type(self).calls > 2:
            raise ZeroDivisionError("division by zero in my policy")
        return session.new_tree()


def test_policy_exception_mid_run_names_arm_and_question(tmp_path, fresh_registry):
    specframe.register_plugin(_plugin_object(register_tree_policies=lambda register: register(_Boom)), dist="boom")
    _Boom.calls = 0
    cfg = write_config(tmp_path, arm_name="boom-arm", policy="boom", policy_options="{}", max_new=2)
    result = invoke("run", str(cfg), "--no-progress")
    assert result.exit_code == 1
    assert_one_line_error(result.output, "generation failed: ZeroDivisionError: division by zero in my policy",
                          "arm 'boom-arm'", "question 1, repeat 0", "the same command resumes")


def test_prompt_too_long_is_one_line_or_skipped(tmp_path):
    cfg = write_config(tmp_path, max_positions=40, prompt_len=1)
    rows = [{"question_id": "short", "turns": ["x = 1"]}, {"question_id": "long", "turns": ["x = 1; " * 10]}]
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = invoke("run", str(cfg), "--no-progress")
    assert result.exit_code == 1
    assert_one_line_error(result.output, "prompt too long for the target (question 'long')", 'on_overflow = "skip"')
    cfg.write_text(cfg.read_text().replace('path = "prompts.jsonl"', 'path = "prompts.jsonl"\non_overflow = "skip"'))
    result = invoke("run", str(cfg), "--no-progress")
    assert result.exit_code == 0, result.output
    assert "Note: question 'long' skipped: prompt (70 tokens)" in result.output
    report = (tmp_path / "out" / "report.md").read_text()
    assert "## Notices" in report and "question 'long' skipped" in report
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert {a["overall"]["answers"] for a in summary["arms"]} == {1}


# ---------------------------------------------------------------------- 3. plugin isolation
BROKEN_PLUGIN = "raise ImportError('broken_plugin needs a module that is not installed')\n"
RAISING_HOOK = textwrap.dedent("""
    import specframe

    @specframe.hookimpl
    def register_tree_policies(register):
        raise RuntimeError("hook exploded")

    @specframe.hookimpl
    def register_commands(cli):
        raise RuntimeError("command hook exploded")
""")


def _fake_distribution(root: Path, module: str, source: str, dist: str) -> None:
    (root / f"{module}.py").write_text(source)
    info = root / f"{dist.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[specframe]\nmain = {module}\n")


def test_plugin_failing_at_import_is_skipped_by_plugins_and_run(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    _fake_distribution(site, "broken_plugin", BROKEN_PLUGIN, "broken-dist")
    env = {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    listed = specframe_cli("plugins", cwd=tmp_path, env={**env, "COLUMNS": "200"})
    assert listed.returncode == 0, listed.stderr
    warning = "Warning: plugin distribution 'broken-dist' skipped: entry point 'main' (broken_plugin) failed to import"
    assert warning in listed.stderr and "broken_plugin needs a module" in listed.stderr
    assert "talon" in listed.stdout and "Traceback" not in listed.stderr
    cfg = write_config(tmp_path, n_prompts=1, max_new=4)
    ran = specframe_cli("run", str(cfg), "--no-progress", cwd=tmp_path, env=env)
    assert ran.returncode == 0, ran.stderr
    assert warning in ran.stderr and "2 answers computed" in ran.stdout


def test_plugin_whose_hook_raises_is_skipped(tmp_path, monkeypatch, fresh_registry):
    _fake_distribution(tmp_path, "raising_plugin", RAISING_HOOK, "raising-dist")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.warns(PluginWarning, match="'raising-dist' skipped: hook register_tree_policies raised: "
                                           "RuntimeError: hook exploded"):
        names = specframe.available()["policies"]
    assert "talon" in names
    with pytest.raises(specframe.PluginError, match="raising-dist was skipped"):
        specframe.get_registry().get("policies", "nope")
    with pytest.warns(PluginWarning, match="hook register_commands raised: RuntimeError: command hook exploded"):
        specframe.get_registry().register_commands(cli)
    assert invoke("plugins").exit_code == 0


def test_unknown_name_in_load_plugins_warns_and_errors_mention_it(monkeypatch, fresh_registry):
    monkeypatch.setenv("SPECFRAME_LOAD_PLUGINS", "no-such-dist")
    with pytest.warns(PluginWarning, match="SPECFRAME_LOAD_PLUGINS names 'no-such-dist', which is not an installed"):
        reg = specframe.get_registry()
    with pytest.raises(specframe.PluginError, match=r"\(none loaded\); SPECFRAME_LOAD_PLUGINS='no-such-dist' restricts"):
        reg.get("policies", "talon")
    result = invoke("run", "--help")
    assert result.exit_code == 0


# ---------------------------------------------------------------------- 4. one tokenizer check
def _draft_with_swapped_tokens(tmp_path: Path) -> Path:
    draft = tmp_path / "draft"
    shutil.copytree(DEMO / "draft", draft)
    tok = json.loads((draft / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[300:302]
    vocab[a], vocab[b] = vocab[b], vocab[a]  # same size, different ids
    (draft / "tokenizer.json").write_text(json.dumps(tok))
    return draft


def test_same_size_other_tokenizer_is_refused_everywhere(tmp_path):
    draft = _draft_with_swapped_tokens(tmp_path)
    (tmp_path / "prompts.jsonl").write_text(json.dumps({"question_id": 0, "turns": ["def f(x):"]}) + "\n")
    cfg = tmp_path / "pair.toml"
    cfg.write_text(textwrap.dedent(f"""
        name = "pair"
        [target]
        model = "demo-target"
        [models.draft]
        model = "{draft}"
        [drafter]
        name = "model"
        options = {{ model = "draft" }}
        [[arm]]
        policy = "chain"
        [data]
        path = "prompts.jsonl"
    """))
    result = invoke("run", str(cfg), "--no-progress")
    assert result.exit_code == 1
    assert_one_line_error(result.output, "[models.draft]", "do not share a tokenizer: token id")
    target = specframe.load_causal_lm("demo-target")
    for model in (str(draft), specframe.load_causal_lm(str(draft))):  # a path, and a loaded instance
        with pytest.raises(ValueError, match="do not share a tokenizer"):
            specframe.SpecDecoder.build(target=target, drafter=("model", {"model": model}))


# ---------------------------------------------------------------------- 5. visible caps
def test_budget_cut_by_the_context_is_recorded_and_reported():
    from specframe.experiments.metrics import budget_cuts
    from specframe.experiments.report import notice_lines

    target = tiny_model("llama", seed=0, max_positions=40)
    dec = specframe.SpecDecoder.build(target=target, drafter=("model", {"model": target}),
                                      policy=("talon", {"budget": 2000}))
    out = dec.generate(list(range(2, 10)), max_new_tokens=8, eos_token_id=None)
    assert out.steps[0].budget_cut == 2000 - (40 - 7)
    record = {"steps": {"budget_cut": [s.budget_cut for s in out.steps]}}
    cuts = budget_cuts([record])
    assert cuts["steps"] == len(out.steps) and cuts["max_cut"] >= 2000 - 33
    line = notice_lines({"arms": [{"name": "talon", "budget_cuts": cuts}]})[0]
    assert line.startswith(f"arm talon: the context cut the node budget in {len(out.steps)} of {len(out.steps)} steps")


def test_summary_table_never_cuts_arm_names(tmp_path):
    long_name = "entropy-gated-talon-with-a-very-long-descriptive-name"
    cfg = write_config(tmp_path, n_prompts=1, max_new=4, arm_name=long_name)
    result = invoke("run", str(cfg), "--no-progress")  # CliRunner output is not a terminal: piped
    assert result.exit_code == 0, result.output
    assert long_name in result.output and "…" not in result.output


# ---------------------------------------------------------------------- 6. author's toolkit
def test_add_nodes_rejects_a_parent_not_yet_in_the_tree():
    tree = specframe.DraftTree.root(1)
    with pytest.raises(specframe.InvalidTreeError, match="parent 1 is not in the tree"):
        tree.add_nodes(torch.tensor([0, 1]), torch.tensor([2, 3]), torch.zeros(2))


def test_public_topk_follows_the_tie_rule():
    logp = torch.tensor([[0.0, -1.0, 0.0, 0.0, -1.0]])
    values, tokens, ranks = specframe.topk_per_row(logp, 4)
    assert tokens.tolist() == [[0, 2, 3, 1]] and ranks.tolist() == [[0, 1, 2, 3]]
    assert specframe.top_indices(torch.tensor([1.0, 2.0, float("-inf"), 2.0]), 5).tolist() == [1, 3, 0]
