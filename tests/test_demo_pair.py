"""The shipped demo pair (``demo-target`` / ``demo-draft``) and the errors of loading a pair.

The demo-pair tests FAIL (never skip) when the assets are missing: they are package data and
must ship with every checkout.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import specframe
from specframe.models.assets import resolve_model_path
from specframe.models.pairs import check_same_tokenizer
from specframe.models.target import load_causal_lm
from specframe.testing.models import tiny_model

PROMPTS = Path(__file__).resolve().parent.parent / "examples" / "prompts" / "code.jsonl"
MAX_NEW = 32


# ---------------------------------------------------------------------- the shipped pair
@pytest.fixture(scope="module")
def demo():
    """(target model, draft model, tokenizer, 3 prompt id tensors) loaded from package data."""
    from transformers import AutoTokenizer

    missing = None
    try:
        target_dir = resolve_model_path("demo-target")
        resolve_model_path("demo-draft")
    except FileNotFoundError as err:
        missing = str(err)
    if missing is not None:
        pytest.fail(
            f"the shipped demo pair is missing ({missing}); it is package data under "
            "specframe/assets/demo-pair/{target,draft} and must be committed "
            "(scripts/train_demo_pair.py produces it)",
            pytrace=False,
        )
    target = load_causal_lm("demo-target", dtype="float32")
    draft = load_causal_lm("demo-draft", dtype="float32")
    tok = AutoTokenizer.from_pretrained(target_dir)
    lines = [json.loads(l) for l in PROMPTS.read_text().splitlines() if l.strip()][:3]
    prompts = [torch.tensor(tok(p["turns"][0], add_special_tokens=False)["input_ids"]) for p in lines]
    assert len(prompts) == 3 and all(len(p) > 10 for p in prompts)
    return target, draft, tok, prompts


def _greedy(model, ids: torch.Tensor) -> list[int]:
    eos = model.generation_config.eos_token_id
    out = model.generate(
        ids[None], attention_mask=torch.ones(1, len(ids), dtype=torch.long), max_new_tokens=MAX_NEW,
        do_sample=False, eos_token_id=eos, pad_token_id=eos,
    )
    return out[0, len(ids) :].tolist()


@pytest.fixture(scope="module")
def references(demo):
    """The target's own greedy continuations of the 3 prompts."""
    target, _, _, prompts = demo
    return [_greedy(target, p) for p in prompts]


def test_demo_pair_loads_and_shares_a_tokenizer(demo):
    target, draft, tok, _ = demo
    assert target.config.model_type == draft.config.model_type == "llama"
    assert target.get_output_embeddings().weight.shape[0] == draft.get_output_embeddings().weight.shape[0]
    assert len(tok) == target.config.vocab_size
    assert check_same_tokenizer("demo-target", "demo-draft") is True
    # The draft is the much smaller model of the pair.
    n = [sum(p.numel() for p in m.parameters()) for m in (target, draft)]
    assert n[1] * 3 < n[0], n


@pytest.mark.parametrize(
    "drafter, policy",
    [
        (("model", {"model": "demo-draft"}), ("chain", {"gamma": 4})),
        (("ngram", {}), ("chain", {"gamma": 4})),
        (("model", {"model": "demo-draft"}), ("talon", {"budget": 24})),
    ],
    ids=["model-chain", "ngram-chain", "model-talon"],
)
def test_demo_pair_speculative_equals_greedy(demo, references, drafter, policy):
    target, _, tok, prompts = demo
    dec = specframe.SpecDecoder.build(target=target, drafter=drafter, policy=policy)
    for ids, ref in zip(prompts, references):
        out = dec.generate(ids, max_new_tokens=MAX_NEW)
        print(f"{drafter[0]} x {policy[0]}: tau={out.tau:.2f} {tok.decode(out.tokens)!r}")
        assert out.tokens == ref


