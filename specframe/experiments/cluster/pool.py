"""The actors of one sharded job (``run --ray``, ``record --ray``): each is given one unit at a
time as it is free; one that dies (killed, preempted, out of memory) loses only its unit, which
goes to another actor (a new one starts when none is left); a unit's own error stops the job in
one line."""

from __future__ import annotations

from typing import Any, Callable

from specframe.errors import ExperimentError
from specframe.experiments.cluster import rayrun

#: How many actors may die in one job before it stops (a crash loop is no preemption).
MAX_RESTARTS = 8


class ActorPool:
    """``count`` actors made by ``start(number)`` (numbers count every actor ever started)."""

    def __init__(self, ray: Any, start: Callable[[int], Any], count: int) -> None:
        self.ray, self.start, self.started = ray, start, 0
        self.pids: dict[int, int] = {}
        self.actors = [self._new() for _ in range(count)]

    def _new(self) -> Any:
        actor = self.start(self.started)
        self.started += 1
        return actor

    def infos(self, what: str) -> list[Any]:
        """Every actor's ``ready()`` (what it found when it loaded), once all have loaded; a
        failure raises :class:`~.rayrun.TaskFailed` naming ``what``. ``pids`` maps each
        actor's device index to its process (an info with ``device`` and ``pid``)."""
        infos = [rayrun.fetch(a.ready.remote(), what) for a in self.actors]
        self.pids = {info.device["index"]: info.pid for info in infos}
        return infos

    def run(self, work: list, call: Callable[[Any, Any], Any], on_result: Callable[[Any, Any], None]) -> None:
        """Hand out each unit of ``work`` to a free actor (``call(actor, unit)`` returns the
        object ref of its result) and give each result to ``on_result(unit, value)`` in the
        order they finish. A dead actor's unit is handed out again; a unit that raises stops
        the job with :class:`ExperimentError` in one line (the task's own error)."""
        from ray.exceptions import RayActorError

        queue, running, deaths = list(work), {}, 0
        idle = list(self.actors)
        while queue or running:
            while queue and idle:
                actor, unit = idle.pop(0), queue.pop(0)
                running[call(actor, unit)] = (actor, unit)
            ready, _ = self.ray.wait(list(running), num_returns=1)
            actor, unit = running.pop(ready[0])
            try:
                value = self.ray.get(ready[0])
            except RayActorError:  # the actor died: its unit only
                deaths += 1
                if deaths > MAX_RESTARTS:
                    raise ExperimentError(f"{deaths} Ray workers died in this job; stopping (a crash loop, not a "
                                          "preemption: see the workers' logs)") from None
                self.actors.remove(actor)
                queue.insert(0, unit)
                if not idle and not running:
                    replacement = self._new()
                    self.actors.append(replacement)
                    idle.append(replacement)
                continue
            except Exception as err:  # the unit's own error (a plugin raised): one line
                rayrun.cancel(list(running))
                raise ExperimentError(rayrun.task_message(err)) from err
            on_result(unit, value)
            idle.append(actor)

    def close(self) -> None:
        """Stop every actor (their models go with them)."""
        for actor in self.actors:
            try:
                self.ray.kill(actor)
            except Exception:  # already gone
                pass
