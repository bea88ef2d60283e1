"""One local Ray for every Ray test of a pytest session: 2 CPUs, no dashboard, workers that
carry the test fault (:mod:`ray_faults`). Import :func:`local_ray` (or :func:`start`) into a
test module; the first use starts Ray, later ones (any module) reuse it, and it stops when the
next test's module imports neither (tests/conftest.py): an idle local Ray keeps ~4% of a core
busy for the rest of the session. A later Ray module starts it again."""

from __future__ import annotations

import atexit
import os
import sys
from pathlib import Path

import pytest

TESTS = str(Path(__file__).resolve().parent)


def start() -> object:
    """Ray, started once per process (or the Ray a test already initialised)."""
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        path = os.pathsep.join(p for p in (TESTS, os.environ.get("PYTHONPATH", "")) if p)
        env = {"PYTHONPATH": path, **{k: os.environ[k] for k in ("SPECFRAME_CACHE", "HF_HUB_OFFLINE") if k in os.environ}}
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": env, "worker_process_setup_hook": "ray_faults.install"})
        atexit.register(ray.shutdown)
    return ray


@pytest.fixture
def local_ray():
    """The session's local Ray (restarted if another test shut it down)."""
    return start()


@pytest.fixture
def lose_node(monkeypatch):
    """``lose_node(when)``: while ``when()`` is true, the cluster reports every node dead, as
    the driver sees a node whose raylet died (its actors go on here: the driver must stop on
    the report, not on their errors). The job checks the nodes at every result."""
    from specframe.experiments.cluster import nodes

    monkeypatch.setattr(nodes.NodeWatch, "due", nodes.NodeWatch.check)

    def install(when) -> None:
        real = nodes.node_table

        def table(ray):
            rows = real(ray)
            return [dict(n, Alive=False, DeathReason=2) for n in rows] if when() else rows

        monkeypatch.setattr(nodes, "node_table", table)

    return install


def uses_ray(item: pytest.Item | None) -> bool:
    """Whether ``item``'s module imported :func:`start` or :func:`local_ray`."""
    module = getattr(item, "module", None)
    return module is not None and any(v is start or v is local_ray for v in vars(module).values())


def stop_unless_next_uses_it(nextitem: pytest.Item | None) -> None:
    """Shut the local Ray down unless ``nextitem`` (the next test this process runs) uses it."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized() and not uses_ray(nextitem):
        ray.shutdown()
