"""Medusa heads: the official checkpoint layout read and checked, depth d's row from head d,
and lossless drafting under every policy."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specframe.decode.engine import SpecDecoder, make_plugin
from specframe.drafters.medusa import (PICKLE_NAME, SAFETENSORS_NAME, MedusaCheckpointError, MedusaHeads, load_heads,
                                       save_heads)
from specframe.models.target import TargetModel
from specframe.plugins import get_registry
from specframe.testing.fixtures import VOCAB, fixed_policy_spec, tiny_target
from specframe.testing.harness import greedy_by_recomputation
from specframe.testing.profiles import profile_examples
from specframe.tree import DraftTree

HIDDEN = 32  # tiny_target's
POLICIES = get_registry().names("policies")
EXAMPLES = max(2, profile_examples() // 3)


def heads(num_heads: int = 3, num_layers: int = 1, seed: int = 0) -> MedusaHeads:
    torch.manual_seed(seed)
    out = MedusaHeads(HIDDEN, VOCAB, num_heads, num_layers)
    for p in out.parameters():
        torch.nn.init.normal_(p, std=0.5)
    return out.double()


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
@given(prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=9), seed=st.integers(0, 3))
def test_medusa_is_lossless_under_every_policy(policy, prompt, seed):
    target = TargetModel(tiny_target())
    spec = fixed_policy_spec(policy)
    dec = SpecDecoder(target, make_plugin("drafters", ("medusa", {"heads": heads(seed=seed)}), target),
                      make_plugin("policies", spec), make_plugin("verifiers", "greedy"))
    out = dec.generate(prompt, max_new_tokens=10, eos_token_id=None)
    assert out.tokens == greedy_by_recomputation(tiny_target(), prompt, 10, None)


def test_options_name_what_is_missing():
    target = TargetModel(tiny_target())
    with pytest.raises(ValueError, match="'path'"):
        make_plugin("drafters", "medusa", target)
