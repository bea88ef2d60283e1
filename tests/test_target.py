"""Tree attention is honest: the target's logits at every tree node equal a plain forward over
that node's root-to-node path, for every supported architecture and attention implementation."""

from functools import lru_cache

import pytest
import torch
from hypothesis import given, strategies as st

from specframe.models.target import TargetModel, UnsupportedModelError
from specframe.testing.models import ARCHITECTURES, tiny_model
from specframe.testing.strategies import draft_trees

# float64 sdpa differs by float64 rounding alone, but transformers' RMSNorm rounds its input to
# float32 and back: a 1-ulp float64 difference before it can become a float32 ulp (~6e-8) after
# it (a 41-node Llama tree showed 3e-8). Bitwise equality is the exact forward's (test_exact.py).
TOLERANCE = {("sdpa", torch.float64): 1e-6, ("eager", torch.float64): 1e-6,
             ("sdpa", torch.float32): 1e-4, ("eager", torch.float32): 1e-4}
CASES = [(a, impl, torch.float64) for a in ARCHITECTURES for impl in ("sdpa", "eager")]
CASES += [("llama", "sdpa", torch.float32), ("gpt2", "eager", torch.float32)]


@lru_cache(maxsize=None)
def _model(arch, impl, dtype):
    # init 0.1: eager rounds its softmax to float32, whose error grows with the logit scale
    return tiny_model(arch, seed=3, dtype=dtype, attn_implementation=impl, init_std=0.1)


def _plain_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


@pytest.mark.parametrize("arch, impl, dtype", CASES, ids=lambda v: str(v).replace("torch.", ""))
@given(tree=draft_trees(max_nodes=64), prefix=st.lists(st.integers(2, 63), max_size=20))
def test_tree_forward_equals_per_path_forward(arch, impl, dtype, tree, prefix):
    model = _model(arch, impl, dtype)
    target = TargetModel(model)
    target.reset()
    if prefix:
        target.causal_forward(torch.tensor(prefix))
    logits = target.tree_forward(tree.tokens, tree.positions(len(prefix) + 1), tree.ancestor_mask()).logits[0]
    for leaf in tree.leaves().tolist():
        path = tree.path_to(leaf)
        ref = _plain_logits(model, prefix + tree.tokens[path].tolist())[len(prefix):]
        torch.testing.assert_close(logits[path], ref, atol=TOLERANCE[(impl, dtype)], rtol=0)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@given(tree=draft_trees(max_nodes=32), prefix=st.lists(st.integers(2, 63), min_size=1, max_size=16),
       data=st.data())
def test_kv_compaction_keeps_exactly_the_accepted_path(arch, tree, prefix, data):
    """After keeping one root-to-node path, continuing gives the logits of a fresh forward."""
    model = _model(arch, "sdpa", torch.float64)
    target = TargetModel(model)
    target.reset()
    if len(prefix) > 1:
        target.causal_forward(torch.tensor(prefix[:-1]))
    # the tree's root is the last committed token
    tree.tokens[0] = prefix[-1]
    target.tree_forward(tree.tokens, tree.positions(len(prefix)), tree.ancestor_mask())
    node = data.draw(st.integers(0, len(tree) - 1))
    path = tree.path_to(node)
    target.keep(len(prefix) - 1, torch.tensor(path))
    committed = prefix + tree.tokens[path[1:]].tolist()
    # the root and the accepted nodes are now cached; the next token (a bonus) is not
    assert target.cache_len == len(committed) == target.cache.get_seq_length()
    nxt = data.draw(st.lists(st.integers(2, 63), min_size=1, max_size=4))
    out = target.causal_forward(torch.tensor(nxt)).logits[0]
    ref = _plain_logits(model, committed + nxt)[len(committed):]
    torch.testing.assert_close(out, ref, atol=TOLERANCE[("sdpa", torch.float64)], rtol=0)


def test_unsupported_attention_implementation_is_named():
    model = tiny_model("llama")
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(UnsupportedModelError, match="LlamaForCausalLM.*flash_attention_2.*sdpa"):
        TargetModel(model)


def test_model_without_position_ids_is_refused():
    class NoPositions(torch.nn.Module):
        config = type("C", (), {"architectures": ["OddLM"], "_attn_implementation": "sdpa"})()

        def forward(self, input_ids, attention_mask=None):
            return input_ids

    with pytest.raises(UnsupportedModelError, match="OddLM.*position_ids"):
        TargetModel(NoPositions())
