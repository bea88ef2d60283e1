"""Exports read a plugin's defaults from its ``Options``, never from a literal copy."""

from __future__ import annotations

import dataclasses

import pytest

import specframe
from specframe.experiments.config import ArmConfig, PluginRef
from specframe.serving.engines import export_arm


def _default(kind: str, name: str, option: str):
    cls = specframe.get_registry().get(kind, name).Options
    return next(f.default for f in dataclasses.fields(cls) if f.name == option)


def _arm(drafter: tuple[str, dict], policy: tuple[str, dict]) -> ArmConfig:
    return ArmConfig("arm", drafter=PluginRef(*drafter), policy=PluginRef(*policy), verifier=PluginRef("greedy", {}))


def test_a_suffix_cap_of_zero_tokens_exports_zero_not_the_tree_depth():
    """The suffix drafter reads ``max_spec_tokens = None`` as its depth; 0 is a cap of its own."""
    zero = export_arm(_arm(("suffix", {"max_spec_tokens": 0}), ("talon", {"budget": 8})), "vllm")
    assert zero.settings["num_speculative_tokens"] == 0
    unset = export_arm(_arm(("suffix", {}), ("talon", {"budget": 8})), "vllm")
    assert unset.settings["num_speculative_tokens"] == _default("drafters", "suffix", "max_depth")


@pytest.mark.parametrize("engine,key", [("hf", "num_assistant_tokens"), ("llamacpp", "spec_draft_n_max"),
                                        ("vllm", "num_speculative_tokens")])
def test_an_unmeasured_adaptive_tree_is_served_at_the_policys_own_default_depth(engine, key):
    """eagle without a ``depth`` option grows to its Options default, not to a copied 4."""
    depth = _default("policies", "eagle", "depth")
    assert depth != 4  # not vacuous: the old literal fallback would differ
    result = export_arm(_arm(("model", {"model": "draft/folder"}), ("eagle", {"budget": 8})), engine)
    assert result.settings[key] == min(depth, 8)


def test_sglang_serves_eagle_at_its_own_defaults():
    result = export_arm(_arm(("eagle", {"path": "eagle/folder"}), ("eagle", {})), "sglang")
    assert result.settings["speculative_num_steps"] == _default("policies", "eagle", "depth") + 1
    assert result.settings["speculative_eagle_topk"] == _default("policies", "eagle", "top_k")


def _allocator_field(name: str, option: str) -> dataclasses.Field:
    from specframe.decode.allocate import allocator_classes

    return next(f for f in dataclasses.fields(allocator_classes()[name].Options) if f.name == option)


def _load_arm(allocator: str) -> ArmConfig:
    arm = _arm(("model", {"model": "draft/folder"}), ("chain", {"gamma": 5}))
    arm.batch_allocator = PluginRef(allocator, {})
    return arm


def test_a_threshold_exports_the_allocators_own_default(monkeypatch):
    """``threshold`` without options exports its Options default (here moved to 6), not a copied 4."""
    monkeypatch.setattr(_allocator_field("threshold", "disable_by_batch_size"), "default", 6)
    vllm = export_arm(_load_arm("threshold"), "vllm")
    assert vllm.settings["num_speculative_tokens_per_batch_size"] == [[1, 5, 5], [6, 6, 0]]
    assert export_arm(_load_arm("threshold"), "sglang").settings["apdative_speculative_batch_size_threshold"] == 5


def test_a_schedule_exports_the_allocators_own_default(monkeypatch):
    monkeypatch.setattr(_allocator_field("schedule", "schedule"), "default_factory", lambda: [[1, 2, 3], [3, 3, 1]])
    vllm = export_arm(_load_arm("schedule"), "vllm")
    assert vllm.settings["num_speculative_tokens_per_batch_size"] == [[1, 2, 3], [3, 3, 1]]


def test_a_fixed_shape_and_a_lossless_verifier_come_from_the_plugins_not_a_list_of_names():
    """The export asks the policy for its fixed shape (TreePolicy.fixed_shape) and the verifier
    whether it is lossless and samples (class attributes), instead of lists of built-in names:
    sequoia's shape is its own, and the lossless traversal verifier is approximated (the same
    distribution, other draws), not refused as lossy; typical (lossy) is refused."""
    from specframe.serving.engines.common import fixed_shape

    sequoia = PluginRef("sequoia", {"budget": 6})
    cls = specframe.get_registry().get("policies", "sequoia")
    assert fixed_shape(sequoia) == tuple(tuple(p) for p in cls(cls.Options(budget=6)).shape())
    assert fixed_shape(PluginRef("talon", {"budget": 8})) is None

    def with_verifier(name: str) -> ArmConfig:
        arm = _arm(("model", {"model": "draft/folder"}), ("static", {"choices": [[0], [0, 0]]}))
        arm.verifier = PluginRef(name, {})
        return arm

    traversal = export_arm(with_verifier("traversal"), "vllm").fidelity
    assert traversal.level == "approximated" and any("the traversal verifier" in r for r in traversal.reasons)
    assert export_arm(with_verifier("typical"), "vllm").fidelity.level == "not expressible"
