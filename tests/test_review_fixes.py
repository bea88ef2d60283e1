"""Robustness at four edges: concurrent conversions of one GGUF file convert it once and clear
what killed ones left; EAGLE training state saves and resumes weights-only; cost curves are
validated where they are built or read; the model drafter checks the draft model's context
length before it forwards past it."""

from __future__ import annotations

import fractions
import hashlib
import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import click
import pytest
import torch

from specframe.drafters.model import ModelDrafter, ModelDrafterOptions
from specframe.interfaces import DraftSession
from specframe.sizing.profile import CostCurve
from specframe.models.target import TargetModel
from specframe.testing.harness import grow_tree
from specframe.testing.models import tiny_model


# ---------------------------------------------------------------------- GGUF conversion
def _dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", ""])
    proc.wait()
    return proc.pid


def test_concurrent_gguf_conversions_convert_once_and_clear_dead_temps(tmp_path, monkeypatch):
    """Two conversions of one file at once: one converts, the other waits and loads its result;
    a temporary directory left by a killed conversion goes, one of a live process stays."""
    pytest.importorskip("gguf", reason="the [gguf] extra is not installed")
    from test_gguf import tiny_llama, write_gguf

    from specframe.models import gguf as sg

    monkeypatch.setenv("SPECFRAME_CACHE", str(tmp_path / "cache"))
    path = write_gguf(tiny_llama(), tmp_path / "tiny.gguf")
    out = sg.cache_dir_for(path)
    stale = out.with_name(f"{out.name}.tmp{_dead_pid()}")
    live = out.with_name(f"{out.name}.tmp1")  # pid 1 (init) is always alive
    for tmp in (stale, live):
        tmp.mkdir(parents=True)
        (tmp / "config.json").write_text("{}")

    real, calls = sg._convert, []

    def counted(*args):
        calls.append(threading.get_ident())
        threading.Event().wait(0.2)  # hold the conversion open so that the other thread arrives
        return real(*args)

    monkeypatch.setattr(sg, "_convert", counted)
    start, results, errors = threading.Barrier(2), [], []

    def convert() -> None:
        start.wait()
        try:
            results.append(sg.converted_dir(path, quiet=True))
        except BaseException as err:  # noqa: BLE001  (reported by the assertion below)
            errors.append(err)

    threads = [threading.Thread(target=convert) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert results == [out, out] and len(calls) == 1
    assert json.loads((out / sg.DONE_MARKER).read_text())["source"] == str(path.resolve())
    assert (out / "model.safetensors").is_file()
    assert not stale.exists() and live.exists()


# ---------------------------------------------------------------------- EAGLE training state
def _training_config(tmp_path: Path, steps: int):
    from specframe.testing.fixtures import char_tokenizer
    from test_eagle import VOCAB

    from specframe.drafters.eagle_train import TrainConfig

    if not (tmp_path / "target").exists():
        model = tiny_model("llama", seed=5, layers=4, vocab_size=VOCAB, dtype=torch.float32)
        model.save_pretrained(tmp_path / "target")
        char_tokenizer().save_pretrained(tmp_path / "target")
        (tmp_path / "a.py").write_text("def add(x, y):\n    return x + y\n" * 20)
    return TrainConfig(target=str(tmp_path / "target"), data=[str(tmp_path / "a.py")], out=str(tmp_path / "head"),
                       seq_len=24, batch_size=2, ttt_steps=2, draft_vocab_size=30, steps=steps)


def test_training_state_resumes_under_weights_only(tmp_path, monkeypatch):
    """The saved state holds tensors and plain values, and a resume reads it weights-only."""
    from specframe.drafters.eagle_train import train

    assert train(_training_config(tmp_path, steps=2), progress=False)["steps"] == 2
    real_load, modes = torch.load, []

    def spy(*args, **kwargs):
        modes.append(kwargs.get("weights_only"))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    assert train(_training_config(tmp_path, steps=3), progress=False)["steps"] == 3  # resumed at 2
    assert modes == [True]
    state = real_load(tmp_path / "head" / ".train-state" / "state.pt", weights_only=True)
    assert state["state"]["step"] == 3 and isinstance(state["gen"], torch.Tensor)


def test_training_state_with_a_pickled_object_is_refused(tmp_path):
    """A state file holding anything but tensors and plain values is not unpickled."""
    from specframe.drafters.eagle_train import train

    cfg = _training_config(tmp_path, steps=1)
    cfg.work_dir.mkdir(parents=True)
    torch.save({"config": fractions.Fraction(1, 3)}, cfg.work_dir / "state.pt")
    with pytest.raises(click.ClickException) as err:
        train(cfg, progress=False)
    message = err.value.message
    assert "holds more than tensors and plain values" in message and "fractions.Fraction" in message
    assert "\n" not in message


# ---------------------------------------------------------------------- cost curves
VALID = {"key": "k", "sizes": [1, 2, 4], "cache_lens": [64, 512],
         "seconds": [[1.0, 1.5, 2.0], [1.2, 1.8, 2.4]], "padded_to": []}


@pytest.mark.parametrize("change, field", [
    ({"sizes": [1, 2, 2]}, "sizes"),
    ({"sizes": [0, 2, 4]}, "sizes"),
    ({"cache_lens": [64, 64]}, "cache_lens"),
    ({"seconds": [[1.0, 1.5, 2.0]]}, "seconds"),
    ({"seconds": [[1.0, 1.5], [1.2, 1.8, 2.4]]}, "seconds[0]"),
    ({"seconds": [[1.0, 0.0, 2.0], [1.2, 1.8, 2.4]]}, "seconds[0][1]"),
    ({"seconds": [[1.0, 1.5, 2.0], [1.2, -1.8, 2.4]]}, "seconds[1][1]"),
    ({"seconds": [[1.0, 1.5, float("nan")], [1.2, 1.8, 2.4]]}, "seconds[0][2]"),
    ({"padded_to": [8, 4]}, "padded_to"),
])
def test_invalid_cost_curves_are_refused_naming_the_field(change, field):
    fields = {**VALID, **change}
    with pytest.raises(ValueError) as built:
        CostCurve(**fields)
    assert str(built.value).startswith(f"cost curve 'k': {field} ") and "\n" not in str(built.value)
    with pytest.raises(ValueError) as read:
        CostCurve.from_json(json.dumps(fields), source="curve.json")
    assert str(read.value).startswith(f"cost curve curve.json: {field} ") and "\n" not in str(read.value)


def test_cost_curve_json_without_fields_or_not_json_is_a_value_error():
    with pytest.raises(ValueError, match="curve.json: missing field.*seconds"):
        CostCurve.from_json(json.dumps({k: v for k, v in VALID.items() if k != "seconds"}), source="curve.json")
    with pytest.raises(ValueError, match="curve.json: not JSON"):
        CostCurve.from_json("{", source="curve.json")


def test_valid_cost_curve_round_trips():
    curve = CostCurve(**{**VALID, "padded_to": [1, 2, 4, 8]})
    assert CostCurve.from_json(curve.to_json()) == curve
    assert curve.time(3, 64) == pytest.approx(2.0)  # the staircase prices 3 tokens as 4


# ---------------------------------------------------------------------- draft context length
def _drafter(draft_positions: int) -> ModelDrafter:
    """A model drafter whose draft has ``draft_positions`` positions, for a 512-position target."""
    target = TargetModel(tiny_model("llama", max_positions=512))
    return ModelDrafter(ModelDrafterOptions(model=tiny_model("llama", seed=1, max_positions=draft_positions)), target)


def test_draft_max_positions_is_the_drafts_context_length(monkeypatch):
    assert _drafter(16).max_positions == 16
    target = TargetModel(tiny_model("llama"))
    draft = tiny_model("llama", seed=1)
    # A config that names no context length (Llama's has a class default: hide both).
    delattr(draft.config, "max_position_embeddings")
    monkeypatch.setattr(type(draft.config), "max_position_embeddings", None)
    assert ModelDrafter(ModelDrafterOptions(model=draft), target).max_positions is None


def test_prompt_longer_than_the_draft_is_refused_at_begin():
    drafter = _drafter(16)
    with pytest.raises(ValueError) as err:
        drafter.begin(torch.arange(2, 22))
    message = str(err.value)
    assert "draft model LlamaForCausalLM has 16 positions" in message and "needs 20" in message
    assert "\n" not in message


def test_draft_tree_past_the_drafts_positions_is_refused_before_the_forward():
    drafter = _drafter(16)
    drafter.begin(torch.arange(2, 16))  # 14 tokens: the root sits at position 13
    session = DraftSession(drafter, 15, torch.device("cpu"))
    forwards = []
    real = drafter.lm.forward
    drafter.lm.forward = lambda *a, **k: forwards.append(1) or real(*a, **k)
    with pytest.raises(ValueError, match="draft model LlamaForCausalLM has 16 positions but a draft "
                                         "tree 3 deep after 14 committed tokens needs 17"):
        grow_tree(session, [1, 1, 1, 1])  # expanding the depth-3 node reads position 16
    assert len(forwards) == 3  # depths 0-2 ran; the fourth was refused before the model


def test_one_gguf_file_at_two_paths_is_converted_into_one_folder(tmp_path, monkeypatch):
    """The converted checkpoint (and with it the cost curve's key) follows the file's content,
    not where an environment installed it; another file gets another folder."""
    pytest.importorskip("gguf", reason="the [gguf] extra is not installed")
    from test_gguf import tiny_llama, write_gguf

    from specframe.models import gguf as sg

    monkeypatch.setenv("SPECFRAME_CACHE", str(tmp_path / "cache"))
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
    path = write_gguf(tiny_llama(), tmp_path / "a" / "tiny.gguf")
    copy = Path(shutil.copy(path, tmp_path / "b" / "tiny.gguf"))
    assert sg.cache_dir_for(path) == sg.cache_dir_for(copy)
    assert sg.content_key(path) == hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    copy.write_bytes(copy.read_bytes() + b"\0")  # other content, other folder (and a new mtime)
    assert sg.cache_dir_for(copy) != sg.cache_dir_for(path)
