"""The one way specframe runs on Ray: addresses, workers and errors, for run, record, sweep and tune.

- **Addresses.** ``--ray`` alone starts a local Ray (``ray.init()`` on this machine);
  ``--ray ADDRESS`` attaches to a running cluster (``ray start --head`` on its first machine).
  A Ray already initialised in this process (a test's, a notebook's) is used as it is.
- **Workers.** ``--workers N`` means N tasks or actors at a time, whatever the command; without
  it, as many as the cluster has CPUs for (one CPU each) or, for actors holding a device, GPUs.
- **Errors.** Every result is fetched with ``ray.get``; a task's own exception reaches the user
  as one line naming what the task ran (an arm, a configuration), never a Ray traceback, and
  never silently lost.
- **Lost nodes.** No wait is for ever: every ``ray.wait`` has a timeout, and a node the job
  stood on that the cluster marks dead stops it within seconds, in one line naming the node
  and saying how to resume (:mod:`.nodes`).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterable, Iterator

from specframe.errors import ExperimentError, one_line
from specframe.experiments.cluster import nodes

#: What ``--ray`` with no address means (click's ``flag_value``).
LOCAL = "local"
RAY_MISSING = "--ray needs Ray: pip install 'specframe[ray]'"
#: What a job's line says when a lost node stops it, unless the command says it better.
RESUME = "What the job wrote so far is kept: run the same command again to do only the rest."


class TaskFailed(ExperimentError):
    """A Ray task or actor call failed: ``what`` it ran, and its one-line error."""

    def __init__(self, what: str, message: str) -> None:
        super().__init__(f"{what}: {message}")
        self.what, self.message = what, message

    def __reduce__(self) -> tuple:
        return type(self), (self.what, self.message)  # picklable: it may cross processes too


def ray_module() -> Any:
    """The ``ray`` module, or an ImportError saying how to install it."""
    try:
        import ray
    except ImportError as err:
        raise ImportError(RAY_MISSING) from err
    return ray


def connect(address: str | None) -> Any:
    """Ray, initialised for ``address`` (:data:`LOCAL` or None: a local Ray; else the cluster's
    address); a Ray this process already initialised is kept. Returns the ``ray`` module."""
    ray = ray_module()
    if not ray.is_initialized():
        ray.init(address=None if address in (None, LOCAL) else address, ignore_reinit_error=True,
                 log_to_driver=False, include_dashboard=False)
    return ray


def worker_count(workers: int | None, per_worker: dict[str, float] | None = None) -> int:
    """The rule for ``--workers``: N when given (>= 1), else as many as the cluster's resources
    hold of ``per_worker`` (default one CPU each), at least 1. Call after :func:`connect`."""
    if workers is not None:
        if int(workers) < 1:
            raise ExperimentError(f"--workers must be >= 1, got {workers}")
        return int(workers)
    ray = ray_module()
    total = ray.cluster_resources()
    need = per_worker or {"CPU": 1.0}
    fits = [int(total.get(k, 0.0) // v) for k, v in need.items() if v > 0]
    return max(1, min(fits) if fits else 1)


def worker_index(number: int) -> int:
    """The device index a Ray worker records: its physical GPU under Ray, else its number."""
    import torch

    if torch.cuda.is_available():
        try:
            ray = ray_module()
            ids = ray.get_gpu_ids()
            if ids:
                return int(ids[0])
        except Exception:  # not in a Ray worker: the number stands
            pass
    return int(number)


def task_message(err: BaseException) -> str:
    """One line for a failed task: its own exception when Ray kept it (a RayTaskError's text
    is a whole traceback), else Ray's own error (a worker that died, an actor lost)."""
    cause = getattr(err, "cause", None)
    if type(err).__module__.startswith("ray") and isinstance(cause, BaseException):
        return one_line(cause)
    if getattr(err, "actor_init_failed", False):  # its text is the constructor's traceback: its last line
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        name, colon, message = lines[-1].partition(": ") if lines else ("", "", "")
        if colon:  # as one_line writes an exception: our own errors' message alone, others' with their type
            return message if name.startswith("specframe.") else f"{name.rsplit('.', 1)[-1]}: {message}"
    return one_line(err)


