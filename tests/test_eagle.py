"""EAGLE-1/2 and EAGLE-3 heads: published checkpoint layouts, lossless drafting, tree honesty, trainer."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

import specframe
from specframe.drafters.eagle_checkpoint import CheckpointError, load_head, random_head, save_head
from specframe.drafters.eagle_head import reference_path_logp
from specframe.interfaces import DraftSession
from specframe.options import OptionError
from specframe.models.target import TargetModel
from specframe.testing.fixtures import char_tokenizer
from specframe.testing.models import tiny_model
from specframe.testing.strategies import prompts

VOCAB, DRAFT_VOCAB = 64, 40

EAGLE3_KEYS = {
    "fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d",
    "midlayer.hidden_norm.weight", "midlayer.input_layernorm.weight", "midlayer.post_attention_layernorm.weight",
    *(f"midlayer.self_attn.{p}_proj.weight" for p in "qkvo"),
    *(f"midlayer.mlp.{p}_proj.weight" for p in ("gate", "up", "down")),
}
EAGLE1_KEYS = {
    "embed_tokens.weight", "fc.weight", "fc.bias", "layers.0.post_attention_layernorm.weight",
    *(f"layers.0.self_attn.{p}_proj.weight" for p in "qkvo"),
    *(f"layers.0.mlp.{p}_proj.weight" for p in ("gate", "up", "down")),
}


@pytest.fixture(scope="module")
def target():
    """A tiny float64 Llama with 4 layers (EAGLE-3 reads the inputs of layers 1, 2, 3)."""
    return tiny_model("llama", seed=3, layers=4, vocab_size=VOCAB, dtype=torch.float64)


@pytest.fixture(scope="module")
def heads(target):
    """Random heads of both kinds; EAGLE-3 with a reduced draft vocabulary (non-trivial d2t)."""
    return {"eagle": random_head(target, "eagle", seed=1),
            "eagle3": random_head(target, "eagle3", seed=2, draft_vocab_size=DRAFT_VOCAB)}


@pytest.fixture(scope="module")
def checkpoints(heads, tmp_path_factory):
    """Both heads saved in the published layout (float64 so a reload is bit-exact)."""
    root = tmp_path_factory.mktemp("eagle")
    return {kind: save_head(head, root / kind, dtype=torch.float64) for kind, head in heads.items()}


def greedy_reference(model, ids: list[int], n: int) -> list[int]:
    x = torch.tensor([ids])
    out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False,
                         eos_token_id=None, pad_token_id=0)
    return out[0, len(ids):].tolist()


# ---------------------------------------------------------------------- layout and loading
def test_saved_keys_are_the_published_layout(checkpoints):
    assert set(load_file(str(checkpoints["eagle3"] / "model.safetensors"))) == EAGLE3_KEYS
    assert set(load_file(str(checkpoints["eagle"] / "model.safetensors"))) == EAGLE1_KEYS
    cfg3 = json.loads((checkpoints["eagle3"] / "config.json").read_text())
    assert cfg3["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg3["draft_vocab_size"] == DRAFT_VOCAB and cfg3["target_hidden_size"] == 32
    assert cfg3["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]


def test_d2t_offsets_are_nontrivial_and_consistent_with_t2d(checkpoints):
    state = load_file(str(checkpoints["eagle3"] / "model.safetensors"))
    d2t, t2d = state["d2t"], state["t2d"]
    assert d2t.dtype == torch.int64 and t2d.dtype == torch.bool
    assert bool((d2t != 0).any()), "test needs a draft vocabulary that is not a prefix of the target's"
    mapped = torch.arange(DRAFT_VOCAB) + d2t
    assert sorted(mapped.tolist()) == torch.nonzero(t2d).flatten().tolist()


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_load_reproduces_the_saved_head(kind, target, heads, checkpoints):
    loaded = load_head(checkpoints[kind], target, kind=kind)
    for key, value in heads[kind].state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key


def test_expand_returns_target_vocab_with_minus_inf_outside_draft_vocab(target, checkpoints):
    dec = specframe.SpecDecoder.build(target=target, drafter=("eagle3", {"path": str(checkpoints["eagle3"])}))
    prompt = torch.tensor([5, 9, 11, 3])
    tm = dec.target
    tm.reset()
    dec.drafter.begin(prompt, tm.causal_forward(prompt[:-1], True).hidden_states)
    session = DraftSession(dec.drafter, int(prompt[-1]), tm.device)
    logp = session.expand(session.new_tree(), [0])
    assert logp.shape == (1, VOCAB)
    finite = torch.isfinite(logp[0])
    state = load_file(str(checkpoints["eagle3"] / "model.safetensors"))
    assert torch.equal(finite, state["t2d"])
    assert torch.allclose(logp[0][finite].exp().sum(), torch.tensor(1.0, dtype=logp.dtype))


# ---------------------------------------------------------------------- lossless generation
@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_lossless_with_every_registered_policy(kind, target, checkpoints):
    policies = specframe.get_registry().names("policies")
    assert {"talon", "eagle"} <= set(policies)
    for i, policy in enumerate(policies):
        # A growing or a pre-allocated KV cache, alternating over the policies and swapped
        # between the two kinds: each head meets both caches, and each policy meets both with
        # one head or the other (the caches hold the same tokens behind one interface).
        preallocate = (i + (kind == "eagle3")) % 2 == 1
        dec = specframe.SpecDecoder.build(target=specframe.TargetModel(target, preallocate=preallocate),
                                          drafter=(kind, {"path": str(checkpoints[kind])}), policy=policy)
        for prompt in ([7], [4, 9, 12, 30, 2, 17]):  # a 1-token prompt has no target feature yet
            out = dec.generate(torch.tensor([prompt]), max_new_tokens=20, eos_token_id=None)
            assert out.tokens == greedy_reference(target, prompt, 20), (kind, policy, preallocate, prompt)


@settings(deadline=None)
@given(prompt=prompts(VOCAB, 1, 24), kind=st.sampled_from(["eagle", "eagle3"]),
       policy=st.sampled_from(["talon", "eagle", "chain"]), n=st.integers(1, 16))
def test_lossless_property(target, heads, prompt, kind, policy, n):
    dec = specframe.SpecDecoder.build(target=target, drafter=(kind, {"head": heads[kind]}), policy=policy)
    assert dec.generate(torch.tensor(prompt), max_new_tokens=n, eos_token_id=None).tokens == greedy_reference(target, prompt, n)


# ---------------------------------------------------------------------- tree attention honesty
def _reference_pairs(target, head, committed: list[int]):
    """Committed pairs from a plain full target forward (independent of any cache)."""
    with torch.no_grad():
        out = target(input_ids=torch.tensor([committed[:-1]]), output_hidden_states=True)
    return head.features(out.hidden_states)[0], torch.tensor(committed[1:])


@settings(deadline=None, max_examples=8)
@given(kind=st.sampled_from(["eagle", "eagle3"]), prompt=prompts(VOCAB, 2, 12),
       widths=st.lists(st.integers(1, 3), min_size=1, max_size=3), steps=st.integers(1, 3))
def test_one_expand_is_one_head_forward_and_tree_attention_is_honest(target, heads, kind, prompt, widths, steps):
    """Against the slow reference: every node's draft distribution equals the head run along
    that node's path alone (from scratch, no cache), over several steps (so commit is checked)."""
    dec = specframe.SpecDecoder.build(target=target, drafter=(kind, {"head": heads[kind]}))
    drafter, tm = dec.drafter, dec.target
    forwards = []
    hook = drafter.head.register_forward_hook(lambda *a: forwards.append(1))
    committed = list(prompt)
    tm.reset()
    drafter.begin(torch.tensor(committed), tm.causal_forward(torch.tensor(committed[:-1]), True).hidden_states)
    try:
        for _ in range(steps):
            session = DraftSession(drafter, committed[-1], tm.device)
            tree, frontier, logps = session.new_tree(), [0], {}
            for width in widths + [1]:  # the last layer is expanded, never extended
                before = len(forwards)
                logp = session.expand(tree, frontier)
                assert len(forwards) - before == 1, "one expand must be exactly one head forward"
                logps.update({node: logp[j] for j, node in enumerate(frontier)})
                top = logp.topk(width, dim=-1)
                parents = torch.tensor(frontier).repeat_interleave(width)
                start = len(tree)
                tree = tree.add_nodes(parents, top.indices.flatten(), top.values.flatten().float(),
                                      torch.arange(width).repeat(len(frontier)))
                frontier = list(range(start, len(tree)))
            tree = tree.select(torch.arange(start))  # drop the unexpanded last layer
            feats, toks = _reference_pairs(target, drafter.head, committed)
            for node, got in logps.items():
                path = [int(tree.tokens[i]) for i in tree.path_to(node)[1:]]
                want = reference_path_logp(drafter.head, feats, toks, path)
                assert torch.allclose(got, want, atol=1e-8), (kind, node, path)
            out = tm.tree_forward(tree.tokens, tree.positions(len(committed)), tree.ancestor_mask(), True)
            # Commit the deepest path whatever the target says: commit must work for any
            # accepted path, and a long one checks the feature/token pairing at every row.
            path = torch.tensor(tree.path_to(len(tree) - 1))
            emitted = tree.tokens[path[1:]].tolist() + [int(out.logits[0, path[-1]].argmax())]
            tm.keep(len(committed) - 1, path)
            drafter.commit(torch.tensor(emitted), path, out.hidden_states)
            committed += emitted
    finally:
        hook.remove()


