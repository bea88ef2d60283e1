"""Acceptance by depth and rank, measured from recorded steps: Sequoia's acceptance vector.

Sequoia (arXiv 2402.12374) shapes its tree from a[k], the probability that the k-th ranked child
of a node on the accepted path is the accepted one. Here it is counted from answer records
(``steps.accepted_ranks``, ``steps.depth`` and ``steps.accepted_children``, one entry per step):

- ``reached[d]``: steps whose tree went at least d deep and whose accepted path reached depth
  d - 1 at a node with children, i.e. the steps that put a node at depth d to the test (a path
  that ended at a leaf while the tree went deeper elsewhere tested nothing below it: no miss);
- ``hits[d][k]``: those steps whose accepted node at depth d has rank k;
- ``by_depth[d][k] = hits[d][k] / reached[d]`` and, pooled over depths (what Sequoia's DP
  takes, since its a[k] does not depend on depth), ``by_rank[k] = sum_d hits[d][k] / sum_d reached[d]``.

A step can test a rank only if its tree had a child of that rank: the *probe* measurement
(:func:`specframe.commands.probe.probe_acceptance`) drafts a full tree of ``width`` children
per node to ``depth`` over a recorded trace, so every rank below ``width`` is tested at every
reached node. Counted from an ordinary run's steps, a rank the arm's policy rarely drafted is
under-counted (a chain arm measures rank 0 only); the file says which of the two it holds.
Records written before steps kept ``accepted_children`` cannot tell a leaf from a miss: their
steps count every stop short of the tree's depth as a miss, as they always did, and
``unmarked_leaves`` says how many steps were counted so (:func:`basis` words it).

The file (``specframe acceptance ... --out acceptance.json``) is what the ``sequoia`` policy's
``acceptance`` option reads (its ``by_rank`` list), and :func:`fit_static_tree` turns it into
the static tree that maximises the expected accepted length under a node budget.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable

#: Version of the acceptance file's layout.
FORMAT = 1
#: How the steps were drafted: a full probe tree over a trace, or an arm's own trees.
METHODS = ("probe", "recorded")


class AcceptanceError(ValueError):
    """Steps or a file that hold no acceptance measurement; the message names why."""


@dataclass
class Acceptance:
    """Counts of accepted ranks by depth, and the rates they give (see the module docstring).

    Attributes:
        method: ``probe`` (a full ``width``-ary tree over a trace) or ``recorded`` (an arm's steps).
        arm: the arm whose drafter was measured.
        source: the run directory or trace the steps came from.
        width: ranks counted per node (the probe's children per node; for recorded steps the
            largest rank seen + 1).
        steps: steps counted.
        reached: ``reached[d-1]`` = steps that tested a node at depth d.
        hits: ``hits[d-1][k]`` = steps whose accepted node at depth d has rank k.
        provenance: when and where it was measured (date, machine, commit, command).
        unmarked_leaves: steps recorded without ``accepted_children`` (records older than the
            column): where their accepted path ended at a leaf, the next depth counts a miss.
    """

    method: str
    arm: str
    source: str
    width: int
    steps: int
    reached: list[int]
    hits: list[list[int]]
    provenance: dict = field(default_factory=dict)
    unmarked_leaves: int = 0

    @property
    def by_depth(self) -> list[list[float]]:
        """``by_depth[d-1][k]``: share of the steps that tested depth d accepting its rank-k child."""
        return [[h / r if r else 0.0 for h in row] for row, r in zip(self.hits, self.reached)]

    @property
    def by_rank(self) -> list[float]:
        """Sequoia's positional vector a[k], pooled over depths (sums to at most 1)."""
        tested = sum(self.reached)
        if not tested:
            return [0.0] * self.width
        return [sum(row[k] for row in self.hits) / tested for k in range(self.width)]

    def to_dict(self) -> dict:
        """The JSON object written by ``specframe acceptance`` (counts and the rates they give)."""
        return {"format": FORMAT, **asdict(self), "by_depth": self.by_depth, "by_rank": self.by_rank}

    def save(self, path: str | Path, extra: dict | None = None) -> Path:
        """Write the file (``extra`` keys, e.g. a fitted tree, ride along)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**self.to_dict(), **(extra or {})}, indent=1) + "\n", encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Acceptance":
        """Read a file written by :meth:`save`; a missing or foreign file is refused by name."""
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as err:
            raise AcceptanceError(f"acceptance file {str(path)!r} cannot be read: {err}") from err
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise AcceptanceError(f"{path} is not an acceptance file of format {FORMAT} (written by `specframe acceptance`)")
        names = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in names})


def count_steps(step_columns: Iterable[dict], width: int | None = None) -> tuple[int, list[int], list[list[int]]]:
    """``(steps, reached, hits)`` over answer records' ``steps`` columns (``depth``,
    ``accepted_ranks`` and, where recorded, ``accepted_children``).

    ``width`` fixes the ranks counted (larger ranks are dropped); None keeps every rank seen.
    Unknown ranks (-1, a drafter that does not rank) end the path there: what they hide is not
    counted as a miss. Nor is the depth below a path that ended at a leaf (``accepted_children``
    0); a step without the column (-1, or a record older than it) counts it as a miss.
    """
    paths = _step_paths(step_columns)
    if not paths:
        raise AcceptanceError("no recorded steps: the records hold no 'steps' (a baseline arm, or an empty run)")
    max_depth = max(d for d, _, _ in paths)
    seen = max((k for _, r, _ in paths for k in r), default=0) + 1
    width = int(width or seen)
    reached = [0] * max_depth
    hits = [[0] * width for _ in range(max_depth)]
    for depth, ranks, children in paths:
        for d in range(depth):  # the node tested at depth d + 1
            if d > len(ranks) or (d == len(ranks) and children == 0):
                break  # past the path, or below a leaf: nothing was tested there
            reached[d] += 1
            if d == len(ranks):
                break  # nothing accepted here: a miss for every rank
            if ranks[d] < 0:
                reached[d] -= 1  # an unranked node: neither hit nor miss
                break
            if ranks[d] < width:
                hits[d][ranks[d]] += 1
    # Drop trailing depths no step tested (a depth the trees had but no path reached).
    while len(reached) > 1 and reached[-1] == 0:
        reached.pop()
        hits.pop()
    return len(paths), reached, hits


def _step_paths(step_columns: Iterable[dict]) -> list[tuple[int, list[int], int]]:
    """``(tree depth, accepted ranks, children of the last accepted node)`` per step; the
    children are -1 (unknown) where the records have no ``accepted_children`` column."""
    paths: list[tuple[int, list[int], int]] = []
    for cols in step_columns:
        depths = cols.get("depth", [])
        ranks = cols.get("accepted_ranks", [])
        children = cols.get("accepted_children") or [-1] * len(depths)
        paths.extend((int(d), [int(k) for k in r], int(c)) for d, r, c in zip(depths, ranks, children))
    return paths


def unmarked_leaves(step_columns: Iterable[dict]) -> int:
    """Steps without a known ``accepted_children`` (records written before the column)."""
    return sum(1 for _, _, c in _step_paths(step_columns) if c < 0)


def from_records(records: list[dict], arm: str, source: str, method: str = "recorded",
                 width: int | None = None, provenance: dict | None = None) -> Acceptance:
    """The acceptance of ``records`` (one arm's answer records)."""
    if method not in METHODS:
        raise AcceptanceError(f"method {method!r} is not one of {', '.join(METHODS)}")
    columns = [r.get("steps", {}) for r in records]
    steps, reached, hits = count_steps(columns, width)
    return Acceptance(method=method, arm=arm, source=source, width=len(hits[0]), steps=steps,
                      reached=reached, hits=hits, provenance=dict(provenance or {}),
                      unmarked_leaves=unmarked_leaves(columns))


def basis(acc: Acceptance) -> str:
    """What the counts rest on, in words: the probe's full trees, or an arm's own recorded
    trees (and how many of those steps could not tell a leaf from a miss)."""
    if acc.method == "probe":
        return f"probe, {acc.steps} steps"
    text = (f"counted from {acc.steps} recorded steps of the arm's own trees, where a rank its policy "
            "rarely drafted is under-counted")
    if acc.unmarked_leaves:
        text += (f"; {acc.unmarked_leaves} of them were recorded without accepted_children, so an accepted "
                 "path that ended at a leaf counts a miss at the next depth there (a[0] reads low)")
    return text


def provenance(command: str) -> dict:
    """Date (UTC), machine (CPU model and cores), specframe commit and the command that measured."""
    from specframe.models.cache_keys import cpu_name

    cpu = cpu_name()
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).resolve().parent, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": f"{cpu}, {os.cpu_count()} cores",
            "commit": commit, "command": command}


