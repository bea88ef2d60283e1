"""The leaderboard as Spec-Bench's Leaderboard.md lays it out, and the equality check in words."""

from __future__ import annotations

from specframe.experiments.spec_bench.tasks import TASKS

#: The columns after the method's name, as the leaderboard orders them.
COLUMNS: tuple[str, ...] = tuple(label for _, label in TASKS) + ("#MAT", "Overall")


def _times(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _mat(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def rows(summary: dict) -> list[list[str]]:
    """The table's cells: one row per arm in the summary's order (by Overall)."""
    out = []
    for arm in summary["arms"]:
        cells = [_times(arm["tasks"].get(key, {}).get("speedup")) for key, _ in TASKS]
        out.append([arm["arm"], *cells, _mat(arm["mean_accepted_tokens"]), _times(arm["speedup"])])
    return out


def markdown_table(summary: dict) -> str:
    """The leaderboard as a markdown table: Method, the six tasks, #MAT, Overall."""
    header = ["Method", *COLUMNS]
    lines = ["| " + " | ".join(header) + " |", "|---|" + "|".join(":---:" for _ in COLUMNS) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows(summary)]
    return "\n".join(lines)


def equality_lines(summary: dict) -> list[str]:
    """What the token-for-token check against the baseline found: one line when every arm
    matches, else one line per arm with mismatches, by task."""
    base = summary["baseline"]
    checked = [a for a in summary["arms"] if a["arm"] != base]
    bad = [a for a in checked if a["mismatches"]]
    if not bad:
        counts = ", ".join(f"{a['arm']}: {a['compared']}" for a in checked) or "no other arm"
        return [f"Every arm's answers equal {base}'s token for token (answers compared: {counts})."]
    lines = []
    for arm in bad:
        tasks = ", ".join(f"{key} {cell['mismatches']}/{cell['compared']}" for key, cell in arm["tasks"].items()
                          if cell["mismatches"])
        kind = "" if arm["greedy"] else " (a sampling arm: its answers may differ by design)"
        lines.append(f"{arm['arm']}: {arm['mismatches']} of {arm['compared']} answers differ from {base}'s "
                     f"({tasks}){kind}")
    equal = [a["arm"] for a in checked if not a["mismatches"]]
    if equal:
        lines.append(f"Every other arm's answers equal {base}'s token for token: {', '.join(equal)}.")
    return lines
