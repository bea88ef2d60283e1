"""Parity of the ``hydra`` drafter with Hydra's own code (zankner/Hydra, vendored under
tests/reference/hydra/): the reference is the oracle.

- **Tree buffers.** For Hydra's ``mc_sim_7b_63`` (the ``static`` preset ``medusa_mc_sim_7b_63``)
  and generated rank-path trees, ``generate_hydra_buffers``'s attention mask, position ids,
  retrieve indices and max accepts, and its per-head expansion plan (``children_per_head``,
  ``children_to_expand_per_head``), describe the tree ``static`` builds and the expansions it asks
  the drafter for.
- **Proposal.** Heads of seeded random weights, built and saved by the reference
  (``HydraMLP``'s ``state_dict`` in ``hydra_lm_head.pt`` beside a ``HydraConfig``), loaded by the
  drafter from that directory: for the same hidden state and root, ``static`` over a tree gives
  the token the reference's proposal (``_grounded_proposal``, or ``_ungrounded_proposal`` for
  Medusa-style heads) puts at every node.
- **Decoding.** On a seeded tiny float64 Llama (the reference's own Llama copy, which runs on CPU
  with current transformers, holding the same weights) and random heads in the reference layout,
  plain and Hydra++ (``prefix-mlp``, whose prefix layer keeps its own KV): the reference's
  ``hydra_generate`` (greedy, ``mc_sim_7b_63``) and specframe's decoding of the same prompt
  (extended by the reference's first root: specframe's first step verifies the last prompt
  token, the reference's the token after it) propose the same 64 candidates and accept the same
  number of tokens at every step, and emit the same tokens.

The reference needs no install (its files are vendored, loaded by path under the package name
``hydra`` and removed from ``sys.modules`` afterwards), so nothing here skips.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
import types
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import LlamaConfig

import specframe
from specframe.decode.engine import make_plugin
from specframe.drafters.hydra_heads import tied_keys
from specframe.models.synthetic import tiny_model
from specframe.strategies.static import MEDUSA_MC_SIM_7B_63
from specframe.testing.synthetic import SyntheticDrafter, make_session
from specframe.tree import DraftTree

REFERENCE = Path(__file__).parent / "reference" / "hydra"
VOCAB, HIDDEN, HEADS, LAYERS = 32, 32, 4, 3  # three blocks a head: two of them the tied one


def _reference_names() -> list[str]:
    return [name for name in sys.modules if name == "hydra" or name.startswith("hydra.")]


@pytest.fixture(scope="module")
def ref() -> types.SimpleNamespace:
    """The vendored reference's modules, imported as the package ``hydra`` (its own absolute
    imports name it so) and taken out of ``sys.modules`` again, whatever ``hydra`` was before."""
    saved = {name: sys.modules.pop(name) for name in _reference_names()}
    try:
        spec = importlib.util.spec_from_file_location("hydra", REFERENCE / "__init__.py",
                                                      submodule_search_locations=[str(REFERENCE)])
        package = importlib.util.module_from_spec(spec)
        sys.modules["hydra"] = package
        spec.loader.exec_module(package)
        names = ("hydra_model", "utils", "hydra_choices", "hydra_heads.mlp_head")
        modules = {name.split(".")[-1]: importlib.import_module(f"hydra.model.{name}") for name in names}
    finally:
        for name in _reference_names():
            del sys.modules[name]
        sys.modules.update(saved)
    return types.SimpleNamespace(**modules)


class ReferenceLlamaConfig(LlamaConfig):
    """transformers 5's LlamaConfig reports its rope parameters as ``rope_scaling`` (with no
    ``"type"``); the reference's copy of transformers 4.31's Llama takes None there for the plain
    rotary embedding (base 10000), which is what these configs hold."""

    @property
    def rope_scaling(self) -> None:
        return None

    @rope_scaling.setter
    def rope_scaling(self, value: object) -> None:
        pass


class StubTokenizer:
    """What ``HydraModel`` asks of a tokenizer (it loads one by name, which would download)."""

    eos_token_id = -1  # never emitted: the generations run their full step count
    pad_token_id = 0

    def decode(self, *args: object, **kwargs: object) -> str:
        return ""


def tiny_target(seed: int = 7):
    """The tiny float64 Llama specframe decodes; its attention heads are all KV heads, as the
    reference's preallocated cache assumes."""
    model = tiny_model("llama", seed=seed, vocab_size=VOCAB, hidden=HIDDEN, layers=2, heads=4, kv_heads=4,
                       max_positions=256)
    assert model.config.rope_parameters["rope_theta"] == 10000.0  # the copy's fixed rotary base
    return model