def fit_static_tree(acceptance: Acceptance | list[float], budget: int, max_depth: int = 12) -> tuple[tuple[int, ...], ...]:
    """Rank paths of the static tree of ``budget`` nodes (root included) and depth <= ``max_depth``
    that maximises the expected accepted length under ``acceptance`` (Sequoia's DP).

    The DP is the ``sequoia`` policy's own (found through the plugin registry, as every
    built-in is): the fitted tree is exactly what ``policy = "sequoia"`` with this vector,
    budget and max_depth drafts.
    """
    from specframe.plugins import get_registry

    vector = acceptance.by_rank if isinstance(acceptance, Acceptance) else list(acceptance)
    cls = get_registry().get("policies", "sequoia")
    policy = cls(cls.Options(budget=int(budget), acceptance=vector, max_depth=int(max_depth)))
    return tuple(tuple(p) for p in policy.shape())


def full_tree(width: int, depth: int) -> list[list[int]]:
    """Every rank path with ranks below ``width`` up to ``depth`` (the probe tree), in (length, path) order."""
    if width < 1 or depth < 1:
        raise AcceptanceError(f"the probe tree needs width >= 1 and depth >= 1, got width {width}, depth {depth}")
    level: list[list[int]] = [[]]
    out: list[list[int]] = []
    for _ in range(depth):
        level = [p + [k] for p in level for k in range(width)]
        out.extend(level)
    return out


def expected_length(paths: Iterable[tuple[int, ...]], acceptance: list[float]) -> float:
    """Expected tokens per step (bonus included) of a rank-path tree under a positional vector:
    1 + sum over nodes of the product of a[rank] along its path (Sequoia's objective)."""
    total = 1.0
    for path in paths:
        p = 1.0
        for k in path:
            p *= acceptance[k] if k < len(acceptance) else 0.0
        total += p
    return total


def describe(acc: Acceptance, ranks: int = 6) -> str:
    """Lines for the terminal: steps, the pooled vector and the first depths."""
    fmt = lambda row: " ".join(f"{x:.3f}" for x in row[:ranks])  # noqa: E731
    lines = [f"{acc.method} acceptance of {acc.arm} over {acc.source}: {acc.steps} steps, width {acc.width}",
             f"by rank (Sequoia's a[k]): {fmt(acc.by_rank)}"]
    if acc.unmarked_leaves:
        lines.insert(1, f"{acc.unmarked_leaves} steps predate accepted_children: a path that ended at a leaf "
                        "counts a miss at the next depth there (a[0] reads low)")
    for d, (row, r) in enumerate(zip(acc.by_depth, acc.reached), start=1):
        lines.append(f"depth {d} ({r} tested): {fmt(row)}")
    return "\n".join(lines)
