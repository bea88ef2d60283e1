"""A fake of the few Ray calls a sharded job makes (``wait``, ``get``, ``kill``, ``nodes``,
actor calls), on a fake clock, to stage what a real cluster does rarely: an actor that is
unavailable (it may still be running its unit), one that dies, a replacement that is never
placed, a node marked dead. It also watches that no unit ever runs on two actors at once.

An actor's call finishes at once unless the plan says otherwise: ``plan[(actor, unit)]`` is
``"died"`` (the actor dies under it) or ``"unavailable"`` (the call fails, but the actor goes
on running the unit until it is killed)."""

from __future__ import annotations

from ray.exceptions import ActorDiedError, ActorUnavailableError

NODE = "f" * 56
ADDRESS = "10.0.0.7"


class Hang(Exception):
    """``ray.wait`` without a timeout while nothing can ever finish: a real job waits for ever."""


class Clock:
    """Seconds that pass only when a wait times out."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Ref:
    def __init__(self, actor: "Actor", unit, kind: str) -> None:
        self.actor, self.unit, self.kind = actor, unit, kind


class _Method:
    def __init__(self, call) -> None:
        self.remote = call


class Actor:
    def __init__(self, ray: "FakeRay", number: int) -> None:
        self.ray, self.number, self.killed, self.dead = ray, number, False, False
        self.placed = not (ray.never_place and number >= ray.initial)
        self.ready = _Method(lambda: Ref(self, None, "ready"))
        self.__ray_call__ = _Method(lambda fn: Ref(self, None, "probe"))

    def work(self, unit) -> Ref:
        holder = self.ray.running_on.get(unit)
        if holder is not None and holder is not self and not holder.killed:
            self.ray.twice.append(unit)  # the unit runs on two actors at once
        self.ray.running_on[unit] = self
        self.ray.calls.append((self.number, unit))
        return Ref(self, unit, "work")

    def __repr__(self) -> str:
        return f"Actor({self.number})"


class FakeRay:
    def __init__(self, plan: dict | None = None, never_place: bool = False, node_dies_after: int | None = None,
                 initial: int = 2) -> None:
        self.plan, self.never_place, self.initial = plan or {}, never_place, initial
        self.node_dies_after = node_dies_after
        self.clock = Clock()
        self.killed: list[Actor] = []
        self.running_on: dict = {}
        self.twice: list = []
        self.calls: list = []
        self.waits: list = []
        self.results = 0

    # ---------------------------------------------------------------- Ray's API
    def nodes(self) -> list[dict]:
        alive = self.node_dies_after is None or self.results < self.node_dies_after
        return [{"NodeID": NODE, "Alive": alive, "NodeManagerAddress": ADDRESS,
                 "DeathReason": 0 if alive else 2}]

    def _finishes(self, ref: Ref) -> bool:
        if not ref.actor.placed:
            return False
        if self.node_dies_after is not None and self.results >= self.node_dies_after:
            return False  # the node is gone: nothing on it answers
        return True

    def wait(self, refs: list, num_returns: int = 1, timeout: float | None = None):
        self.waits.append(timeout)
        ready = [r for r in refs if self._finishes(r)][:num_returns]
        if not ready:
            if timeout is None:
                raise Hang("ray.wait with no timeout, and nothing will ever finish")
            self.clock.now += timeout
        return ready, [r for r in refs if r not in ready]

    def get(self, ref: Ref):
        actor = ref.actor
        if ref.kind in ("probe", "ready"):
            if actor.killed or actor.dead:
                raise ActorDiedError()
            return NODE if ref.kind == "probe" else actor.number
        outcome = self.plan.get((actor.number, ref.unit))
        if outcome == "died":
            actor.dead = True
            self.running_on.pop(ref.unit, None)
            raise ActorDiedError()
        if outcome == "unavailable" and not actor.killed:
            raise ActorUnavailableError("connection lost", b"\0" * 16)  # it may still be running the unit
        self.running_on.pop(ref.unit, None)
        self.results += 1
        return ("done", ref.unit, actor.number)

    def kill(self, actor: Actor, no_restart: bool = True) -> None:
        actor.killed = True
        self.killed.append(actor)

    def cancel(self, ref, force: bool = False) -> None:
        pass
