"""Hydra heads: the reference's checkpoint layout read and checked (ties included), head d over
a node's path embeddings, Hydra++'s incremental prefix KV against a full recomputation, lossless
drafting under every policy, and ``train-hydra`` (tests/test_parity_hydra.py compares with the
authors' code)."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specframe.decode.engine import SpecDecoder, make_plugin
from specframe.drafters.hydra_heads import (WEIGHTS_NAME, HydraCheckpointError, HydraHeads, load_heads,
                                            random_heads, save_heads, tied_keys)
from specframe.models.target import TargetModel
from specframe.plugins import get_registry
from specframe.testing.conformance import DrafterConformance
from specframe.testing.fixtures import VOCAB, fixed_policy_spec, tiny_target
from specframe.testing.harness import greedy_by_recomputation
from specframe.testing.profiles import profile_examples
from specframe.tree import DraftTree

HIDDEN = 32  # tiny_target's
POLICIES = get_registry().names("policies")
EXAMPLES = max(2, profile_examples() // 3)


def config():
    return tiny_target().config.get_text_config()


def heads(arch: str = "mlp", num_heads: int = 3, num_layers: int = 2, grounded: bool = True, seed: int = 0) -> HydraHeads:
    return random_heads(HIDDEN, VOCAB, num_heads, num_layers, grounded, arch, config(), seed=seed).double()


def drafter_for(h: HydraHeads):
    target = TargetModel(tiny_target())
    return make_plugin("drafters", ("hydra", {"heads": h}), target), target


@pytest.mark.parametrize("arch", ["mlp", "prefix-mlp"])
def test_the_reference_layout_round_trips_with_its_ties(tmp_path, arch):
    saved = heads(arch, num_layers=3)
    save_heads(saved, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["hydra_head_arch"] == arch
    keys = set(torch.load(tmp_path / WEIGHTS_NAME, weights_only=True))
    slot = 1 if arch == "prefix-mlp" else 0  # Hydra++ puts a dropout slot before every block
    assert {f"hydra_mlp.0.{slot}.res_connection.weight", f"hydra_mlp.2.{slot}.linear.weight"} <= keys
    # The two later blocks of a head are one module: two groups of tied keys a head (the
    # linear's weight and bias), each naming both blocks.
    ties = tied_keys(saved)
    assert len(ties) == 2 * 3 and all(len(group) == 2 for group in ties)
    assert saved.hydra_mlp[0][-1] is saved.hydra_mlp[0][-1 - (1 + slot)]
    loaded = load_heads(tmp_path, config(), VOCAB)
    assert loaded.state_dict().keys() == saved.state_dict().keys()
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in saved.state_dict().items())
    assert loaded.hydra_mlp[1][-1] is loaded.hydra_mlp[1][-1 - (1 + slot)]


def test_checkpoint_refusals_name_what_is_wrong(tmp_path):
    save_heads(heads(num_layers=3), tmp_path / "ok")
    with pytest.raises(HydraCheckpointError, match=r"'hydra_lm_head.0.weight' has shape \(64, 32\), the target needs \(50, 32\)"):
        load_heads(tmp_path / "ok", config(), 50)
    with pytest.raises(HydraCheckpointError, match="no config.json"):
        load_heads(tmp_path, config(), VOCAB)
    state = torch.load(tmp_path / "ok" / WEIGHTS_NAME, weights_only=True)
    untied = dict(state, **{"hydra_mlp.1.2.linear.bias": state["hydra_mlp.1.2.linear.bias"] + 1})
    torch.save(untied, tmp_path / "ok" / WEIGHTS_NAME)
    with pytest.raises(HydraCheckpointError, match=r"hydra_mlp.1.1.linear.bias.*tied"):
        load_heads(tmp_path / "ok", config(), VOCAB)
    torch.save({k: v for k, v in state.items() if k != "hydra_mlp.0.0.res_connection.bias"}, tmp_path / "ok" / WEIGHTS_NAME)
    with pytest.raises(HydraCheckpointError, match=r"'hydra_mlp.0.0.res_connection.bias' missing"):
        load_heads(tmp_path / "ok", config(), VOCAB)
    torch.save({"state": state, "extra": object()}, tmp_path / "ok" / WEIGHTS_NAME)
    with pytest.raises(HydraCheckpointError, match="allow_pickle"):
        load_heads(tmp_path / "ok", config(), VOCAB)
    (tmp_path / "ok" / "config.json").write_text(json.dumps({"hydra_num_heads": 2, "hydra_head_arch": "cross-attn"}))
    with pytest.raises(HydraCheckpointError, match=r"'cross-attn'.*\['mlp', 'prefix-mlp'\]"):
        load_heads(tmp_path / "ok", config(), VOCAB)
    with pytest.raises(HydraCheckpointError, match="ungrounded prefix-mlp"):
        HydraHeads(HIDDEN, VOCAB, 2, arch="prefix-mlp", grounded=False, base_config=config())


def test_options_name_what_is_missing():
    target = TargetModel(tiny_target())
    with pytest.raises(ValueError, match="'path'"):
        make_plugin("drafters", "hydra", target)


def _embed(target: TargetModel, tokens: list[int]) -> torch.Tensor:
    return target.model.get_input_embeddings()(torch.tensor(tokens)).flatten()


@pytest.mark.parametrize("grounded", [True, False])
def test_a_node_gets_the_head_of_its_depth_over_its_path(grounded):
    h = heads(num_heads=2, grounded=grounded)
    drafter, target = drafter_for(h)
    state = torch.randn(HIDDEN, dtype=torch.float64)
    drafter.begin(torch.tensor([1, 2, 3]), target_hidden=(state[None, None],))
    # root 3 -> 5 -> 7 -> 9 (depth 3, past the two heads), and 6 beside 5
    tree = DraftTree.root(3).add_nodes(torch.tensor([0, 0]), torch.tensor([5, 6]), torch.zeros(2), torch.tensor([0, 1]))
    tree = tree.add_nodes(torch.tensor([1]), torch.tensor([7]), torch.zeros(1), torch.tensor([0]))
    tree = tree.add_nodes(torch.tensor([3]), torch.tensor([9]), torch.zeros(1), torch.tensor([0]))
    rows = drafter.expand(tree, torch.tensor([4, 0, 2, 3, 1]))

    def want(head: int, path: list[int]) -> torch.Tensor:
        x = torch.cat([state, _embed(target, path)]) if grounded else state
        return torch.log_softmax(h.head_logits(head, x), dim=-1)

    window = (lambda p, k: p[-k:]) if grounded else (lambda p, k: [])
    assert torch.allclose(rows[1], want(0, window([3], 1)))
    assert torch.allclose(rows[2], want(1, window([3, 6], 2)))
    assert torch.allclose(rows[4], want(1, window([3, 5], 2)))
    assert torch.allclose(rows[3], want(1, window([3, 5, 7], 2)))  # past the heads: the last one, its width
    assert torch.allclose(rows[0], want(1, window([3, 5, 7, 9], 2)))


def full_prefix(h: HydraHeads, rows: torch.Tensor) -> torch.Tensor:
    """The slow reference: the prefix layer over every fed row at once, its last output."""
    from transformers import DynamicCache

    cache = DynamicCache(config=h.prefix_embeding_layer.config)
    return h.prefix(rows, torch.arange(len(rows)), cache)[-1]


@settings(max_examples=EXAMPLES, deadline=None)
@given(prompt_len=st.integers(1, 6), steps=st.lists(st.integers(1, 4), min_size=1, max_size=4),
       seed=st.integers(0, 3))
def test_hydra_plus_plus_prefix_kv_equals_a_full_recomputation(prompt_len, steps, seed):
    """The drafter feeds each committed position once through the prefix layer, across steps;
    the state it drafts from equals the layer over all those positions at once."""
    h = heads("prefix-mlp", seed=seed)
    drafter, _ = drafter_for(h)
    gen = torch.Generator().manual_seed(seed)
    fed = torch.randn(prompt_len, HIDDEN, generator=gen, dtype=torch.float64)
    drafter.begin(torch.arange(prompt_len + 1), target_hidden=(fed[None],))
    for accepted in steps:
        tree = DraftTree.root(1)
        for depth in range(accepted - 1):
            tree = tree.add_nodes(torch.tensor([depth]), torch.tensor([2 + depth]), torch.zeros(1), torch.tensor([0]))
        drafter.expand(tree, torch.tensor([0]))
        assert torch.allclose(drafter.state, full_prefix(h, fed), atol=1e-10)
        verified = torch.randn(1, len(tree), HIDDEN, generator=gen, dtype=torch.float64)
        drafter.commit(tree.tokens, path=torch.arange(len(tree)), target_hidden=(verified,), tree=tree)
        fed = torch.cat([fed, verified[0]])
    drafter.expand(DraftTree.root(1), torch.tensor([0]))
    assert torch.allclose(drafter.state, full_prefix(h, fed), atol=1e-10)


@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=2, deadline=None)  # per policy; test_batch and the conformance suite add more
@given(prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=9), seed=st.integers(0, 3),
       arch=st.sampled_from(["mlp", "prefix-mlp"]))
def test_hydra_is_lossless_under_every_policy(policy, prompt, seed, arch):
    target = TargetModel(tiny_target())
    spec = fixed_policy_spec(policy)
    dec = SpecDecoder(target, make_plugin("drafters", ("hydra", {"heads": heads(arch, seed=seed)}), target),
                      make_plugin("policies", spec), make_plugin("verifiers", "greedy"))
    out = dec.generate(prompt, max_new_tokens=10, eos_token_id=None)
    assert out.tokens == greedy_by_recomputation(tiny_target(), prompt, 10, None)


class TestHydraPlusPlusConformance(DrafterConformance):
    """Hydra++: the prefix layer with its own KV before four grounded heads of three blocks."""

    plugin = "hydra"

    def make_drafter(self, target: TargetModel):
        cfg = target.model.config.get_text_config()
        h = random_heads(HIDDEN, int(target.vocab_size), 4, 3, True, "prefix-mlp", cfg, seed=3)
        return make_plugin("drafters", ("hydra", {"heads": h}), target)


@pytest.mark.parametrize("arch", ["mlp", "prefix-mlp"])
def test_train_hydra_writes_loadable_heads_resumes_and_reports_agreement(tmp_path, arch):
    from click.testing import CliRunner

    from specframe import get_registry as registry
    from specframe.cli import cli
    from specframe.testing.fixtures import char_tokenizer
    from specframe.testing.models import tiny_model

    model = tiny_model("llama", seed=5, layers=2, vocab_size=VOCAB, dtype=torch.float32)
    model.save_pretrained(tmp_path / "target")
    char_tokenizer().save_pretrained(tmp_path / "target")
    (tmp_path / "a.txt").write_text("the cat sat on the mat. " * 40)
    registry().commands_hook()(cli=cli)
    args = ["train-hydra", "--target", str(tmp_path / "target"), "--data", str(tmp_path / "a.txt"),
            "--heldout", str(tmp_path / "a.txt"), "--out", str(tmp_path / "heads"), "--seq-len", "24",
            "--batch-size", "2", "--positions", "16", "--heads", "2", "--layers", "2", "--arch", arch,
            "--no-progress"]
    first = CliRunner().invoke(cli, args + ["--steps", "2"])
    assert first.exit_code == 0, first.output + repr(first.exception)
    second = CliRunner().invoke(cli, args + ["--steps", "4"])
    assert second.exit_code == 0, second.output + repr(second.exception)
    summary = json.loads(second.output[second.output.rindex('{"kind"'):])
    assert summary["steps"] == 4 and len(summary["heldout_top1"]) == 2  # resumed at 2, ran 2 more
    assert all(0.0 <= a <= 1.0 for a in summary["heldout_top1"]) and summary["loss_recent"] > 0
    changed = CliRunner().invoke(cli, args + ["--steps", "5", "--layers", "3"])
    assert changed.exit_code != 0 and "layers" in changed.output
    loaded = load_heads(tmp_path / "heads", model.config, VOCAB)
    assert loaded.arch == arch and len(loaded) == 2 and len(tied_keys(loaded)) == 0  # two blocks: none tied
    target64 = TargetModel(model.to(torch.float64))
    dec = SpecDecoder(target64, make_plugin("drafters", ("hydra", {"path": str(tmp_path / "heads")}), target64),
                      make_plugin("policies", "talon"), make_plugin("verifiers", "greedy"))
    prompt = [3, 4, 5]
    assert dec.generate(prompt, max_new_tokens=8, eos_token_id=None).tokens == greedy_by_recomputation(
        model, prompt, 8, None)
