"""Medusa heads: the official checkpoint layout read and checked, depth d's row from head d,
and lossless drafting under every policy."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

from specframe.decode.engine import SpecDecoder, make_plugin
from specframe.drafters.medusa import (PICKLE_NAME, SAFETENSORS_NAME, MedusaCheckpointError, MedusaHeads, load_heads,
                                       random_heads, save_heads)
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


def heads(num_heads: int = 3, num_layers: int = 1, seed: int = 0, shared: bool = False) -> MedusaHeads:
    return random_heads(HIDDEN, VOCAB, num_heads, num_layers, shared, seed=seed).double()


def test_the_official_layout_round_trips(tmp_path):
    saved = heads(num_heads=2, num_layers=2)
    save_heads(saved, tmp_path)
    assert {"0.0.linear.weight", "0.0.linear.bias", "0.1.linear.weight", "0.2.weight", "1.2.weight"} <= \
        set(saved.state_dict())
    loaded = load_heads(tmp_path, HIDDEN, VOCAB).double()
    x = torch.randn(HIDDEN, dtype=torch.float64)
    assert torch.allclose(loaded.log_probs(x), saved.log_probs(x))


def test_checkpoint_refusals_name_key_and_shape(tmp_path):
    save_heads(heads(), tmp_path / "ok")
    with pytest.raises(MedusaCheckpointError, match=r"'0.1.weight' has shape \(64, 32\), the target needs \(50, 32\)"):
        load_heads(tmp_path / "ok", HIDDEN, 50)
    with pytest.raises(MedusaCheckpointError, match="no config.json"):
        load_heads(tmp_path, HIDDEN, VOCAB)
    pickled = tmp_path / "pickled"
    save_heads(heads(), pickled)
    torch.save(dict(heads().state_dict()), pickled / PICKLE_NAME)
    (pickled / SAFETENSORS_NAME).unlink()
    with pytest.raises(MedusaCheckpointError, match="allow_pickle"):
        load_heads(pickled, HIDDEN, VOCAB)
    assert len(load_heads(pickled, HIDDEN, VOCAB, allow_pickle=True)) == 3


def test_a_node_gets_the_head_of_its_depth():
    target = TargetModel(tiny_target())
    h = heads()
    drafter = make_plugin("drafters", ("medusa", {"heads": h}), target)
    state = torch.randn(HIDDEN, dtype=torch.float64)
    drafter.begin(torch.tensor([1, 2, 3]), target_hidden=(state[None, None],))
    tree = DraftTree.root(3).add_nodes(torch.tensor([0, 0]), torch.tensor([5, 6]), torch.zeros(2), torch.tensor([0, 1]))
    tree = tree.add_nodes(torch.tensor([1]), torch.tensor([7]), torch.zeros(1), torch.tensor([0]))
    rows = drafter.expand(tree, torch.tensor([0, 1, 2, 3]))
    want = h.log_probs(state)
    assert torch.equal(rows[0], want[0]) and torch.equal(rows[1], want[1]) and torch.equal(rows[2], want[1])
    assert torch.equal(rows[3], want[2])


@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=EXAMPLES, deadline=None)
@given(prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=9), seed=st.integers(0, 3), shared=st.booleans())
def test_medusa_is_lossless_under_every_policy(policy, prompt, seed, shared):
    target = TargetModel(tiny_target())
    spec = fixed_policy_spec(policy)
    dec = SpecDecoder(target, make_plugin("drafters", ("medusa", {"heads": heads(seed=seed, shared=shared)}), target),
                      make_plugin("policies", spec), make_plugin("verifiers", "greedy"))
    out = dec.generate(prompt, max_new_tokens=10, eos_token_id=None)
    assert out.tokens == greedy_by_recomputation(tiny_target(), prompt, 10, None)


def test_options_name_what_is_missing():
    target = TargetModel(tiny_target())
    with pytest.raises(ValueError, match="'path'"):
        make_plugin("drafters", "medusa", target)


def test_shared_heads_keep_only_their_blocks_and_use_the_targets_output_layer(tmp_path):
    target = TargetModel(tiny_target())
    torch.manual_seed(1)
    shared = heads(num_heads=2, seed=1, shared=True)
    save_heads(shared, tmp_path)
    assert all(".linear." in key for key in load_file(str(tmp_path / SAFETENSORS_NAME)))
    drafter = make_plugin("drafters", ("medusa", {"path": str(tmp_path)}), target)
    state = torch.randn(HIDDEN, dtype=torch.float64)
    drafter.begin(torch.tensor([1, 2]), target_hidden=(state[None, None],))
    rows = drafter.expand(DraftTree.root(3), torch.tensor([0]))
    out_layer = target.model.get_output_embeddings()
    want = torch.log_softmax(out_layer(shared[0](state)).float(), dim=-1)
    assert torch.allclose(rows[0], want)
    with pytest.raises(ValueError, match="lm_head"):
        shared.log_probs(state)


def test_train_medusa_writes_loadable_heads_resumes_and_reports_agreement(tmp_path):
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
    args = ["train-medusa", "--target", str(tmp_path / "target"), "--data", str(tmp_path / "a.txt"),
            "--heldout", str(tmp_path / "a.txt"), "--out", str(tmp_path / "heads"), "--seq-len", "24",
            "--batch-size", "2", "--positions", "16", "--heads", "2", "--no-progress"]
    first = CliRunner().invoke(cli, args + ["--steps", "2"])
    assert first.exit_code == 0, first.output + repr(first.exception)
    second = CliRunner().invoke(cli, args + ["--steps", "5"])
    assert second.exit_code == 0, second.output + repr(second.exception)
    summary = json.loads(second.output[second.output.rindex('{"kind"'):])
    assert summary["steps"] == 5 and len(summary["heldout_top1"]) == 2  # resumed at 2, ran 3 more
    assert all(0.0 <= a <= 1.0 for a in summary["heldout_top1"])
    changed = CliRunner().invoke(cli, args + ["--steps", "6", "--layers", "2"])
    assert changed.exit_code != 0 and "layers" in changed.output
    target64 = TargetModel(model.to(torch.float64))
    dec = SpecDecoder(target64, make_plugin("drafters", ("medusa", {"path": str(tmp_path / "heads")}), target64),
                      make_plugin("policies", "talon"), make_plugin("verifiers", "greedy"))
    prompt = [3, 4, 5]
    assert dec.generate(prompt, max_new_tokens=8, eos_token_id=None).tokens == greedy_by_recomputation(
        model, prompt, 8, None)


class TestMedusaSharedTwoLayersConformance(DrafterConformance):
    """Medusa's second setting: two residual blocks a head and the target's shared output layer
    (the shipped head's layout), four heads."""

    plugin = "medusa"

    def make_drafter(self, target: TargetModel):
        shared = random_heads(HIDDEN, int(target.vocab_size), 4, num_layers=2, shared_lm_head=True, seed=3)
        return make_plugin("drafters", ("medusa", {"heads": shared}), target)