def test_reference_differs_when_the_path_differs(target, heads):
    """The honesty check can fail: a different path gives a different distribution."""
    head = heads["eagle3"]
    feats, toks = _reference_pairs(target, head, [4, 9, 12, 30])
    a = reference_path_logp(head, feats, toks, [5, 6])
    b = reference_path_logp(head, feats, toks, [5, 7])
    assert not torch.allclose(a, b)


# ---------------------------------------------------------------------- errors
def _rewrite(src, dst, edit):
    dst.mkdir()
    state = load_file(str(src / "model.safetensors"))
    edit(state)
    save_file(state, str(dst / "model.safetensors"))
    (dst / "config.json").write_text((src / "config.json").read_text())
    return dst


def test_missing_key_is_named(target, checkpoints, tmp_path):
    bad = _rewrite(checkpoints["eagle3"], tmp_path / "bad", lambda s: s.pop("midlayer.hidden_norm.weight"))
    with pytest.raises(CheckpointError, match=r"missing key 'midlayer.hidden_norm.weight' \(expected shape \(32,\)\)"):
        load_head(bad, target)


def test_wrong_shape_names_key_expected_and_found(target, checkpoints, tmp_path):
    def edit(state):
        state["fc.weight"] = torch.zeros(32, 64, dtype=torch.float64)

    bad = _rewrite(checkpoints["eagle3"], tmp_path / "bad", edit)
    with pytest.raises(CheckpointError, match=r"key 'fc.weight' has shape \(32, 64\), expected \(32, 96\)"):
        load_head(bad, target)


