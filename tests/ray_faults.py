"""A fault that Ray workers carry too: ``install()`` is the local Ray's worker setup hook
(``tests/conftest_ray.py``), so a plugin raises inside a Ray task exactly as in this process.

The chain policy raises when its ``gamma`` is :data:`FAULTY_GAMMA` (no other test uses that
value), so the same Ray session serves every other test unharmed."""

from __future__ import annotations

FAULTY_GAMMA = 11
MESSAGE = "injected fault"


def install() -> None:
    """Patch ``ChainPolicy.grow`` to raise for ``gamma == FAULTY_GAMMA`` (idempotent)."""
    from specframe.strategies.chain import ChainPolicy

    if getattr(ChainPolicy.grow, "_faulty", False):
        return
    grow = ChainPolicy.grow

    def broken(self, session, growth):
        if self.options.gamma == FAULTY_GAMMA:
            raise RuntimeError(MESSAGE)
        return grow(self, session, growth)

    broken._faulty = True
    ChainPolicy.grow = broken


class Crashing:
    """A trivial pool actor (no model): ``work(unit)`` returns ``(unit, number)``, except that
    actor 0 ends its own process on unit 2, as a worker killed mid-unit."""

    def __init__(self, number: int) -> None:
        self.number = number

    def ready(self) -> int:
        return self.number

    def work(self, unit: int) -> tuple[int, int]:
        import os

        if self.number == 0 and unit == 2:
            os._exit(1)
        return unit, self.number