def reference_model(ref, target, arch: str, grounded: bool, seed: int = 0):
    """The reference's ``HydraModel`` over its Llama copy holding ``target``'s weights, its heads
    redrawn from N(0, 0.3^2) (norms at one) with its own ties."""
    cfg = target.config
    ref_cfg = ReferenceLlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=cfg.intermediate_size,
                                   num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=4,
                                   num_key_value_heads=4, max_position_embeddings=256, rms_norm_eps=cfg.rms_norm_eps)
    base = ref.hydra_model.KVLlamaForCausalLM(ref_cfg).to(torch.float64)
    result = base.load_state_dict(target.state_dict(), strict=False)
    assert not result.unexpected_keys and all(k.endswith("rotary_emb.inv_freq") for k in result.missing_keys)
    ref.hydra_model.AutoTokenizer = types.SimpleNamespace(from_pretrained=lambda name: StubTokenizer())
    model = ref.hydra_model.HydraModel(base, hydra_num_heads=HEADS, hydra_num_layers=LAYERS, hydra_head_arch=arch,
                                       base_model_name_or_path="tiny", grounded_heads=grounded).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.hydra_head.named_parameters():
            if "embed" in name:
                continue  # the target's embedding (a submodule of the heads there), the prefix layer's

            param.copy_(torch.ones_like(param) if name.endswith("norm.weight")
                        else torch.randn(param.shape, generator=gen, dtype=param.dtype) * 0.3)
    return model


def save_reference(ref, model, directory: Path) -> Path:
    """The checkpoint as the reference reads it: ``HydraConfig`` and the heads' state dict."""
    ref.hydra_model.HydraConfig(hydra_num_heads=model.hydra, hydra_num_layers=model.hydra_num_layers,
                                hydra_head_arch=model.hydra_head_arch, grounded_heads=model.grounded_heads,
                                base_model_name_or_path="tiny").save_pretrained(directory)
    torch.save(model.hydra_head.state_dict(), directory / "hydra_lm_head.pt")
    return directory


def rank_paths(tree: DraftTree) -> dict[tuple[int, ...], int]:
    """Each node's rank path -> its index in ``tree``."""
    return {tuple(int(tree.ranks[j]) for j in tree.path_to(i)[1:]): i for i in range(len(tree))}


def in_reference_order(tree: DraftTree, choices) -> list[int]:
    """``tree``'s tokens root first, then in Hydra's (length, path) order of ``choices``."""
    node = rank_paths(tree)
    return [int(tree.tokens[0])] + [int(tree.tokens[node[p]]) for p in sorted(map(tuple, choices),
                                                                                key=lambda c: (len(c), c))]


# ---------------------------------------------------------------------- tree buffers
class Recorder(SyntheticDrafter):
    """A synthetic drafter that records the nodes of every expansion."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.expansions: list[list[int]] = []

    def expand(self, tree, nodes):
        self.expansions.append(torch.as_tensor(nodes).flatten().tolist())
        return super().expand(tree, nodes)


def check_buffers(ref, choices) -> None:
    """Hydra's buffers for ``choices`` describe the tree and expansions of ``static``."""
    ordered = sorted((tuple(c) for c in choices), key=lambda c: (len(c), c))
    position = {c: i + 1 for i, c in enumerate(ordered)} | {(): 0}
    policy = make_plugin("policies", ("static", {"choices": [list(c) for c in choices]}))
    drafter = Recorder(VOCAB, temperature=2.0, seed=len(ordered))
    tree = policy.build(make_session(drafter, root_token=3), policy.max_budget)
    node = rank_paths(tree)
    assert set(node) == set(ordered) | {()}
    order = [node[c] for c in [()] + ordered]  # tree index of each reference position
    buffers = ref.utils.generate_hydra_buffers([list(c) for c in choices], device="cpu")
    assert torch.equal(buffers["hydra_attn_mask"][0, 0].bool(), tree.ancestor_mask()[order][:, order])
    assert buffers["hydra_position_ids"].tolist() == tree.depths[order].tolist()
    leaves = {c for c in ordered if not any(len(o) > len(c) and o[: len(c)] == c for o in ordered)}
    rows = [tuple(i for i in row if i >= 0) for row in buffers["retrieve_indices"].tolist()]
    assert set(rows) == {tuple(position[c[:k]] for k in range(len(c) + 1)) for c in leaves}
    assert buffers["max_accepts"].tolist() == [len(r) - 1 for r in rows]
    # Head h's expansion: the depth-h nodes with children, in path order; how many children
    # each gets, and how many of those have children themselves.
    by_path = {i: c for c, i in node.items()}
    children = {c: [o for o in ordered if o[:-1] == c] for c in [()] + ordered}
    per_head = [sorted(by_path[i] for i in call) for call in drafter.expansions]
    assert buffers["children_per_head"] == [[len(children[p]) for p in parents] for parents in per_head]
    assert buffers["children_to_expand_per_head"] == [
        [sum(1 for c in children[p] if children[c]) for p in parents] for parents in per_head]


