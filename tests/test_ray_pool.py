"""The actor pool of a sharded job (``run --ray``, ``record --ray``) on a fake Ray
(:mod:`fake_ray`): an unavailable actor is killed and its unit waits until Ray says it is dead
(never two actors on one unit), a dead actor is killed (nothing leaks past ``close``), a
replacement that is never placed and a lost node each stop the job in one line, never a wait
for ever. A cheap real-Ray check ends the module."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("ray")

from fake_ray import ADDRESS, NODE, Actor, FakeRay  # noqa: E402
from ray_session import local_ray  # noqa: E402,F401 - the session's Ray fixture
from specframe.errors import ExperimentError  # noqa: E402
from specframe.experiments.cluster import nodes  # noqa: E402
from specframe.experiments.cluster.pool import ActorPool  # noqa: E402

UNITS = list(range(6))


def _pool(ray: FakeRay, count: int = 2) -> ActorPool:
    return ActorPool(ray, lambda number: Actor(ray, number), count)


def _run(pool: ActorPool) -> dict:
    done: dict = {}

    def keep(unit, value) -> None:
        assert unit not in done, f"unit {unit} given twice"
        done[unit] = value

    pool.run(UNITS, lambda actor, unit: actor.work(unit), keep)
    return done


@pytest.fixture
def fake_clock(monkeypatch):
    """``fake_clock(FakeRay(...))``: the job's clock is the fake Ray's (time passes in waits)."""

    def install(ray: FakeRay) -> FakeRay:
        monkeypatch.setattr(nodes, "clock", ray.clock)
        return ray

    return install


def test_an_unavailable_actor_is_killed_and_its_unit_runs_elsewhere_only_once_it_is_dead(fake_clock):
    ray = fake_clock(FakeRay({(1, 1): "unavailable"}))
    pool = _pool(ray)
    done = _run(pool)
    assert sorted(done) == UNITS and done[1][2] != 1  # unit 1 answered by another actor
    assert ray.twice == []  # never on two actors at once
    assert {a.number for a in ray.killed} == {1}  # killed, not left running its unit
    assert [a.number for a in pool.actors] == [0]


def test_a_dead_actor_is_killed_at_once_so_close_leaks_nothing(fake_clock):
    ray = fake_clock(FakeRay({(1, 1): "died"}))
    pool = _pool(ray)
    done = _run(pool)
    assert sorted(done) == UNITS and ray.twice == []
    assert [a.number for a in ray.killed] == [1]  # before close(): what it held (a GPU) is freed
    pool.close()
    assert {a.number for a in ray.killed} == {0, 1}


def test_a_replacement_that_is_never_placed_stops_the_job_in_one_line(fake_clock):
    ray = fake_clock(FakeRay({(0, 0): "died"}, never_place=True, initial=1))
    pool = _pool(ray, count=1)
    with pytest.raises(ExperimentError) as caught:
        _run(pool)
    message = str(caught.value)
    assert "\n" not in message and re.search(r"replacement Ray worker .* not start", message), message
    assert ray.clock.now <= 120  # a bounded wait, every ray.wait with a timeout
    assert None not in ray.waits


def test_a_node_marked_dead_stops_the_job_naming_the_node_and_how_to_resume(fake_clock):
    ray = fake_clock(FakeRay(node_dies_after=2))
    pool = _pool(ray)
    with pytest.raises(ExperimentError) as caught:
        _run(pool)
    message = str(caught.value)
    assert "\n" not in message and NODE[:12] in message and ADDRESS in message, message
    assert "marked it dead" in message and "again" in message, message
    assert ray.clock.now <= 60



@pytest.mark.parametrize("how", ["bounded", "as_completed"])
def test_tasks_stop_when_a_node_is_lost_naming_it(fake_clock, monkeypatch, how):
    """sweep --ray (``bounded``) and tune --ray (``as_completed``): a retried task waiting for a
    node that is gone would wait for ever; the lost node stops them in one line."""
    from specframe.experiments.cluster import rayrun

    ray = fake_clock(FakeRay(node_dies_after=2))
    monkeypatch.setattr(rayrun, "ray_module", lambda: ray)
    worker = Actor(ray, 0)
    if how == "bounded":
        results = rayrun.bounded(lambda job: worker.work(job), UNITS, 2, resume="Rerun to go on.")
    else:
        results = rayrun.as_completed({worker.work(u): u for u in UNITS}, timeout=1.0, resume="Rerun to go on.")
    got = []
    with pytest.raises(ExperimentError) as caught:
        for _, value, error in results:
            got.append(value)
    assert len(got) == 2 and NODE[:12] in str(caught.value) and str(caught.value).endswith("Rerun to go on.")
    assert ray.clock.now <= 60


def test_on_a_real_ray_a_replacement_starts_when_the_last_actor_dies_and_the_dead_one_is_killed(local_ray):
    from ray_faults import Crashing

    actor_class = local_ray.remote(num_cpus=1)(Crashing)
    pool = ActorPool(local_ray, lambda number: actor_class.remote(number), 1)
    done: dict = {}
    try:
        pool.run(list(range(5)), lambda actor, unit: actor.work.remote(unit), done.__setitem__)
    finally:
        pool.close()
    assert sorted(done) == list(range(5)) and done[2] == (2, 1)  # unit 2 went to the replacement
    assert pool.started == 2 and len(pool.actors) == 1


def test_a_worker_whose_constructor_raises_is_one_line_of_its_own_error_not_a_traceback():
    from ray.exceptions import ActorDiedError

    from specframe.experiments.cluster.rayrun import task_message

    err = ActorDiedError()
    err.error_msg = ("The actor died because of an error raised in its creation task, ray::RecordWorker.__init__() "
                     "(pid=1378, ip=192.0.2.2)\n  File \"record.py\", line 267, in __init__\n    self.curve = "
                     "curve_for(self.target)\n    ^^^^^^\nspecframe.sizing.profile.BusyMachineError: cost curve x "
                     "not kept: the machine is busy")
    err._actor_init_failed = True
    assert task_message(err) == "cost curve x not kept: the machine is busy"  # as one_line writes our own errors