def test_bad_d2t_is_refused(target, checkpoints, tmp_path):
    def edit(state):
        state["d2t"] = state["d2t"] + VOCAB

    bad = _rewrite(checkpoints["eagle3"], tmp_path / "bad", edit)
    with pytest.raises(CheckpointError, match="key 'd2t' maps draft id 0 to target id"):
        load_head(bad, target)


def test_kind_mismatch_names_the_right_drafter(target, checkpoints):
    with pytest.raises(CheckpointError, match="use drafter 'eagle3'"):
        specframe.SpecDecoder.build(target=target, drafter=("eagle", {"path": str(checkpoints["eagle3"])}))


def test_pickle_needs_opt_in(target, heads, checkpoints, tmp_path):
    directory = tmp_path / "pickled"
    directory.mkdir()
    torch.save(load_file(str(checkpoints["eagle"] / "model.safetensors")), directory / "pytorch_model.bin")
    (directory / "config.json").write_text((checkpoints["eagle"] / "config.json").read_text())
    with pytest.raises(CheckpointError, match="allow_pickle=True"):
        load_head(directory, target)
    loaded = load_head(directory, target, allow_pickle=True)
    assert torch.equal(loaded.fc.weight, heads["eagle"].fc.weight)
    with pytest.raises(CheckpointError, match="allow_pickle"):
        specframe.SpecDecoder.build(target=target, drafter=("eagle", {"path": str(directory)}))
    specframe.SpecDecoder.build(target=target, drafter=("eagle", {"path": str(directory), "allow_pickle": True}))