def test_mc_sim_7b_63_is_the_static_preset_and_its_buffers_are_hydras(ref):
    assert tuple(map(tuple, ref.hydra_choices.mc_sim_7b_63)) == MEDUSA_MC_SIM_7B_63
    check_buffers(ref, ref.hydra_choices.mc_sim_7b_63)


@st.composite
def hydra_trees(draw, max_depth: int = HEADS) -> list[list[int]]:
    """Rank-path trees as Hydra's proposal drafts them: each node's children are its top n
    (ranks 0..n-1), and those with children of their own come first."""
    paths: list[tuple[int, ...]] = []
    frontier = [()]
    while frontier:
        parent = frontier.pop(0)
        if len(parent) >= max_depth:
            continue
        n = draw(st.integers(1, 4))  # a frontier node is expanded: it gets children
        expand = draw(st.integers(0, n)) if len(parent) + 1 < max_depth else 0
        kids = [parent + (r,) for r in range(n)]
        paths += kids
        frontier += kids[:expand]
    return [list(p) for p in paths]


@settings(max_examples=30, deadline=None)
@given(choices=hydra_trees())
def test_generated_trees_have_hydras_buffers(ref, choices):
    check_buffers(ref, choices)


# ---------------------------------------------------------------------- proposal
@pytest.fixture(scope="module")
def target():
    return tiny_target()


@pytest.fixture(scope="module")
def proposal_pairs(ref, target, tmp_path_factory):
    """``grounded -> (reference HydraModel, specframe's hydra drafter loaded from the reference's
    checkpoint)``."""
    pairs = {}
    for grounded in (True, False):
        model = reference_model(ref, target, "mlp", grounded=grounded, seed=1)
        directory = save_reference(ref, model, tmp_path_factory.mktemp("hydra-ckpt"))
        tm = specframe.TargetModel(target)
        pairs[grounded] = (model, make_plugin("drafters", ("hydra", {"path": str(directory)}), tm))
    return pairs


def _ties(module: torch.nn.Module) -> list[list[str]]:
    groups: dict[int, list[str]] = {}
    for key, value in module.state_dict(keep_vars=True).items():
        groups.setdefault(id(value), []).append(key)
    return sorted(sorted(g) for g in groups.values() if len(g) > 1)


@pytest.mark.parametrize("grounded", [True, False], ids=["grounded", "ungrounded"])
def test_the_reference_checkpoint_loads_equal_ties_included(proposal_pairs, grounded):
    model, drafter = proposal_pairs[grounded]
    theirs, ours = model.hydra_head.state_dict(), drafter.heads.state_dict()
    assert set(theirs) == set(ours) | {"input_embed_fn.weight"}  # the target's embedding, read from the target
    assert [k for k in ours if not torch.equal(theirs[k], ours[k])] == []
    assert _ties(model.hydra_head) and sorted(tied_keys(drafter.heads)) == _ties(model.hydra_head)


