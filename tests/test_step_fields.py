"""Every second of a generation is in a field: the prefill, the set-up and each step's fields
tile ``wall_time`` (the engine times consecutive intervals of one clock), for every built-in
drafter, with ``on_step`` and ``score`` on; and each field holds what its name says."""

from __future__ import annotations

import time

import pytest
import torch

import specframe
from specframe.decode.clock import FIELDS
from specframe.interfaces import StepStats
from specframe.testing.fixtures import close_draft, default_drafter, tiny_target

DRAFTERS = specframe.get_registry().names("drafters", dist="specframe")


@pytest.fixture(scope="module")
def target():
    return specframe.TargetModel(tiny_target())


def test_the_clock_fields_are_the_step_records_time_fields():
    names = {n for n in StepStats.__dataclass_fields__ if n.endswith("_time")}
    assert set(FIELDS) == names


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_the_fields_of_a_generation_sum_to_its_wall_time(target, drafter):
    dec = specframe.SpecDecoder.build(target=target, drafter=default_drafter(drafter, target), policy="talon")
    out = dec.generate([4, 9, 12, 30, 2, 17, 9, 12], max_new_tokens=12, eos_token_id=None,
                       on_step=lambda view: None, score=True)
    assert out.wall_time > 0 and out.prefill_time > 0 and out.setup_time > 0
    # Consecutive intervals of one clock: equal up to float rounding, far inside the 2% asked.
    assert out.accounted_time == pytest.approx(out.wall_time, rel=1e-9, abs=1e-9)
    assert all(getattr(s, f) >= 0 for s in out.steps for f in FIELDS)
    assert out.steps[0].total_time < out.time_to_first_token <= out.wall_time


def test_each_field_holds_its_part_of_the_step(target):
    """A slow callback, a slow commit and a slow KV keep land in their own fields only."""
    nap = 0.02
    dec = specframe.SpecDecoder.build(target=target, drafter=("model", {"model": close_draft(tiny_target())}),
                                      policy=("chain", {"gamma": 3}))
    commit, keep = dec.drafter.commit, dec.target.keep

    def slow_commit(*args, **kwargs):
        time.sleep(nap)
        return commit(*args, **kwargs)

    def slow_keep(*args, **kwargs):
        time.sleep(nap)
        return keep(*args, **kwargs)

    dec.drafter.commit = slow_commit
    dec.target.keep = slow_keep
    out = dec.generate([5, 6, 7], max_new_tokens=6, eos_token_id=None, on_step=lambda view: time.sleep(nap))
    for step in out.steps:
        assert step.callback_time >= nap and step.commit_time >= nap
        others = step.total_time - step.callback_time - step.commit_time - step.kv_time
        assert others < step.total_time - 2 * nap
    assert any(s.kv_time >= nap for s in out.steps)  # the last step keeps nothing
