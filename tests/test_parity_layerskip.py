"""Parity of self-speculative decoding (``layerskip`` drafter, ``swift`` policy) with its authors' code.

- **Early exit** (LayerSkip): transformers' ``generate(assistant_early_exit=E)`` is the reference.
  On a tiny float64 Llama the engine's output equals it, and at the first call of transformers'
  ``EarlyExitCandidateGenerator.get_candidates`` the drafter's greedy chain from the same
  context equals the candidates it returned, token for token; at every call the drafter's chain
  equals the early-exit model's chain computed from scratch (later calls: docs/parity.md).
- **SWIFT** (hemingkx/SWIFT, vendored under tests/reference/swift/): ``choices_list`` equals its
  ``get_choices_list``; the ``swift`` policy's tree equals the tree its ``generate_swift_buffers``
  describes (attention mask, positions, retrieval paths) over the same chain probabilities; the
  search's seeded random draws equal its ``layer_random_search`` under ``np.random.seed`` and
  its probe points its ``get_next_point_to_probe``.
- **Draft & Verify** (dilab-zju/self-speculative-decoding, vendored under tests/reference/ssd/):
  its ``exact_self_speculative_generate`` runs live on an adapter of the same tiny model with a
  fixed skipped set, and the engine (``layerskip`` with the adaptive stop threshold, ``chain``
  of ``max_step_draft`` tokens) drafts the same number of tokens and accepts the same number at
  every step, emits the same tokens, and its threshold trajectory ends where the reference's does.

Everything runs from vendored files and the installed transformers: nothing skips.
"""

from __future__ import annotations

import importlib.util
import random
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch

import specframe
from specframe.decode.engine import make_plugin
from specframe.interfaces import DraftSession
from specframe.models.target import TargetModel
from specframe.testing.harness import begin_generation
from specframe.testing.models import tiny_model
from specframe.strategies.swift import choices_list
from specframe.drafters.layerskip_forward import LayerRunner, SkipPlan, StepKV, random_sets
from specframe.drafters.layerskip_state import StopThreshold
from specframe.drafters.swift_search import SwiftSearch, SwiftSettings

REFERENCE = Path(__file__).parent / "reference"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


swift_ref = _load("swift_reference_utils", REFERENCE / "swift" / "swift_utils.py")
ssd_ref = _load("ssd_reference_decoding", REFERENCE / "ssd" / "decoding.py")


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", seed=5, vocab_size=64, hidden=32, layers=4, dtype=torch.float64)


# ---------------------------------------------------------------------- early exit
@pytest.mark.parametrize("exit_layer", [1, 2, 3])
@pytest.mark.parametrize("prompt", [[5, 17, 9, 33, 2], [11, 3, 3, 28, 40, 7, 1]])
def test_early_exit_equals_transformers_assistant_early_exit(model, monkeypatch, exit_layer, prompt):
    from transformers.generation import candidate_generator

    calls: list[tuple[list[int], list[int]]] = []
    original = candidate_generator.EarlyExitCandidateGenerator.get_candidates

    def spy(self, input_ids, **kwargs):
        ids, logits = original(self, input_ids, **kwargs)
        calls.append((input_ids[0].tolist(), ids[0, input_ids.shape[1]:].tolist()))
        return ids, logits

    monkeypatch.setattr(candidate_generator.EarlyExitCandidateGenerator, "get_candidates", spy)
    max_new = 24
    want = model.generate(torch.tensor([prompt]), max_new_tokens=max_new, do_sample=False, pad_token_id=0,
                          assistant_early_exit=exit_layer)[0, len(prompt):].tolist()
    dec = specframe.SpecDecoder.build(target=TargetModel(model), drafter=("layerskip", {"exit_layer": exit_layer}),
                                      policy=("chain", {"gamma": 8}), verifier="greedy", strict=True)
    assert dec.generate(prompt, max_new_tokens=max_new, eos_token_id=None).tokens == want
    assert any(drafted for _, drafted in calls)
    # The first call drafts from the prompt alone: its candidates equal the drafter's chain.
    context, drafted = calls[0]
    assert _greedy_chain(model, exit_layer, context, len(drafted)) == drafted, context
    # At every call, the drafter's chain is the early-exit model's greedy chain computed from
    # scratch by transformers' own layers. transformers' candidates at later calls come from its
    # assistant cache, whose last kept layer can hold K/V that differ from such a pass (on one of
    # these six runs they do, and its candidates then differ: docs/parity.md), so they are not
    # the reference there.
    for context, drafted in calls:
        assert _greedy_chain(model, exit_layer, context, len(drafted)) == \
            _exit_chain_from_scratch(model, exit_layer, context, len(drafted)), context


