"""The architecture matrix (docs/architectures.md): lossless tree speculation on every listed
transformers causal LM, including sliding-window and hybrid (sliding + full) attention with
prompts of 5x the window, the model-specific details that could break it, and the refusals.

Tiny random models in float64 with a window of ``WINDOW`` tokens; ~12 new tokens per run.
"""

from __future__ import annotations

import copy
from functools import lru_cache
from typing import Any, Callable

import pytest
import torch
from hypothesis import given, strategies as st

import specframe
from specframe.decode.engine import make_plugin
from specframe.models.target import SLIDING_ATTENTION, TargetModel, UnsupportedModelError
from specframe.testing.models import EAGER_ONLY, EXTENDED, MATRIX, WINDOW, perturbed_copy, tiny_model
from specframe.testing.strategies import draft_trees
from specframe.tree import DraftTree

VOCAB = 64
PROMPT_LEN = 5 * WINDOW + 2  # the bar: prompts of at least 5x the window
NEW_TOKENS = 12
POLICIES = specframe.get_registry().names("policies")
# The extended architectures run the three policies whose trees differ most (gated, fixed
# width, chain) to keep the suite cheap; the matrix runs them all.
EXTENDED_POLICIES = tuple(p for p in ("talon", "eagle", "chain") if p in POLICIES)
CASES = [(a, p) for a in MATRIX for p in POLICIES] + [(a, p) for a in EXTENDED for p in EXTENDED_POLICIES]
WINDOWED = tuple(a for a in MATRIX + EXTENDED if a.endswith("-swa") or a in (
    "gemma2", "gemma3", "olmo3", "cohere2", "gpt_oss", "ministral", "smollm3", "exaone4"))
HYBRID = ("qwen2-swa", "gemma2", "gemma3", "gpt_oss")  # sliding and full layers in one model


def _impl(arch: str) -> str:
    return "eager" if arch in EAGER_ONLY else "sdpa"


@lru_cache(maxsize=None)
def _model(arch: str) -> Any:
    return tiny_model(arch, seed=1, vocab_size=VOCAB, attn_implementation=_impl(arch))


@lru_cache(maxsize=None)
def _draft(arch: str) -> Any:
    return perturbed_copy(_model(arch), 0.1, seed=2)  # agrees often: deep paths get accepted


def _prompt(seed: int = 0, length: int = PROMPT_LEN) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(2, VOCAB, (length,), generator=gen).tolist()


def _generate_reference(model: Any, prompt: list[int], new_tokens: int = NEW_TOKENS) -> list[int]:
    """``model.generate`` greedy; eos_token_id=None so that it runs the full length."""
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                         max_new_tokens=new_tokens, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


@lru_cache(maxsize=None)
def _expected(arch: str) -> tuple[int, ...]:
    return tuple(_generate_reference(_model(arch), _prompt()))


