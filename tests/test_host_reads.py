"""The engine's fast path reads from the device once per step; the counter can see more.

A GPU waits for every queued kernel at each host read, so the fast path packs everything the
host needs from a verified step into one read. Policies and drafters are plugins whose own
reads (e.g. TALON's per-layer widths) are theirs: the counter is paused inside them.
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
def test_fast_step_reads_the_device_once(target, policy, verifier):
    fast = specframe.SpecDecoder.build(target=target, drafter=("model", {"model": target}),
                                       policy=policy, verifier=verifier, fast=True)
    steps, reads = _engine_reads(fast, [5, 6, 7])
    assert steps > 1
    assert reads == steps


def test_counter_sees_the_reference_paths_reads(target):
    ref = specframe.SpecDecoder.build(target=target, drafter=("model", {"model": target}),
                                      policy="talon", fast=False)
    steps, reads = _engine_reads(ref, [5, 6, 7])
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
    fast = specframe.SpecDecoder.build(target=target, drafter=("model", {"model": target}),
                                       policy="sampled-tree", verifier=("sampling", {"seed": 2}), fast=True)
    steps, reads = _engine_reads(fast, [5, 6, 7])
    assert steps > 1
    assert reads == 2 * steps