# ---------------------------------------------------------------------- loading errors
def test_missing_model_path_is_a_clear_error(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(FileNotFoundError, match="no-such-model.*does not exist"):
        load_causal_lm(str(missing))
    target = tiny_model(vocab_size=64)
    with pytest.raises(FileNotFoundError, match="no-such-model"):
        specframe.SpecDecoder.build(target=target, drafter=("model", {"model": str(missing)}))


def test_directory_without_config_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_causal_lm(str(tmp_path))


def _bpe(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<eos>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


def _save_pair_member(path: Path, tokenizer, seed: int) -> str:
    model = tiny_model(vocab_size=len(tokenizer), seed=seed, dtype=torch.float32)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def tokenizers_ab():
    """Two byte-level BPEs of the same size trained on different text, so ids disagree."""
    a = _bpe(["def f(x):\n    return x + 1\n" * 50, "class A:\n    pass\n" * 50], 280)
    b = _bpe(["The quick brown fox jumps over the lazy dog. " * 50, "lorem ipsum dolor " * 50], 280)
    assert len(a) == len(b)
    return a, b


def test_mismatched_tokenizers_are_a_clear_error(tmp_path, tokenizers_ab):
    a, b = tokenizers_ab
    target_dir = _save_pair_member(tmp_path / "target", a, seed=0)
    draft_dir = _save_pair_member(tmp_path / "draft", b, seed=1)
    same_dir = _save_pair_member(tmp_path / "draft-same", a, seed=1)
    assert check_same_tokenizer(target_dir, same_dir) is True
    with pytest.raises(ValueError, match=r"(?s)target.*target.*draft.*draft.*token id \d+ is"):
        check_same_tokenizer(target_dir, draft_dir)
    # The model drafter runs the check when target and draft both come from paths.
    target = load_causal_lm(target_dir)
    with pytest.raises(ValueError, match="do not share a tokenizer"):
        specframe.SpecDecoder.build(target=target, drafter=("model", {"model": draft_dir}))
    dec = specframe.SpecDecoder.build(target=target, drafter=("model", {"model": same_dir}))
    assert len(dec.generate(torch.tensor([5, 6, 7]), max_new_tokens=4).tokens) >= 1


def test_tokenizer_check_sees_vocab_size_and_merges(tmp_path, tokenizers_ab):
    a, _ = tokenizers_ab
    small = _bpe(["def f(x):\n    return x + 1\n" * 50], 270)
    base = _save_pair_member(tmp_path / "base", a, seed=0)
    with pytest.raises(ValueError, match=r"vocabulary sizes differ \(280 vs 270\)"):
        check_same_tokenizer(base, _save_pair_member(tmp_path / "small", small, seed=0))
    # Same vocabulary, one merge changed: still a different tokenizer.
    other = _save_pair_member(tmp_path / "other", a, seed=0)
    spec_path = Path(other) / "tokenizer.json"
    spec = json.loads(spec_path.read_text())
    merges = spec["model"]["merges"]
    merges[0], merges[1] = merges[1], merges[0]
    spec_path.write_text(json.dumps(spec))
    with pytest.raises(ValueError, match="BPE merge 0 is"):
        check_same_tokenizer(base, other)


def test_tokenizer_check_skips_what_it_cannot_compare(tmp_path):
    bare = tmp_path / "bare"
    tiny_model(vocab_size=64).save_pretrained(bare)  # no tokenizer files saved
    assert check_same_tokenizer(str(bare), str(bare)) is False
    with pytest.raises(FileNotFoundError, match="does not exist"):
        check_same_tokenizer(str(tmp_path / "missing"), str(bare))


# ---------------------------------------------------------------------- the training script
SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def test_training_script_smoke_run_writes_a_loadable_pair_from_the_held_out_split(tmp_path):
    import subprocess
    import sys

    from transformers import AutoTokenizer

    proc = subprocess.run([sys.executable, str(SCRIPTS / "train_demo_pair.py"), "--smoke", "--with-tests",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["data"]["test_code_in_training"] is True
    assert set(metrics["models"]) == {"target", "draft"}
    assert all(m["heldout_bits_per_byte"] > 0 for m in metrics["models"].values())
    target = load_causal_lm(str(tmp_path / "target"))
    tok = AutoTokenizer.from_pretrained(tmp_path / "target")
    assert target.config.vocab_size == len(tok)
    prompts = [json.loads(line) for line in (tmp_path / "prompts" / "code.jsonl").read_text().splitlines()]
    assert prompts and all(p["turns"][0].rstrip().endswith(('"""', "'''")) for p in prompts)


def load_script(name: str):
    """A script under scripts/ imported as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_test_code_joins_training_only():
    trainer = load_script("train_demo_pair")
    _, train, held = trainer.read_split(smoke=False)
    _, train_all, held_all = trainer.read_split(smoke=False, with_tests=True)
    assert [r for r, _ in held_all] == [r for r, _ in held]  # same held-out set and prompts
    assert not any(trainer.is_test(r) for r, _ in held_all)
    assert any(trainer.is_test(r) for r, _ in train_all) and not any(trainer.is_test(r) for r, _ in train)
    assert not {r for r, _ in train_all} & {r for r, _ in held_all}


def test_loop_count_sees_loops_inside_and_after_the_function_body():
    evaluate = load_script("eval_demo_pair")
    body = "\n    if x:\n        return x\n    return None\n"
    after = "def g(y):\n    return y\n    return y\n    return y\n"
    assert evaluate.function_body(body + after) == body
    assert evaluate.function_body(body) == body  # no end within the tokens: all of it
    looping_body = "\n" + "    x = x + 1\n" * 3 + "    retu"
    reps = evaluate.repetition([body + after, body, looping_body])
    assert reps == {"prompts": 3, "looping": 2, "no_repeated_line": 1}
    cut = evaluate.repetition([evaluate.function_body(t) for t in (body + after, body, looping_body)])
    assert cut == {"prompts": 3, "looping": 1, "no_repeated_line": 2}