def _plain_logits(model: Any, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


def _speculate(model: Any, draft: Any, policy: str, preallocate: bool, prompt: list[int]) -> list[int]:
    dec = specframe.SpecDecoder.build(target=TargetModel(model, preallocate=preallocate),
                                      drafter=("model", {"model": draft}), policy=policy)
    return dec.generate(prompt, max_new_tokens=NEW_TOKENS, eos_token_id=None).tokens


# ---------------------------------------------------------------------------- the matrix
def _preallocated(arch: str, policy: str) -> bool:
    """The KV cache of a matrix case: alternating over an architecture's policies, shifted by
    one from each architecture to the next, so every architecture and every policy meets a
    growing and a pre-allocated cache (the windowed ones meet both under compaction too, in
    test_kv_compaction_on_windowed_models)."""
    archs = list(dict.fromkeys(a for a, _ in CASES))
    policies = [p for a, p in CASES if a == arch]
    return (archs.index(arch) + policies.index(policy)) % 2 == 1


@pytest.mark.parametrize("arch, policy", CASES)
def test_matrix_greedy_equals_generate(arch: str, policy: str) -> None:
    """Every architecture x every built-in policy, beyond the window, with either KV cache."""
    expected = list(_expected(arch))
    assert len(expected) == NEW_TOKENS
    preallocate = _preallocated(arch, policy)
    tokens = _speculate(_model(arch), _draft(arch), policy, preallocate, _prompt())
    assert tokens == expected, f"{arch}, policy {policy}, preallocate={preallocate}"


def test_every_architecture_and_policy_of_the_matrix_meets_both_caches():
    for axis in (0, 1):
        seen: dict[str, set[bool]] = {}
        for case in CASES:
            seen.setdefault(case[axis], set()).add(_preallocated(*case))
        assert all(kinds == {False, True} for kinds in seen.values()), seen


@pytest.mark.parametrize("arch", WINDOWED)
def test_windowed_models_take_prompts_beyond_the_window(arch: str) -> None:
    """The window no longer caps the context: a prompt of 5x the window is accepted, and the
    sliding layers really are in play (the matrix is not vacuous)."""
    target = TargetModel(_model(arch))
    assert target.sliding_window == WINDOW and SLIDING_ATTENTION in target.layer_types
    assert PROMPT_LEN >= 5 * WINDOW
    assert target.max_positions > PROMPT_LEN + NEW_TOKENS


# ---------------------------------------------------------------------------- tree attention
def _deep_tree(root: int, depth: int, seed: int) -> DraftTree:
    """A spine deeper than the window with a sibling leaf at every depth."""
    gen = torch.Generator().manual_seed(seed)
    tokens, parents = [root], [-1]
    spine = 0
    for _ in range(depth):
        a, b = (torch.randperm(VOCAB - 2, generator=gen)[:2] + 2).tolist()
        tokens += [a, b]
        parents += [spine, spine]
        spine = len(tokens) - 2
    depths = [0]
    for p in parents[1:]:
        depths.append(depths[p] + 1)
    n = len(tokens)
    return DraftTree(tokens=torch.tensor(tokens), parents=torch.tensor(parents), depths=torch.tensor(depths),
                     logp=-torch.arange(n, dtype=torch.float32), ranks=torch.zeros(n, dtype=torch.long))


def _tree_logits(target: TargetModel, prefix: list[int], tree: DraftTree, capacity: int | None) -> torch.Tensor:
    target.reset(capacity=capacity)
    target.causal_forward(torch.tensor(prefix[:-1]))
    return target.tree_forward(tree.tokens, tree.positions(len(prefix)), tree.ancestor_mask()).logits[0]


def _assert_tree_matches_paths(model: Any, prefix: list[int], tree: DraftTree, logits: torch.Tensor,
                               atol: float) -> None:
    """Each node's logits equal a plain forward over prefix + its root-to-node path."""
    for leaf in tree.leaves().tolist():
        path = tree.path_to(leaf)
        ref = _plain_logits(model, prefix + tree.tokens[path[1:]].tolist())[len(prefix) - 1:]
        torch.testing.assert_close(logits[path], ref, atol=atol, rtol=0)


def _tolerance(arch: str) -> float:
    return 1e-6 if _impl(arch) == "eager" else 1e-9


@pytest.mark.parametrize("capacity", [None, 128], ids=["dynamic-cache", "preallocated"])
@pytest.mark.parametrize("arch", WINDOWED)
def test_tree_nodes_see_what_their_layer_sees(arch: str, capacity: int | None) -> None:
    """A tree twice as deep as the window after a 5x-window prompt: every node's logits equal
    the model's own forward over its path, so sliding layers drop the far prefix AND the far
    ancestors. Without the per-layer window the logits differ (the check can fail)."""
    model = _model(arch)
    prefix = _prompt(seed=3)
    tree = _deep_tree(prefix[-1], depth=2 * WINDOW, seed=4)
    target = TargetModel(model, preallocate=capacity is not None)
    _assert_tree_matches_paths(model, prefix, tree, _tree_logits(target, prefix, tree, capacity), _tolerance(arch))
    target.sliding_window = None  # every layer sees everything: what the window mask prevents
    unwindowed = _tree_logits(target, prefix, tree, capacity)
    path = tree.path_to(len(tree) - 2)
    ref = _plain_logits(model, prefix + tree.tokens[path[1:]].tolist())[len(prefix) - 1:]
    assert (unwindowed[path] - ref).abs().max() > 1e-4


# ---------------------------------------------------------------------------- cache compaction
def _step(target: TargetModel, committed: list[int], tree: DraftTree, node: int, bonus: int) -> list[int]:
    """Verify ``tree`` (root = last committed token), keep the path to ``node`` and commit
    its tokens plus ``bonus``, which is not cached yet (the next tree's root), as the engine does."""
    tree.tokens[0] = committed[-1]
    target.tree_forward(tree.tokens, tree.positions(len(committed)), tree.ancestor_mask())
    path = tree.path_to(node)
    target.keep(len(committed) - 1, torch.tensor(path))
    return committed + tree.tokens[path[1:]].tolist() + [bonus]


@pytest.mark.parametrize("capacity", [None, 256], ids=["dynamic-cache", "preallocated"])
@pytest.mark.parametrize("arch", HYBRID + ("mistral-swa",))
@given(trees=st.lists(draft_trees(max_nodes=24, vocab_size=VOCAB), min_size=1, max_size=3),
       prefix=st.lists(st.integers(2, VOCAB - 1), min_size=WINDOW + 1, max_size=3 * WINDOW),
       data=st.data())
def test_kv_compaction_on_windowed_models(arch: str, capacity: int | None, trees: list[DraftTree],
                                          prefix: list[int], data: Any) -> None:
    """Several verify-and-keep steps on a sliding/hybrid model, then plain tokens: the logits
    equal a fresh forward over everything committed (the cache and its positions stay aligned)."""
    model = _model(arch)
    target = TargetModel(model, preallocate=capacity is not None)
    target.reset(capacity=capacity)
    target.causal_forward(torch.tensor(prefix[:-1]))
    committed = list(prefix)
    for tree in trees:
        node = data.draw(st.integers(0, len(tree) - 1), label="accepted node")
        bonus = data.draw(st.integers(2, VOCAB - 1), label="bonus token")
        committed = _step(target, committed, tree, node, bonus)
        assert target.cache_len == len(committed) - 1 == target.cache.get_seq_length()
    nxt = data.draw(st.lists(st.integers(2, VOCAB - 1), min_size=1, max_size=4), label="next tokens")
    out = target.causal_forward(torch.tensor(committed[-1:] + nxt)).logits[0]
    ref = _plain_logits(model, committed + nxt)[len(committed) - 1:]
    torch.testing.assert_close(out, ref, atol=_tolerance(arch), rtol=0)


@pytest.mark.parametrize("capacity", [None, 256], ids=["dynamic-cache", "preallocated"])
@pytest.mark.parametrize("arch", HYBRID + ("mistral-swa",))
def test_kv_compaction_keeps_the_positions_of_a_deep_path(arch: str, capacity: int | None) -> None:
    """The deepest spine node of a tree deeper than the window is accepted: the kept entries
    are not the first slots of the tree, and their positions (which the window is measured
    from) move with them."""
    model = _model(arch)
    target = TargetModel(model, preallocate=capacity is not None)
    target.reset(capacity=capacity)
    prefix = _prompt(seed=8, length=3 * WINDOW)
    target.causal_forward(torch.tensor(prefix[:-1]))
    tree = _deep_tree(prefix[-1], depth=WINDOW + 2, seed=9)
    committed = _step(target, list(prefix), tree, len(tree) - 2, bonus=5)
    out = target.causal_forward(torch.tensor(committed[-1:] + [7, 8])).logits[0]
    ref = _plain_logits(model, committed + [7, 8])[len(committed) - 1:]
    torch.testing.assert_close(out, ref, atol=_tolerance(arch), rtol=0)


def test_drafter_cache_with_tree_tail_respects_the_window() -> None:
    """The model drafter keeps tree nodes in its cache's tail (positions != indices): its
    draft log-probs at a deep node equal a plain forward of the draft over the node's path."""
    draft = _draft("gemma3")
    prefix = _prompt(seed=5)
    tree = DraftTree.root(prefix[-1])
    drafter = make_plugin("drafters", ("model", {"model": draft}), TargetModel(_model("gemma3")))
    drafter.begin(torch.tensor(prefix))
    for depth in range(2 * WINDOW):  # one expand per layer, as policies do: the tail grows
        leaf = len(tree) - 1
        logp = drafter.expand(tree, torch.tensor([leaf]))
        tree = tree.add_nodes(torch.tensor([leaf]), logp.argmax(-1), logp.max(-1).values)
    logp = drafter.expand(tree, torch.tensor([len(tree) - 1]))[0]
    path = tree.tokens[tree.path_to(len(tree) - 1)[1:]].tolist()
    ref = torch.log_softmax(_plain_logits(draft, prefix + path)[-1], -1)
    torch.testing.assert_close(logp, ref, atol=1e-9, rtol=0)


# ---------------------------------------------------------------------------- model details
def _no_attn_softcap(model: Any) -> None:
    for layer in model.model.layers:
        layer.self_attn.attn_logit_softcapping = None


def _no_final_softcap(model: Any) -> None:
    model.config.final_logit_softcapping = None


def _no_embed_scale(model: Any) -> None:
    model.model.embed_tokens.embed_scale.fill_(1.0)


def _one_rope_base(model: Any) -> None:
    rope = model.model.rotary_emb
    rope.sliding_attention_inv_freq.copy_(rope.full_attention_inv_freq)


def _no_sinks(model: Any) -> None:
    for layer in model.model.layers:
        layer.self_attn.sinks.data.fill_(-1e4)  # exp(-1e4) = 0: the sink takes no probability mass


DETAILS: dict[str, tuple[str, Callable[[Any], None]]] = {
    "attention-logit-softcapping": ("gemma2", _no_attn_softcap),
    "final-logit-softcapping": ("gemma2", _no_final_softcap),
    "final-logit-softcapping-gemma3": ("gemma3", _no_final_softcap),
    "scaled-embeddings": ("gemma3", _no_embed_scale),
    "per-layer-rope-bases": ("gemma3", _one_rope_base),
    "attention-sinks": ("gpt_oss", _no_sinks),
}


@pytest.mark.parametrize("detail", sorted(DETAILS))
def test_model_specific_detail_stays_lossless(detail: str) -> None:
    """The detail is live (switching it off changes the logits), tree logits still equal the
    per-path forward past the window, and greedy speculation equals ``generate``."""
    arch, switch_off = DETAILS[detail]
    model = _model(arch)
    prefix = _prompt(seed=6)
    plain = copy.deepcopy(model)
    with torch.no_grad():
        switch_off(plain)
    assert (_plain_logits(plain, prefix) - _plain_logits(model, prefix)).abs().max() > 1e-6, "detail not live"
    tree = _deep_tree(prefix[-1], depth=WINDOW + 2, seed=7)
    _assert_tree_matches_paths(model, prefix, tree, _tree_logits(TargetModel(model), prefix, tree, None),
                               _tolerance(arch))
    expected = _generate_reference(model, prefix)
    for preallocate in (False, True):
        assert _speculate(model, _draft(arch), "talon", preallocate, prefix) == expected, f"preallocate={preallocate}"


# ---------------------------------------------------------------------------- refusals
def test_gpt_neo_local_attention_is_refused() -> None:
    """GPT-Neo windows its local layers by cache index inside the attention: no mask fixes it."""
    import transformers as tf

    cfg = tf.GPTNeoConfig(vocab_size=VOCAB, hidden_size=16, num_layers=2, num_heads=2, window_size=WINDOW,
                          attention_types=[[["global", "local"], 1]], max_position_embeddings=64,
                          bos_token_id=0, eos_token_id=1)
    model = tf.AutoModelForCausalLM.from_config(cfg)
    with pytest.raises(UnsupportedModelError, match=r"^GPTNeoForCausalLM: .*local-attention.*cache index"):
        TargetModel(model)


def test_layer_types_without_a_tree_mask_are_refused() -> None:
    """Linear / chunked attention layers keep state a tree mask and compaction cannot handle."""
    model = copy.deepcopy(_model("qwen2"))
    model.config.layer_types = ["linear_attention", "full_attention"]
    with pytest.raises(UnsupportedModelError, match=r"^Qwen2ForCausalLM: layers of type \['linear_attention'\]"):
        TargetModel(model)


def test_hybrid_model_without_per_type_masks_is_refused() -> None:
    """A hybrid whose forward applies one mask to every layer would let sliding layers see
    everything: refused, naming why."""
    model = copy.deepcopy(_model("mistral-swa"))
    model.config.layer_types = ["sliding_attention", "full_attention"]
    with pytest.raises(UnsupportedModelError, match=r"^MistralForCausalLM: mixes .*one attention mask"):
        TargetModel(model)


def test_bidirectional_configuration_is_refused() -> None:
    """Gemma 3 with bidirectional attention (EmbeddingGemma) does not decode left to right."""
    model = copy.deepcopy(_model("gemma3"))
    model.config.use_bidirectional_attention = True
    with pytest.raises(UnsupportedModelError, match=r"^Gemma3ForCausalLM: configured for bidirectional"):
        TargetModel(model)


def test_window_the_model_ignores_is_ignored() -> None:
    """A config may carry a ``sliding_window`` its modeling code never reads (Llama here): the
    model's own decoding attends to everything, so the tree mask must too."""
    model = copy.deepcopy(_model("llama"))
    model.config.sliding_window = WINDOW
    target = TargetModel(model)
    assert target.sliding_window is None and SLIDING_ATTENTION not in target.layer_types
    prefix = _prompt(seed=10)
    tree = _deep_tree(prefix[-1], depth=WINDOW + 2, seed=11)
    _assert_tree_matches_paths(model, prefix, tree, _tree_logits(target, prefix, tree, None), 1e-9)