def check_proposal(ref, pair, choices: list[list[int]], seed: int, root: int) -> None:
    """For one hidden state and root, ``static`` over ``choices`` with the drafter puts the
    reference proposal's token at every node."""
    model, drafter = pair
    hidden = torch.randn(1, 1, HIDDEN, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    logits = torch.zeros(1, 1, VOCAB, dtype=torch.float64)
    logits[0, 0, root] = 1.0  # the reference's root is the argmax of the target's last row
    buffers = ref.utils.generate_hydra_buffers(choices, device="cpu")
    with torch.inference_mode():
        _, theirs = model.hydra_head.proposal(logits, hidden, buffers)
    drafter.begin(torch.tensor([5, root]), target_hidden=(hidden,))
    policy = make_plugin("policies", ("static", {"choices": choices}))
    tree = policy.build(make_session(drafter, root_token=root), policy.max_budget)
    assert in_reference_order(tree, choices) == theirs[0].tolist()


@settings(max_examples=25, deadline=None)
@given(choices=hydra_trees(), seed=st.integers(0, 2**16), root=st.integers(0, VOCAB - 1))
def test_static_drafts_the_grounded_proposal(ref, proposal_pairs, choices, seed, root):
    check_proposal(ref, proposal_pairs[True], choices, seed, root)


@pytest.mark.parametrize("seed", range(4))
def test_static_drafts_the_ungrounded_proposal(ref, proposal_pairs, seed):
    """On ``mc_sim_7b_63`` only: the reference's ungrounded proposal numbers candidates as if
    every head but the last gave its top 10 (``TOPK``), which holds for that tree."""
    check_proposal(ref, proposal_pairs[False], ref.hydra_choices.mc_sim_7b_63, seed, root=seed)


# ---------------------------------------------------------------------- decoding
def reference_steps(ref, model, prompt: list[int], steps: int) -> tuple[list[list[int]], list[int], list[int]]:
    """The reference's greedy ``hydra_generate`` over ``mc_sim_7b_63`` for ``steps`` steps: each
    step's candidates (root first, tree order), accept lengths, and the tokens after the prompt."""
    proposals, accepts, outputs = [], [], []
    proposal, posterior, update = model.hydra_head.proposal, ref.hydra_model.evaluate_posterior, \
        ref.hydra_model.update_inference_inputs

    def record_proposal(*args, **kwargs):
        cart, tree_candidates = proposal(*args, **kwargs)
        proposals.append(tree_candidates[0].tolist())
        return cart, tree_candidates

    def record_posterior(*args, **kwargs):
        best, length = posterior(*args, **kwargs)
        accepts.append(int(length))
        return best, length

    def record_update(*args, **kwargs):
        result = update(*args, **kwargs)
        outputs[:] = result[0][0, len(prompt):].tolist()
        return result

    model.hydra_head.proposal = record_proposal
    ref.hydra_model.evaluate_posterior, ref.hydra_model.update_inference_inputs = record_posterior, record_update
    try:
        with torch.inference_mode():
            for _ in model.hydra_generate(torch.tensor([prompt]), temperature=0.0, max_steps=steps,
                                          hydra_choices=ref.hydra_choices.mc_sim_7b_63):
                pass
    finally:
        del model.hydra_head.proposal
        ref.hydra_model.evaluate_posterior, ref.hydra_model.update_inference_inputs = posterior, update
    return proposals, accepts, outputs


@pytest.mark.parametrize("arch,grounded", [("mlp", True), ("prefix-mlp", True), ("mlp", False)],
                         ids=["hydra", "hydra++", "ungrounded"])
def test_decoding_proposes_and_accepts_as_the_reference(ref, target, tmp_path, arch, grounded):
    model = reference_model(ref, target, arch, grounded, seed=2)
    directory = save_reference(ref, model, tmp_path)
    assert json.loads((directory / "config.json").read_text())["hydra_head_arch"] == arch
    prompt, steps = [3, 9, 4, 1, 7, 3, 9, 4], 12
    proposals, accepts, outputs = reference_steps(ref, model, prompt, steps)
    assert len(accepts) == steps and sum(accepts) > 0  # some drafts are accepted: the walk is compared

    tm = specframe.TargetModel(target)
    dec = specframe.SpecDecoder.build(tm, drafter=("hydra", {"path": str(directory)}),
                                      policy=("static", {"choices": "medusa_mc_sim_7b_63"}), verifier="greedy")
    trees: list[DraftTree] = []
    build = dec.policy.build

    def record_build(session, budget):
        trees.append(build(session, budget))
        return trees[-1]

    dec.policy.build = record_build
    # specframe's first step verifies the prompt's last token; the reference's, the token after
    # it (its first root): hand specframe that token as the end of its prompt.
    out = dec.generate(prompt + outputs[:1], max_new_tokens=sum(accepts) + steps + 8, eos_token_id=None)
    assert [s.accepted for s in out.steps[:steps]] == accepts
    assert [in_reference_order(t, MEDUSA_MC_SIM_7B_63) for t in trees[:steps]] == proposals
    assert out.tokens[: len(outputs) - 1] == outputs[1:]
