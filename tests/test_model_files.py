"""Answers are tied to the models' content, not only their names: the target's local folder,
and shipped heads named in an arm's options, are hashed into run.json, so other weights under
the same name are refused (naming what changed), never answered from the old run."""

from __future__ import annotations

import json

import pytest
import torch

from specframe.errors import ExperimentError
from specframe.experiments.experiment import run_experiment
from specframe.experiments.runs import artifacts
from specframe.testing.fixtures import char_tokenizer
from specframe.testing.models import tiny_model

RUN = """
name = "weights"
max_new_tokens = 4
warmup = 0
stop_at_eos = false
threads = 1

[target]
model = "{target}"
dtype = "float64"

[[arm]]
baseline = "autoregressive"

[[arm]]
drafter = "ngram"
policy = "chain"

[data]
path = "{prompts}"
chat_template = false

[output]
dir = "{out}"
"""


def save_target(folder, seed: int) -> None:
    tiny_model("llama", seed=seed, layers=1, vocab_size=64, dtype=torch.float32).save_pretrained(folder)
    char_tokenizer().save_pretrained(folder)


def test_other_weights_under_the_same_path_are_refused(tmp_path):
    save_target(tmp_path / "target", seed=1)
    (tmp_path / "q.jsonl").write_text(json.dumps({"question_id": 0, "category": "a", "turns": ["ab ab"]}) + "\n")
    config = tmp_path / "run.toml"
    config.write_text(RUN.format(target=tmp_path / "target", prompts=tmp_path / "q.jsonl", out=tmp_path / "out"))
    assert run_experiment(config, progress=False).computed == 2
    assert "target" in json.loads((tmp_path / "out" / "run.json").read_text())["fingerprint"]["model_files"]
    save_target(tmp_path / "target", seed=1)  # the same weights saved again: resumes
    assert run_experiment(config, progress=False).computed == 0
    save_target(tmp_path / "target", seed=2)
    with pytest.raises(ExperimentError, match="model_files"):
        run_experiment(config, progress=False)
    assert run_experiment(config, progress=False, fresh=True).computed == 2


def test_a_shipped_name_in_an_arm_s_options_is_hashed_as_its_folder(tmp_path, monkeypatch):
    from specframe.models import assets

    head = tmp_path / "head"
    head.mkdir()
    (head / "config.json").write_text("{}")
    monkeypatch.setitem(assets.SHIPPED_MODELS, "my-shipped-head", head)
    first = artifacts.arm_artifacts({"drafter": {"path": "my-shipped-head"}})
    assert set(first) == {"drafter.path"}
    (head / "weights.bin").write_bytes(b"retrained")
    assert artifacts.arm_artifacts({"drafter": {"path": "my-shipped-head"}}) != first
    assert artifacts.arm_artifacts({"drafter": {"path": "not-shipped-and-not-a-path"}}) == {}


@pytest.mark.parametrize("model, tokenizer", [("random:llama", "bytes"), ("perturbed:target", None),
                                              ("some-org/not-downloaded", "some-org/not-downloaded")])
def test_names_without_local_files_have_nothing_to_hash(model, tokenizer):
    from specframe.experiments.config import ModelSpec

    assert artifacts.model_files({"target": ModelSpec(model=model, tokenizer=tokenizer)}) == {}


def test_only_names_that_can_be_files_are_looked_up():
    from specframe.experiments.config import ModelSpec

    assert ModelSpec(model="random:llama", tokenizer="bytes").file_names() == {}
    assert ModelSpec(model="perturbed:target").file_names() == {}
    assert ModelSpec(model="/m", tokenizer="/t").file_names() == {"": "/m", "tokenizer": "/t"}
