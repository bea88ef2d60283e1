"""The engine's own work per step does not grow with the tree: the Python calls a step makes
outside the tree's building (verification, the host read, commit, KV, the record) are the same
for a 3-node and a 63-node tree. A per-node Python loop in any of them would add calls per
node and fail this; the count is a property of the code, not of the machine's speed."""

from __future__ import annotations

import sys

import torch

import specframe
from specframe.decode.engine import SpecDecoder
from specframe.testing.fixtures import close_draft, tiny_target


def _calls_outside_build(decoder: SpecDecoder, prompt: list[int]) -> tuple[list[int], list[int]]:
    """Python calls per step, each step less those made while its trees were built, and the
    steps' tree sizes."""
    counts: list[int] = []
    state = {"calls": 0, "building": 0}
    build, step = decoder._build, decoder._step

    def counted_build(*args, **kwargs):
        state["building"] += 1
        try:
            return build(*args, **kwargs)
        finally:
            state["building"] -= 1

    def counted_step(*args, **kwargs):
        state["calls"] = 0
        sys.setprofile(profile)
        try:
            return step(*args, **kwargs)
        finally:
            sys.setprofile(None)
            counts.append(state["calls"])

    def profile(frame, event, arg):
        if event == "call" and not state["building"]:
            state["calls"] += 1

    decoder._build, decoder._step = counted_build, counted_step
    out = decoder.generate(prompt, max_new_tokens=6, eos_token_id=None)
    # The last step also finishes the generation.
    return counts[:-1], [s.tree_size for s in out.steps[:-1]]


def test_a_steps_python_calls_do_not_grow_with_the_tree():
    target = specframe.TargetModel(tiny_target())
    small = [[0], [1]]
    big = [[i] for i in range(9)] + [[i, j] for i in range(9) for j in range(6)]  # 63 drafted nodes
    draft = close_draft(tiny_target())
    counts, sizes = {}, {}
    for name, choices in (("small", small), ("big", big)):
        dec = SpecDecoder.build(target=target, drafter=("model", {"model": draft}),
                                policy=("static", {"choices": choices}), strict=False)
        counts[name], sizes[name] = _calls_outside_build(dec, [4, 9, 12, 30, 2, 17, 9, 12])
    assert counts["small"] and counts["big"]
    assert max(sizes["small"]) == 3 and min(sizes["big"]) == 64, sizes  # the trees the test compares
    # Equal up to a few calls that depend on what was accepted (e.g. the drafter's commit).
    assert max(counts["big"]) <= min(counts["small"]) + 12, counts
