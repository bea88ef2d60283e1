"""The Ray nodes a job stands on, and the one line that ends the job when one of them is lost.

A node whose raylet dies (killed, out of memory, its machine gone) is marked dead by the
cluster some seconds later. What ran on it is lost, and a replacement worker or a retried task
may then wait for resources that no live node has, which Ray does not report as an error:
without a watch, the job would wait for ever. So every job on Ray (``run``, ``record``,
``sweep``, ``tune``) checks, at least every :data:`CHECK_S` seconds while it waits, whether a
node that was alive when it started is now marked dead, and stops with :class:`NodeLost`: one
line naming the node and saying how to resume (what the job already wrote is kept).

A node the autoscaler removed because it was idle held nothing of the job: it is not lost.
"""

from __future__ import annotations

import time
from typing import Any

from specframe.errors import ExperimentError

#: How often (seconds) a waiting job asks the cluster which nodes are alive.
CHECK_S = 2.0
#: Node death reasons that cannot have taken anything of a job with them (an idle node drained).
HARMLESS = ("AUTOSCALER_DRAIN_IDLE", 4)

clock = time.monotonic  # tests replace it


class NodeLost(ExperimentError):
    """A Ray node the job stood on was marked dead: the node, its address and how to resume."""

    def __init__(self, node_id: str, address: str, resume: str, reason: str = "") -> None:
        why = f" ({reason})" if reason else ""
        super().__init__(f"Ray node {node_id[:12]} at {address} was lost mid-job: the cluster marked it dead"
                         f"{why}. {resume}")
        self.node_id, self.address, self.resume, self.reason = node_id, address, resume, reason

    def __reduce__(self) -> tuple:
        return type(self), (self.node_id, self.address, self.resume, self.reason)


def node_table(ray: Any) -> list[dict]:
    """``ray.nodes()``: every node the cluster knows, alive or dead (tests replace it)."""
    return ray.nodes()


#: Ray's node death reasons (``NodeDeathInfo.Reason``, by name or number) in words.
REASONS = {"EXPECTED_TERMINATION": "stopped", 1: "stopped", "UNEXPECTED_TERMINATION": "its raylet died", 2:
           "its raylet died", "AUTOSCALER_DRAIN_PREEMPTED": "preempted", 3: "preempted"}


def _reason(node: dict) -> str:
    return REASONS.get(node.get("DeathReason"), "")


class NodeWatch:
    """The nodes alive when a job started (and those that join while it runs); :meth:`check`
    raises :class:`NodeLost` for the first of them the cluster has since marked dead.
    ``resume`` is the job's own advice (which of its results are kept, and the command)."""

    def __init__(self, ray: Any, resume: str) -> None:
        self.ray, self.resume = ray, resume
        self.known: dict[str, str] = {}
        self.checked = clock()
        self._look()

    def _look(self) -> list[dict]:
        nodes = node_table(self.ray)
        for node in nodes:
            if node.get("Alive"):
                self.known[node["NodeID"]] = str(node.get("NodeManagerAddress") or "an unknown address")
        return nodes

    def check(self) -> None:
        """Raise :class:`NodeLost` if a known node is now marked dead (and not idle-drained)."""
        self.checked = clock()
        for node in self._look():
            if node.get("Alive") or node["NodeID"] not in self.known or node.get("DeathReason") in HARMLESS:
                continue
            raise NodeLost(node["NodeID"], self.known[node["NodeID"]], self.resume, _reason(node))

    def due(self) -> None:
        """:meth:`check` when the last check is :data:`CHECK_S` old: a job that gets results
        notices a lost node too, whose other workers still answer."""
        if clock() - self.checked >= CHECK_S:
            self.check()
