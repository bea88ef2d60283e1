"""The ``linears`` switch (specframe.models.linears) wherever a target loads: the experiment
file, run.json and the fingerprint, every arm (baselines included) on the same linears, the
Python API's keyword and ``specframe profile --linears``; invalid values name the valid ones."""

from __future__ import annotations

import json
import textwrap

import pytest
from click.testing import CliRunner

from specframe.cli import cli
from specframe.experiments.config import ConfigError, load_config
from specframe.experiments.experiment import run_experiment
from specframe.experiments.loading import ModelPool
from specframe.experiments.runs import read_answers
from specframe.models import bf16_linear
from specframe.models.linears import linears_label

BF16_PATH = next((p for p in ("amx", "avx512_bf16") if not bf16_linear.missing(p)), None)
needs_bf16 = pytest.mark.skipif(BF16_PATH is None, reason="this CPU has neither amx_bf16 nor avx512_bf16")

CONFIG = """
name = "linears"
max_new_tokens = 10
repeats = 1
stop_at_eos = false
threads = 1

[target]
model = "random:llama"
dtype = "float32"
device = "cpu"
random = {{ vocab_size = 64, hidden = 32, layers = 2, seed = 0 }}
{linears}

[drafter]
name = "ngram"

[[arm]]
baseline = "autoregressive"

[[arm]]
baseline = "hf-prompt-lookup"

[[arm]]
policy = "talon"
policy_options = {{ budget = 16 }}

[data]
path = "prompts.jsonl"

[output]
dir = "out"
"""


def write(tmp_path, linears: str = ""):
    rows = [{"question_id": i, "category": "a", "turns": [f"abab {i} abab {i} ab"]} for i in range(3)]
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = tmp_path / "exp.toml"
    path.write_text(textwrap.dedent(CONFIG.format(linears=linears)))
    return path


def test_an_unknown_linears_value_is_refused_naming_the_valid_ones(tmp_path):
    with pytest.raises(ConfigError, match="linears 'int8' is not one of float32, bf16"):
        load_config(write(tmp_path, 'linears = "int8"'))


def test_the_fingerprint_names_bf16_linears_and_leaves_the_default_out(tmp_path):
    """Runs written before the switch existed keep matching their fingerprint."""
    plain = load_config(write(tmp_path)).fingerprint()
    assert "linears" not in plain["target"]
    bf16 = load_config(write(tmp_path, 'linears = "bf16"')).fingerprint()
    assert bf16["target"]["linears"] == "bf16" and {**bf16["target"], "linears": None} != plain["target"]


@needs_bf16
def test_every_arm_runs_the_bf16_target_and_stays_lossless(tmp_path):
    cfg = load_config(write(tmp_path, 'linears = "bf16"'))
    assert linears_label(ModelPool(cfg).target()) == f"bf16-{BF16_PATH}"
    out = run_experiment(cfg, progress=False).out_dir
    meta = json.loads((out / "run.json").read_text())
    assert meta["linears"] == f"bf16-{BF16_PATH}"
    answers = {arm: [r["output_ids"] for r in read_answers(out / "answers" / f"{arm}.jsonl")]
               for arm in ("autoregressive", "hf-prompt-lookup", "talon")}
    assert answers["talon"] == answers["autoregressive"] == answers["hf-prompt-lookup"]


def test_without_bf16_instructions_run_json_says_float32(tmp_path, monkeypatch):
    monkeypatch.setenv(bf16_linear.PATH_ENV, "float32")
    cfg = load_config(write(tmp_path, 'linears = "bf16"'))
    with pytest.warns(RuntimeWarning, match="float32"):
        label = linears_label(ModelPool(cfg).target())
    assert label.startswith("float32")
    cfg.arms = cfg.arms[:1]
    out = run_experiment(cfg, progress=False).out_dir
    assert json.loads((out / "run.json").read_text())["linears"] == "float32 (bf16 unsupported here)"


@needs_bf16
def test_load_causal_lm_takes_the_linears_keyword():
    from specframe.models.target import load_causal_lm

    assert linears_label(load_causal_lm("demo-target", linears="bf16")) == f"bf16-{BF16_PATH}"
    assert linears_label(load_causal_lm("demo-target")) == "float32"


def test_load_causal_lm_refuses_unknown_linears_before_loading():
    from specframe.models.target import load_causal_lm

    with pytest.raises(ValueError, match="'fp8'.*float32, bf16"):
        load_causal_lm("no-such-model", linears="fp8")


def test_profile_refuses_unknown_linears_naming_the_choices():
    result = CliRunner().invoke(cli, ["profile", "demo-target", "--linears", "int8"])
    assert result.exit_code != 0 and "'float32', 'bf16'" in result.output
