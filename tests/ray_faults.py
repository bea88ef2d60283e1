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
