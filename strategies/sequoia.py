"""Policy ``sequoia``: the DP-optimal static tree for a positional acceptance vector (arXiv 2402.12374).

Given a[k] = probability that the k-th ranked child is the accepted one, a dynamic programme
finds the tree of m nodes (root included) and depth <= l that maximises the expected number of
tokens per step (root/bonus included):

    T[1][l][0] = 1
    T[m][l][b] = max_(1<=y<m) T[y][l][b-1] + a[b] * max_b' T[m-y][l-1][b']     (b >= 1)

(b = 1 reduces to 1 + a[1] * max_b' T[m-1][l-1][b']). With measured draft and target step
times the size and depth are chosen to minimise time per token,
(d * t_draft + t_target(m)) / max_b T[m][d][b]; the shape is then fixed and drafted like the
``static`` policy.

The vector a is measured, never assumed: ``specframe acceptance`` counts it for a model pair on
a workload (docs/policies.md#sequoia) and writes the file the ``acceptance`` option reads; the
default is the vector measured that way for the shipped SmolLM2-135M-Instruct EAGLE-3 pair.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from specframe.building import RankPath, build_from_rank_paths
from specframe.interfaces import DraftSession, TreePolicy
from specframe.options import BudgetOptions, OptionError, require
from specframe.search_space import tunable
from specframe.tree import DraftTree

#: Acceptance vectors measured with ``specframe acceptance`` (a probe tree replayed over a
#: recorded trace; docs/policies.md#sequoia), by the name the ``acceptance`` option takes.
MEASURED: dict[str, tuple[float, ...]] = {
    # SmolLM2-135M-Instruct (float32) with its shipped EAGLE-3 head, greedy, on the first 8
    # prompts of examples/prompts/chat.jsonl (64 new tokens each, chat template): a probe of
    # 8 ranks x 3 depths, 207 steps (207/123/65 tested at depths 1/2/3). Measured 2026-12-06 on
    # an Intel Xeon, 2 cores, at commit 2cccb69 with `specframe record
    # examples/smollm2-serving.toml --out TRACE` then `specframe acceptance
    # examples/smollm2-serving.toml --arm eagle3+chain --trace TRACE --width 8 --depth 3`.
    "smollm2-135m-eagle3": (0.2861, 0.0937, 0.0405, 0.0506, 0.0354, 0.0152, 0.0253, 0.0152),
}
#: The vector a ``sequoia`` arm uses when it names none.
DEFAULT_ACCEPTANCE = "smollm2-135m-eagle3"


def read_acceptance(value: str) -> tuple[float, ...]:
    """The vector ``value`` names: a :data:`MEASURED` name, or an acceptance file's ``by_rank``
    (``specframe acceptance --out FILE``; a JSON list of numbers is read as the vector itself)."""
    if value in MEASURED:
        return MEASURED[value]
    path = Path(value)
    require(path.is_file(), "acceptance",
            f"names neither a measured vector ({', '.join(sorted(MEASURED))}) nor an acceptance file: "
            f"{value!r} (write one with `specframe acceptance RUN_DIR|CONFIG --arm NAME --out FILE`)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise OptionError(f"option 'acceptance': file {value!r} is not JSON: {err}") from err
    vector = data.get("by_rank") if isinstance(data, dict) else data
    require(isinstance(vector, list), "acceptance",
            f"file {value!r} holds no 'by_rank' list (an acceptance file of `specframe acceptance`)")
    return tuple(vector)


@dataclass
class SequoiaOptions(BudgetOptions):
    """Options of the ``sequoia`` policy.

    Attributes:
        budget: largest tree size N (root included) the DP may choose.
        acceptance: positional acceptance vector a[1..B]: a[k] is how often the k-th ranked
            child of a node is the accepted one (entries in [0, 1], sum <= 1). A node gets at
            most B children. A list, the path of an acceptance file (``specframe acceptance
            --out FILE``: its measured ``by_rank``), or the name of a vector in :data:`MEASURED`
            (default: SmolLM2-135M-Instruct with its EAGLE-3 head). The resolved vector is
            ``vector``.
        max_depth: largest tree depth the DP may choose (= draft forwards per step).
        draft_time: measured time of one draft forward (seconds, any unit shared with
            ``target_times``).
        target_times: measured target forward time for trees of 1, 2, ... nodes
            (``target_times[m-1]`` for m nodes). When given, size m <= min(N, len) and depth d
            minimise (d * draft_time + target_times[m-1]) / E[tokens]; when empty (default),
            the tree is the best of exactly N nodes and depth <= max_depth.
    """

    acceptance: tuple | str = DEFAULT_ACCEPTANCE
    max_depth: int = tunable(12, low=1, high=16)
    draft_time: float = 0.0
    target_times: tuple = field(default_factory=tuple)

    def __post_init__(self) -> None:
        super().__post_init__()
        a = read_acceptance(self.acceptance) if isinstance(self.acceptance, str) else tuple(self.acceptance)
        require(len(a) > 0 and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in a),
                "acceptance", f"must be a non-empty list of numbers, got {self.acceptance!r}")
        require(all(0.0 <= x <= 1.0 for x in a), "acceptance", f"entries must lie in [0, 1], got {list(a)}")
        require(sum(a) <= 1.0 + 1e-9, "acceptance", f"must sum to <= 1 (one child is accepted), sum is {sum(a)}")
        self.vector = tuple(float(x) for x in a)
        if not isinstance(self.acceptance, str):
            self.acceptance = self.vector
        require(self.max_depth >= 1, "max_depth", f"must be >= 1, got {self.max_depth}")
        require(self.draft_time >= 0.0, "draft_time", f"must be >= 0, got {self.draft_time}")
        t = tuple(self.target_times)
        require(all(isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 for x in t),
                "target_times", f"must be positive numbers (time for 1, 2, ... nodes), got {self.target_times!r}")
        self.target_times = tuple(float(x) for x in t)


@dataclass(frozen=True)
class SequoiaTable:
    """DP tables for m = 0..M nodes, depth l = 0..L, b = 0..B root children.

    ``value[m, l, b]`` = T[m][l][b] (-inf where impossible); ``split[m, l, b]`` = the y that
    attains it; ``best[m, l]`` = max_b T[m][l][b] and ``best_b[m, l]`` its argmax.
    """

    acceptance: tuple[float, ...]
    value: np.ndarray
    split: np.ndarray
    best: np.ndarray
    best_b: np.ndarray


@lru_cache(maxsize=32)
def sequoia_table(acceptance: tuple[float, ...], max_nodes: int, max_depth: int) -> SequoiaTable:
    """Solve the Sequoia DP up to ``max_nodes`` nodes and depth ``max_depth`` (vectorised over y, b)."""
    a = np.asarray(acceptance, dtype=np.float64)
    n_b = len(a)
    M, L = max_nodes, max_depth
    value = np.full((M + 1, L + 1, n_b + 1), -np.inf)
    split = np.zeros((M + 1, L + 1, n_b + 1), dtype=np.int64)
    value[1, :, 0] = 1.0
    best = value.max(axis=2)
    for l in range(1, L + 1):
        for m in range(2, M + 1):
            y = np.arange(1, m)
            sub = best[m - y, l - 1]  # [y]: best subtree of the new last child
            # 0 * -inf would be NaN: an impossible subtree stays impossible.
            gain = np.where(np.isfinite(sub)[:, None], a[None, :] * np.where(np.isfinite(sub), sub, 0.0)[:, None], -np.inf)
            cand = value[y, l, :n_b] + gain  # [y, b] for b = 1..B
            arg = np.argmax(cand, axis=0)
            value[m, l, 1:] = cand[arg, np.arange(n_b)]
            split[m, l, 1:] = y[arg]
        best[:, l] = value[:, l, :].max(axis=1)
    return SequoiaTable(tuple(acceptance), value, split, best, value.argmax(axis=2))


def optimal_paths(table: SequoiaTable, m: int, depth: int) -> tuple[RankPath, ...]:
    """Rank paths (sorted by length, then path) of the optimal m-node tree of depth <= ``depth``."""
    out: list[RankPath] = []

    def subtree(prefix: RankPath, nodes: int, l: int) -> None:
        b = int(table.best_b[nodes, l])
        while b > 0:  # peel the b-th child off: it takes nodes - y nodes, depth <= l - 1
            y = int(table.split[nodes, l, b])
            child = prefix + (b - 1,)
            out.append(child)
            subtree(child, nodes - y, l - 1)
            nodes, b = y, b - 1

    subtree((), m, depth)
    return tuple(sorted(out, key=lambda p: (len(p), p)))


def choose_size_depth(table: SequoiaTable, max_nodes: int, max_depth: int,
                      draft_time: float, target_times: tuple[float, ...]) -> tuple[int, int]:
    """(m, d) minimising (d * draft_time + target_times[m-1]) / best[m, d] over feasible pairs."""
    sizes = np.arange(1, min(max_nodes, len(target_times)) + 1)
    depths = np.arange(0, max_depth + 1)
    expected = table.best[sizes[:, None], depths[None, :]]
    cost = depths[None, :] * draft_time + np.asarray(target_times)[sizes - 1][:, None]
    per_token = np.where(np.isfinite(expected), cost / np.where(np.isfinite(expected), expected, 1.0), np.inf)
    i, j = np.unravel_index(np.argmin(per_token), per_token.shape)  # first minimum: smallest m, d
    return int(sizes[i]), int(depths[j])


class SequoiaPolicy(TreePolicy):
    """A fixed tree shaped by Sequoia's DP (optionally hardware-aware), drafted level by level."""

    name = "sequoia"
    Options = SequoiaOptions

    def __init__(self, options: SequoiaOptions) -> None:
        super().__init__(options)
        self._paths: dict[int, tuple[RankPath, ...]] = {}

    def shape(self, budget: int | None = None) -> tuple[RankPath, ...]:
        """The rank paths drafted under ``budget`` (default and upper bound: the configured budget)."""
        n_max = min(int(budget or self.max_budget), self.max_budget)
        if n_max not in self._paths:
            o = self.options
            table = sequoia_table(o.vector, self.max_budget, o.max_depth)
            if o.target_times:
                m, d = choose_size_depth(table, n_max, o.max_depth, o.draft_time, o.target_times)
            else:  # the largest feasible size (B children and max_depth may cap it below N)
                d = o.max_depth
                m = max(m for m in range(1, n_max + 1) if np.isfinite(table.best[m, d]))
            self._paths[n_max] = optimal_paths(table, m, d)
        return self._paths[n_max]

    def fixed_shape(self) -> tuple[tuple[int, ...], ...]:
        """The DP-optimal shape at the configured budget, fixed before decoding."""
        return tuple(tuple(p) for p in self.shape())

    def build(self, session: DraftSession, budget: int) -> DraftTree:
        """Draft the DP-optimal shape with the drafter's ranked children."""
        return build_from_rank_paths(session, self.shape(budget), int(budget))