@torch.no_grad()
def _exit_chain_from_scratch(model, exit_layer: int, context: list[int], length: int) -> list[int]:
    """The greedy chain of the model cut after ``exit_layer`` layers (then its final norm and LM
    head), each token from a cache-free forward of the whole context through transformers' own
    modules: the early-exit model by definition, sharing no code with the drafter."""
    out, ids = [], list(context)
    for _ in range(length):
        hidden = model.model.embed_tokens(torch.tensor([ids]))
        positions = torch.arange(len(ids))[None]
        rotary = model.model.rotary_emb(hidden, positions)
        causal = torch.full((len(ids), len(ids)), float("-inf"), dtype=hidden.dtype).triu(1)[None, None]
        for layer in model.model.layers[:exit_layer]:
            hidden = layer(hidden, attention_mask=causal, position_ids=positions, position_embeddings=rotary)
            hidden = hidden[0] if isinstance(hidden, tuple) else hidden
        out.append(int(model.lm_head(model.model.norm(hidden))[0, -1].argmax()))
        ids.append(out[-1])
    return out


def _greedy_chain(model, exit_layer: int, context: list[int], length: int) -> list[int]:
    """The drafter's greedy chain of ``length`` tokens after ``context`` (one node per expand)."""
    target = TargetModel(model)
    drafter = make_plugin("drafters", ("layerskip", {"exit_layer": exit_layer}), target)
    begin_generation(drafter, target, context)
    session = DraftSession(drafter, context[-1], target.device)
    tree, node, out = session.new_tree(), 0, []
    for _ in range(length):
        token = int(session.expand(tree, [node])[0].argmax())
        tree = tree.add_nodes(torch.tensor([node]), torch.tensor([token]), tree.logp[node:node + 1])
        node = len(tree) - 1
        out.append(token)
    return out


# ---------------------------------------------------------------------- SWIFT
@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("sampling", [False, True])
def test_choices_list_equals_swift(seed, sampling):
    rng = random.Random(seed)
    probs = [rng.choice([0.99, 0.9, 0.6, 0.3, rng.random()]) for _ in range(rng.randint(1, 12))]
    want = swift_ref.get_choices_list(probs, logits_processor=object() if sampling else None)
    assert choices_list(probs, sampling) == want


class _ScriptedDrafter(specframe.Drafter):
    """Rows whose top-1 probability follows a script by depth (the rest spread over ranks)."""

    name = "scripted"

    def __init__(self, probs: list[float], vocab: int = 64) -> None:
        self.probs, self.vocab = probs, vocab

    @property
    def vocab_size(self) -> int:
        return self.vocab

    def expand(self, tree, nodes):
        rows = []
        for node in nodes.tolist():
            depth = int(tree.depths[node])
            p = self.probs[min(depth, len(self.probs) - 1)]
            rest = torch.linspace(2.0, 1.0, self.vocab - 1, dtype=torch.float64)
            rest = rest / rest.sum() * (1 - p)
            row = torch.cat([torch.tensor([p], dtype=torch.float64), rest])
            perm = torch.roll(torch.arange(self.vocab), depth + 1)  # other tokens at each depth
            rows.append(torch.log(row[perm.argsort()]))
        return torch.stack(rows)