def fetch(ref: Any, what: str, watch: Any = None) -> Any:
    """``ray.get(ref)``; a failure raises :class:`TaskFailed` naming ``what``. With ``watch``
    (a :class:`~.nodes.NodeWatch`) the wait checks the nodes, so a lost node ends it."""
    ray = ray_module()
    if watch is not None:
        while not ray.wait([ref], num_returns=1, timeout=nodes.CHECK_S)[0]:
            watch.check()
    try:
        return ray.get(ref)
    except Exception as err:
        raise TaskFailed(what, task_message(err)) from err


def as_completed(refs: dict[Any, Any], timeout: float | None = None, on_wait: Callable[[], None] | None = None,
                 resume: str = RESUME) -> Iterator[tuple[Any, Any, str | None]]:
    """``(ref, value, None)`` or ``(ref, None, one-line error)`` for each of ``refs`` as it
    finishes (every value fetched with ``ray.get``); ``on_wait`` runs every ``timeout`` seconds
    while none has. A node lost meanwhile raises :class:`~.nodes.NodeLost` ending in
    ``resume``. Refs unfinished when the caller stops early are left to end with the job:
    Ray 2.x aborts the driver when a cancelled task's reply is already on its way ("Check
    failed: Tried to complete task that was not pending", seen on a sweep stopped by a lost
    node), and a run that must stop in one line cannot risk that; the command exits right after."""
    ray = ray_module()
    pending = list(refs)
    watch = nodes.NodeWatch(ray, resume)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1, timeout=_tick(timeout))
        watch.due()
        if not ready:
            if on_wait is not None:
                on_wait()
            continue
        try:
            yield ready[0], ray.get(ready[0]), None
        except Exception as err:
            yield ready[0], None, task_message(err)


def bounded(submit: Callable[[Any], Any], jobs: Iterable[Any], workers: int, timeout: float | None = None,
            on_wait: Callable[[], None] | None = None, resume: str = RESUME) -> Iterator[tuple[Any, Any, str | None]]:
    """Each job's ``(job, value, error)`` as it finishes, with at most ``workers`` submitted
    (``submit(job)`` returns an object ref) at a time: the ``--workers`` rule for tasks. A node
    lost meanwhile raises :class:`~.nodes.NodeLost` ending in ``resume``; what is running when
    the caller stops early is left to end with the job, as in :func:`as_completed`."""
    queue = list(jobs)
    running: dict[Any, Any] = {}
    ray = ray_module()
    watch = nodes.NodeWatch(ray, resume)
    while queue or running:
        while queue and len(running) < workers:
            job = queue.pop(0)
            running[submit(job)] = job
        ready, _ = ray.wait(list(running), num_returns=1, timeout=_tick(timeout))
        watch.due()
        if not ready:
            if on_wait is not None:
                on_wait()
            continue
        job = running.pop(ready[0])
        try:
            yield job, ray.get(ready[0]), None
        except Exception as err:
            yield job, None, task_message(err)


def _tick(timeout: float | None) -> float:
    """How long one ``ray.wait`` may wait: ``timeout``, never longer than the node check's period."""
    return nodes.CHECK_S if timeout is None else min(timeout, nodes.CHECK_S)


def cancel(refs: Iterable[Any], ray: Any = None) -> None:
    """Cancel actor calls that have not finished (early exit, KeyboardInterrupt) before their
    actors are killed; errors are ignored. Plain tasks are never cancelled (:func:`as_completed`
    says why)."""
    ray = ray or ray_module()
    for ref in refs:
        with contextlib.suppress(Exception):
            ray.cancel(ref)
