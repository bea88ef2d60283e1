"""The actors of one sharded job (``run --ray``, ``record --ray``): each is given one unit at a
time as it is free. Ray's two actor failures are told apart:

- an actor that **died** (killed, preempted, out of memory) loses only its unit, which goes to
  another actor (a new one starts when none is left); the dead actor is ``ray.kill``-ed at once,
  so nothing it held (a GPU) outlives it, whatever Ray's restart settings;
- an actor that is **unavailable** ("may be available later": unreachable, restarting) may
  still be running its unit, so it is killed and its unit waits until Ray reports the actor
  dead: a unit never runs on two actors at once.

No wait is for ever: every ``ray.wait`` has a timeout, and while the job waits it checks the
cluster's nodes (:mod:`.nodes`: a lost node stops the job in one line saying how to resume) and
gives a replacement actor a bounded time to start (one waiting for resources that no live node
has, such as the GPU a dead actor held, would otherwise hang the job). A unit's own error stops
the job in one line."""

from __future__ import annotations

import contextlib
from typing import Any, Callable

from specframe.errors import ExperimentError
from specframe.experiments.cluster import nodes, rayrun

#: How many actors may die in one job before it stops (a crash loop is no preemption).
MAX_RESTARTS = 8
#: The least time (seconds) a replacement actor has to start; it has at least 3 times what the
#: first actors took to load, too.
START_S = 60.0

# What a pending call is: a unit's work, a replacement's start, or the check that a killed actor is dead.
WORK, START, FENCE = "work", "start", "fence"


def node_id(actor: Any) -> str:
    """Run inside an actor (``__ray_call__``): its node. It answers only once the actor has
    started, and raises once the actor is dead."""
    import ray

    return ray.get_runtime_context().get_node_id()


class ActorPool:
    """``count`` actors made by ``start(number)`` (numbers count every actor ever started);
    ``resume`` ends the line that stops the job on Ray's account (a lost node)."""

    def __init__(self, ray: Any, start: Callable[[int], Any], count: int, resume: str = rayrun.RESUME) -> None:
        self.ray, self.start, self.started, self.resume = ray, start, 0, resume
        self.watch = nodes.NodeWatch(ray, resume)
        self.pids: dict[int, int] = {}
        self.load_s = 0.0
        self.actors = [self._new() for _ in range(count)]

    def _new(self) -> Any:
        actor = self.start(self.started)
        self.started += 1
        return actor

    def infos(self, what: str) -> list[Any]:
        """Every actor's ``ready()`` (what it found when it loaded), once all have loaded; a
        failure raises :class:`~.rayrun.TaskFailed` naming ``what``, a lost node
        :class:`~.nodes.NodeLost`. ``pids`` maps each actor's device index to its process
        (an info with ``device`` and ``pid``)."""
        began = nodes.clock()
        infos = [rayrun.fetch(a.ready.remote(), what, self.watch) for a in self.actors]
        self.load_s = nodes.clock() - began
        self.pids = {info.device["index"]: info.pid for info in infos}
        return infos

    def run(self, work: list, call: Callable[[Any, Any], Any], on_result: Callable[[Any, Any], None]) -> None:
        """Hand out each unit of ``work`` to a free actor (``call(actor, unit)`` returns the
        object ref of its result) and give each result to ``on_result(unit, value)`` in the
        order they finish (module docstring: what a failure does)."""
        from ray.exceptions import ActorUnavailableError, RayActorError

        self.queue, self.running, self.idle, self.deaths = list(work), {}, list(self.actors), 0
        self.waiting_since: float | None = None
        try:
            while self.queue or self.running:
                self._hand_out(call)
                ready, _ = self.ray.wait(list(self.running), num_returns=1, timeout=nodes.CHECK_S)
                if not ready:
                    self._waited()
                    continue
                kind, actor, unit = self.running.pop(ready[0])
                try:
                    value = self.ray.get(ready[0])
                except ActorUnavailableError:  # it may still run its unit: fence it off first
                    self._fence(actor, unit, count=kind != FENCE)
                    continue
                except RayActorError as err:  # dead: its unit (if any) goes to another actor
                    if err.actor_init_failed:  # its constructor raised: every new one would too
                        raise ExperimentError(f"a Ray worker, loading: {rayrun.task_message(err)}") from err
                    self._lost(actor, unit, count=kind != FENCE)
                    continue
                except Exception as err:  # the unit's own error (a plugin raised): one line
                    raise ExperimentError(rayrun.task_message(err)) from err
                self._finished(kind, actor, unit, value, on_result)
                self.watch.due()  # results keep coming from the nodes left: a lost one still ends the job
        finally:
            rayrun.cancel(list(self.running), self.ray)

    def _hand_out(self, call: Callable[[Any, Any], Any]) -> None:
        while self.queue and self.idle:
            actor, unit = self.idle.pop(0), self.queue.pop(0)
            self.running[call(actor, unit)] = (WORK, actor, unit)
        if self.queue and not any(kind in (WORK, START) for kind, _, _ in self.running.values()):
            actor = self._new()  # every actor is gone: a new one, ready once it answers
            self.actors.append(actor)
            self.running[actor.__ray_call__.remote(node_id)] = (START, actor, None)
            self.waiting_since = nodes.clock()

    def _finished(self, kind: str, actor: Any, unit: Any, value: Any, on_result: Callable[[Any, Any], None]) -> None:
        if kind == FENCE:  # the killed actor still answers: the kill has not landed yet
            self._fence(actor, unit, count=False)
            return
        if kind == START:
            self.waiting_since = None
        else:
            on_result(unit, value)
        self.idle.append(actor)

    def _fence(self, actor: Any, unit: Any, count: bool) -> None:
        """Kill ``actor`` and hold ``unit`` back until Ray reports the actor dead."""
        if count:
            self._count_death()
        self._kill(actor)
        self.running[actor.__ray_call__.remote(node_id)] = (FENCE, actor, unit)

    def _lost(self, actor: Any, unit: Any, count: bool) -> None:
        """``actor`` is dead: a lost node stops the job; else its unit goes back to the queue."""
        self.watch.check()
        if count:
            self._count_death()
        self._kill(actor)
        if actor in self.actors:
            self.actors.remove(actor)
        if unit is not None:
            self.queue.insert(0, unit)

    def _count_death(self) -> None:
        self.deaths += 1
        if self.deaths > MAX_RESTARTS:
            raise ExperimentError(f"{self.deaths} Ray workers died in this job; stopping (a crash loop, not a "
                                  f"preemption: see the workers' logs). {self.resume}")

    def _kill(self, actor: Any) -> None:
        with contextlib.suppress(Exception):  # already gone
            self.ray.kill(actor, no_restart=True)

    def _waited(self) -> None:
        """Nothing finished in a while: is a node lost, has a replacement had its time?"""
        self.watch.check()
        limit = max(START_S, 3 * self.load_s)
        if self.waiting_since is not None and nodes.clock() - self.waiting_since > limit:
            raise ExperimentError(f"a replacement Ray worker did not start in {limit:.0f} s (no live node has the "
                                  f"resources it needs: see `ray status`). {self.resume}")

    def close(self) -> None:
        """Stop every actor (their models go with them)."""
        for actor in self.actors:
            self._kill(actor)