@pytest.mark.parametrize("seed", range(12))
def test_swift_policy_tree_equals_swift_buffers(seed):
    rng = random.Random(seed)
    probs = [rng.choice([0.99, 0.9, 0.85, 0.6, 0.3]) for _ in range(rng.randint(1, 8))]
    policy = make_plugin("policies", ("swift", {"max_step_draft": 8}))
    tree = policy.build(DraftSession(_ScriptedDrafter(probs), 3, torch.device("cpu")), policy.max_budget)
    # The chain SWIFT drafts: rows until one falls below 0.8 (that one included), 8 at most.
    drafted = []
    for depth in range(8):
        drafted.append(probs[min(depth, len(probs) - 1)])
        if drafted[-1] < 0.8:
            break
    choices = swift_ref.get_choices_list(drafted)
    buffers = swift_ref.generate_swift_buffers(choices, device="cpu")
    order = [[]] + sorted(choices, key=lambda x: (len(x), x))  # SWIFT's node order, root first
    paths = [tuple(int(tree.ranks[i]) for i in tree.path_to(n)[1:]) for n in range(len(tree))]
    assert sorted(paths) == sorted(tuple(p) for p in order)
    ours = {path: n for n, path in enumerate(paths)}
    index = [ours[tuple(p)] for p in order]
    mask = tree.ancestor_mask()[index][:, index]
    assert torch.equal(mask.to(torch.float32), buffers["swift_attn_mask"][0, 0].to(torch.float32))
    assert tree.depths[index].tolist() == buffers["swift_position_ids"].tolist()
    for row in buffers["retrieve_indices"].tolist():  # every root-to-leaf path SWIFT verifies
        nodes = [index[i] for i in row if i >= 0]
        assert nodes == tree.path_to(nodes[-1])


@pytest.mark.parametrize("layers, ratio, seed", [(40, 0.45, 2024), (32, 0.5, 0), (10, 0.3, 7), (6, 0.45, 1)])
def test_swift_random_search_equals_layer_random_search(layers, ratio, seed):
    np.random.seed(seed)
    count = int((layers - 2) * 2 * ratio)
    want = [swift_ref.layer_random_search(num_skip_layers=count, num_hidden_layers=layers) for _ in range(5)]
    rng = np.random.RandomState(seed)
    assert [random_sets(layers, ratio, rng) for _ in range(5)] == want
    search = SwiftSearch(SwiftSettings(skip_ratio=ratio, seed=seed, bayes=False), layers, SkipPlan.from_lists([], []))
    for attn, mlp in want:  # the search proposes the same sets, in order, and probes the same points
        plan = search.propose()
        assert (sorted(plan.attn), sorted(plan.mlp)) == (attn, mlp)
        assert search._point(plan) == swift_ref.get_next_point_to_probe(attn, mlp, layers)
        search.record(plan, 0.0)


def test_swift_search_stops_at_max_score():
    search = SwiftSearch(SwiftSettings(max_score=0.5, bayes=False), 8, SkipPlan.from_lists([1], [1]))
    first = search.propose()
    assert search.record(first, 0.4) == first and search.state.optimization
    second = search.propose()
    assert search.record(second, 0.3) == first and search.state.tolerance_iter == 1
    third = search.propose()
    assert search.record(third, 0.6) == third and not search.state.optimization