def test_options_need_a_checkpoint(target):
    with pytest.raises(OptionError, match="'path'"):
        specframe.SpecDecoder.build(target=target, drafter="eagle3")


def test_target_mismatch_is_named(checkpoints):
    other = tiny_model("llama", layers=4, vocab_size=VOCAB, hidden=48, dtype=torch.float64)
    with pytest.raises(CheckpointError, match="target_hidden_size is 32, the target's hidden size is 48"):
        load_head(checkpoints["eagle3"], TargetModel(other))


# ---------------------------------------------------------------------- trainer
@pytest.mark.parametrize("kind", ["eagle3", "eagle"])
def test_train_eagle_command_writes_a_loadable_head_and_resumes(kind, tmp_path):
    from click.testing import CliRunner

    from specframe.cli import cli

    model = tiny_model("llama", seed=5, layers=4, vocab_size=VOCAB, dtype=torch.float32)
    model.save_pretrained(tmp_path / "target")
    char_tokenizer().save_pretrained(tmp_path / "target")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.py").write_text("def add(x, y):\n    return x + y\n" * 20)
    (tmp_path / "data" / "b.jsonl").write_text(json.dumps({"turns": ["print(1 + 2)\n" * 10]}) + "\n")
    specframe.get_registry().commands_hook()(cli=cli)
    args = ["train-eagle", "--target", str(tmp_path / "target"), "--data", str(tmp_path / "data"),
            "--out", str(tmp_path / "head"), "--kind", kind, "--seq-len", "24", "--batch-size", "2",
            "--ttt-steps", "2", "--draft-vocab-size", "30", "--no-progress"]
    first = CliRunner().invoke(cli, args + ["--steps", "2"])
    assert first.exit_code == 0, first.output + repr(first.exception)
    second = CliRunner().invoke(cli, args + ["--steps", "4"])
    assert second.exit_code == 0, second.output
    summary = json.loads(second.output[second.output.rindex('{"kind"'):])
    assert summary["steps"] == 4  # resumed at 2, ran 2 more
    target64 = model.to(torch.float64)
    head = load_head(tmp_path / "head", target64, kind=kind)
    if kind == "eagle3":
        assert head.config.draft_vocab_size == 30
    dec = specframe.SpecDecoder.build(target=target64, drafter=(kind, {"path": str(tmp_path / "head")}), policy="talon")
    assert dec.generate(torch.tensor([3, 4, 5]), max_new_tokens=8, eos_token_id=None).tokens == greedy_reference(target64, [3, 4, 5], 8)


@given(start=st.integers(0, 700), p=st.integers(1, 40))
def test_root_forward_inputs_from_the_band_are_the_plain_causal_ones(start, p):
    from specframe.drafters.eagle import _CausalBand

    band = _CausalBand(torch.device("cpu"))
    for at in (0, start):  # a band grown earlier serves the later start too
        positions, mask = band.causal(at, p)
        assert torch.equal(positions, torch.arange(at, at + p)[None])
        assert torch.equal(mask, torch.ones(p, at + p, dtype=torch.bool).tril(diagonal=at)[None])
