"""The engine reads from the device once per step (outside strict mode); the counter can see more.

A GPU waits for every queued kernel at each host read, so the engine packs everything the
host needs from a verified step into one read. Policies and drafters are plugins whose own
reads (e.g. TALON's per-layer widths) are theirs: the counter is paused inside them. Strict
mode (on in tests through SPECFRAME_STRICT) checks each tree on the host, so these decoders
turn it off.
"""

from __future__ import annotations

import pytest
import torch

import specframe
from specframe.testing.host_reads import HostReadCounter, count_step_reads
from specframe.testing.models import tiny_model


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", seed=3)


def _engine_reads(decoder: specframe.SpecDecoder, prompt: list[int]) -> tuple[int, int]:
    """(steps, host reads made by the engine itself inside its steps)."""
    reads = count_step_reads(decoder, prompt, max_new_tokens=24)
    return reads["steps"], reads["engine"]


@pytest.mark.parametrize("policy", ["chain", "talon", "eagle"])
@pytest.mark.parametrize("verifier", ["greedy", ("sampling", {"temperature": 0.8, "seed": 1})])
@pytest.mark.parametrize("preallocate", [False, True], ids=["dynamic-cache", "preallocated"])
def test_step_reads_the_device_once(target, policy, verifier, preallocate):
    dec = specframe.SpecDecoder.build(target=specframe.TargetModel(target, preallocate=preallocate),
                                      drafter=("model", {"model": target}), policy=policy, verifier=verifier,
                                      strict=False)
    steps, reads = _engine_reads(dec, [5, 6, 7])
    assert steps > 1
    assert reads == steps


def test_counter_sees_strict_modes_reads(target):
    strict = specframe.SpecDecoder.build(target=target, drafter=("model", {"model": target}),
                                         policy="talon", strict=True)
    steps, reads = _engine_reads(strict, [5, 6, 7])
    assert reads > 3 * steps


def test_counter_counts_each_kind_of_read():
    t = torch.tensor([3, 0, 2])
    with HostReadCounter() as c:
        int(t[0]), bool(t[1]), float(t[2]), t.tolist(), t.nonzero(), t[t > 0], [1, 2, 3, 4][t[0]]
        with c.paused():
            t.tolist()
    assert dict(c.counts) == {"__int__": 1, "__bool__": 1, "__float__": 1, "tolist": 1,
                              "nonzero": 1, "__getitem__": 1, "__index__": 1}


def test_sampled_tree_verification_adds_one_read_for_its_sibling_order(target):
    # Without-replacement children are decided rank by rank: the verifier reads the sibling
    # ranks once, so the step makes two reads in all.
    dec = specframe.SpecDecoder.build(target=target, drafter=("model", {"model": target}),
                                      policy="sampled-tree", verifier=("sampling", {"seed": 2}), strict=False)
    steps, reads = _engine_reads(dec, [5, 6, 7])
    assert steps > 1
    assert reads == 2 * steps


@pytest.mark.parametrize("drafter", ["recycle", ("hybrid", {"drafters": ["ngram", "recycle"]})])
def test_target_logits_for_the_drafter_add_no_read(target, drafter):
    # needs_target_logits: the prefill's and the verifier's logits go to begin and commit as
    # device tensors; the step still reads the device once.
    dec = specframe.SpecDecoder.build(target=target, drafter=drafter, policy="talon", strict=False)
    assert dec.drafter.needs_target_logits
    reads = count_step_reads(dec, [5, 6, 7, 5, 6], max_new_tokens=24)
    assert reads["steps"] > 1
    assert reads["engine"] == reads["steps"]
    if drafter == "recycle":
        assert reads["commit"] == 0  # the table is written on the device


@pytest.mark.parametrize("options", [{"exit_layer": 1}, {"attn_skip": [False, True], "mlp_skip": [True, False]},
                                     {"search": "swift", "swift_context_window": 2}])
@pytest.mark.parametrize("policy", ["chain", "talon"])
@pytest.mark.parametrize("preallocate", [False, True], ids=["dynamic-cache", "preallocated"])
def test_self_drafting_keeps_one_read_per_step(target, options, policy, preallocate):
    """The target drafting for itself (``layerskip``, reading the target's cache) adds no read
    to the engine's step, in every mode."""
    dec = specframe.SpecDecoder.build(target=specframe.TargetModel(target, preallocate=preallocate),
                                      drafter=("layerskip", options), policy=policy, strict=False)
    steps, reads = _engine_reads(dec, [5, 6, 7])
    assert steps > 1
    assert reads == steps
