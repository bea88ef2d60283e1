"""``specframe.load_tokenizer``: the tokenizer of every name ``load_causal_lm`` accepts (the GGUF
file and the registry name are tested with SmolLM2 in test_smollm2.py)."""

from __future__ import annotations

import json
import shutil

import pytest

import specframe
from specframe.models.assets import SHIPPED_MODELS
from specframe.models.tokenizer import TokenizerNotFoundError


def test_a_shipped_name_and_its_folder_give_the_same_tokenizer(tmp_path):
    folder = tmp_path / "copy"
    shutil.copytree(SHIPPED_MODELS["demo-target"], folder)
    by_name, by_folder = specframe.load_tokenizer("demo-target"), specframe.load_tokenizer(folder)
    text = "def add(a, b):\n    return a + b\n"
    ids = by_name(text, add_special_tokens=False)["input_ids"]
    assert ids and by_folder(text, add_special_tokens=False)["input_ids"] == ids
    assert by_name.decode(ids) == text
    # The demo pair's vocabulary, as its saved tokenizer file lists it.
    vocab = json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"]
    assert len(by_name) >= len(vocab)


def test_a_model_folder_without_a_tokenizer_is_named():
    with pytest.raises(TokenizerNotFoundError, match="smollm2-135m-instruct-eagle3.*holds no tokenizer"):
        specframe.load_tokenizer("smollm2-135m-instruct-eagle3")  # a head: config and weights only


def test_a_missing_path_is_refused_with_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="does-not-exist"):
        specframe.load_tokenizer(str(tmp_path / "does-not-exist"))