# ---------------------------------------------------------------------- Draft & Verify
class _SelfDraftAdapter:
    """The interface ``exact_self_speculative_generate`` calls: ``model(input_ids=, past_key_values=,
    return_dict=, use_cache=)`` with legacy per-layer ``(k, v)`` tuples, ``self_draft()`` and
    ``device``, over an HF Llama; in draft mode the skipped sublayers are skipped and skipped
    attention layers keep their past unchanged (as its modeling_llama.py does)."""

    def __init__(self, model, plan: SkipPlan) -> None:
        self.runner = LayerRunner(model, model.config._attn_implementation)
        self.plan, self.full = plan, SkipPlan(frozenset(), frozenset())
        self.drafting = False
        self.device = torch.device("cpu")
        self.calls: list[str] = []
        self.accepted: list[int] = []  # per verification: the reference's max_matched - 1

    @contextmanager
    def self_draft(self):
        self.drafting = True
        try:
            yield
        finally:
            self.drafting = False

    def __call__(self, input_ids, past_key_values=None, return_dict=True, use_cache=True):
        plan = self.plan if self.drafting else self.full
        self.calls.append("draft" if self.drafting else "verify")
        layers = self.runner.num_layers
        past = list(past_key_values) if past_key_values is not None else [None] * layers
        kept = [i for i in range(layers) if i not in plan.attn]
        length = 0 if past[kept[0]] is None else past[kept[0]][0].shape[-2]
        q = input_ids.shape[1]
        visible = torch.ones(q, length + q, dtype=torch.bool)
        visible[:, length:] = torch.ones(q, q, dtype=torch.bool).tril()
        rows: dict = {}
        hidden = self.runner.hidden(input_ids[0], torch.arange(length, length + q), visible, StepKV(past, rows), plan)
        new_past = []
        for i in range(layers):
            if i in rows:
                old = past[i]
                new_past.append(rows[i] if old is None else (torch.cat([old[0], rows[i][0]], -2),
                                                             torch.cat([old[1], rows[i][1]], -2)))
            else:
                new_past.append(past[i])
        logits = self.runner.logits(hidden)[None]
        if not self.drafting and past_key_values is not None:  # a verification (not the prefill)
            out = logits[0].argmax(-1)
            self.accepted.append(int(((out[:-1] != input_ids[0, 1:]).cumsum(-1) == 0).sum()))
        return {"logits": logits, "past_key_values": new_past}


@pytest.mark.parametrize("attn, mlp", [([1], [2]), ([2], [1, 2]), ([1, 2], [])])
@pytest.mark.parametrize("prompt", [[5, 17, 9, 33, 2], [11, 3, 3, 28, 40, 7]])
def test_draft_and_verify_trajectory_equals_exact_self_speculative_generate(model, attn, mlp, prompt):
    plan = SkipPlan.from_lists(attn, mlp)
    adapter = _SelfDraftAdapter(model, plan)
    max_new, max_step = 40, 8
    ref = ssd_ref.exact_self_speculative_generate(adapter, None, torch.tensor([prompt]), max_new_tokens=max_new,
                                                  max_step_draft=max_step, th_stop_draft=0.8, auto_th_stop_draft=True)
    tokens = ref["generate_ids"][0].tolist()
    # Per verification: drafted tokens (draft calls since the last verify) and generated tokens.
    drafted, run = [], 0
    for call in adapter.calls[1:]:
        if call == "draft":
            run += 1
        else:
            drafted.append(run)
            run = 0
    # The reference's first token comes from the prefill: the engine starts one token later.
    flags = [[i in plan.attn for i in range(4)], [i in plan.mlp for i in range(4)]]
    options = {"attn_skip": flags[0], "mlp_skip": flags[1], "stop_threshold": 0.8, "adaptive_stop": True,
               "stop_max_draft": max_step}
    dec = specframe.SpecDecoder.build(target=TargetModel(model), drafter=("layerskip", options),
                                      policy=("chain", {"gamma": max_step}), verifier="greedy", strict=True)
    out = dec.generate(prompt + tokens[:1], max_new_tokens=max_new - 1, eos_token_id=None)
    assert out.tokens == tokens[1:]
    ours = [s.tree_size - 1 for s in out.steps]
    # Where the reference's end-of-budget cut (step + step_draft + 2 >= max_new_tokens) is far.
    done, compared = 1, 0
    for mine, theirs, step in zip(ours, drafted, out.steps):
        if done + max_step + 2 >= max_new:
            break
        assert mine == theirs, (ours, drafted)
        done += step.emitted
        compared += 1
    assert compared >= 3
    # The threshold rule over the reference's own steps ends at its final threshold.
    accepted = adapter.accepted
    rule = StopThreshold(0.8, True, max_step)
    for a, d in zip(accepted, drafted):
        rule.observe(a, d)
    assert rule.threshold == ref["th_stop_draft"]
    assert sum(accepted) / sum(drafted) == ref["matchness"]
    assert out.steps and dec.drafter.stop.trajectory[: compared] == rule.trajectory[: compared]

