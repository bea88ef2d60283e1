"""The allocator's model beside the measurement, per live batch size (docs/load.md, "Predicted
beside measured").

An allocator that models the step (``goodput``) predicts, each step, its seconds (target
forward, drafting and building, the rest) and the tokens it emits. A cell keeps, per live
batch size, the sums of both over its steps (:func:`by_live`); the summary pools the rounds
(:func:`pooled_by_live`) and gives the means, where the two part is where the model is wrong.
``python -m specframe.experiments.load.prediction DIR`` prints the table again.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Sequence

from specframe.experiments.load.serve import Served

#: The summed quantities of a live size: measured, and predicted over the steps with a prediction.
MEASURED = ("time", "forward", "build", "tokens")
PREDICTED = ("step_time", "target_time", "build_time", "overhead_time", "tokens")


def by_live(served: Served) -> list[dict]:
    """Per live batch size, sorted: ``steps``, the measured sums (``time``, ``forward``,
    ``build`` seconds, ``tokens``), ``predicted_steps`` and the predicted sums
    (``predicted_step_time``, ``predicted_target_time``, ``predicted_build_time``,
    ``predicted_overhead_time``, ``predicted_tokens``) over the steps the allocator predicted."""
    groups: dict[int, dict] = {}
    columns = zip(served.step_live, served.step_times, served.step_forward, served.step_build,
                  served.step_tokens, served.step_predicted)
    for live, spent, forward, build, tokens, predicted in columns:
        g = groups.setdefault(live, {"live": live, "steps": 0, **{k: 0.0 for k in MEASURED}, "predicted_steps": 0,
                                     **{f"predicted_{k}": 0.0 for k in PREDICTED}})
        g["steps"] += 1
        for key, value in zip(MEASURED, (spent, forward, build, tokens)):
            g[key] += value
        if predicted is not None:
            g["predicted_steps"] += 1
            whole = predicted["target_time"] + predicted["build_time"] + predicted["overhead_time"]
            for key in PREDICTED:
                g[f"predicted_{key}"] += whole if key == "step_time" else predicted[key]
    return [groups[live] for live in sorted(groups)]


def pooled_by_live(rounds: Sequence[dict]) -> list[dict]:
    """The rounds' :func:`by_live` sums added up per live size, as means: ``steps``,
    ``predicted_steps`` and, in ms and tokens per step, ``measured_ms``, ``measured_forward_ms``,
    ``measured_build_ms``, ``measured_tokens``, ``measured_rest_ms`` (the step less its forward
    and build) beside ``predicted_ms``, ``predicted_forward_ms``,
    ``predicted_build_ms``, ``predicted_overhead_ms``, ``predicted_tokens`` (None without
    predictions). Rounds stored before the cells kept it add nothing."""
    sums: dict[int, dict] = {}
    for rnd in rounds:
        for row in rnd.get("by_live") or []:
            into = sums.setdefault(row["live"], dict.fromkeys(row, 0))
            for key, value in row.items():
                into[key] = value if key == "live" else into[key] + value
    out = []
    for live in sorted(sums):
        s, n, p = sums[live], sums[live]["steps"], sums[live]["predicted_steps"]
        row = {"live": live, "steps": n, "predicted_steps": p,
               "measured_ms": 1e3 * s["time"] / n, "measured_forward_ms": 1e3 * s["forward"] / n,
               "measured_build_ms": 1e3 * s["build"] / n, "measured_tokens": s["tokens"] / n,
               "measured_rest_ms": 1e3 * (s["time"] - s["forward"] - s["build"]) / n}
        for key, name in (("step_time", "ms"), ("target_time", "forward_ms"), ("build_time", "build_ms"),
                          ("overhead_time", "overhead_ms"), ("tokens", "tokens")):
            scale = 1.0 if key == "tokens" else 1e3
            row[f"predicted_{name}"] = scale * s[f"predicted_{key}"] / p if p else None
        out.append(row)
    return out


COLUMNS = (("live", "live", "{}"), ("steps", "steps", "{}"),
           ("predicted_ms", "step ms predicted", "{:.2f}"), ("measured_ms", "measured", "{:.2f}"),
           ("predicted_forward_ms", "forward ms predicted", "{:.2f}"), ("measured_forward_ms", "measured", "{:.2f}"),
           ("predicted_build_ms", "build ms predicted", "{:.2f}"), ("measured_build_ms", "measured", "{:.2f}"),
           ("predicted_overhead_ms", "rest ms predicted", "{:.2f}"), ("measured_rest_ms", "measured", "{:.2f}"),
           ("predicted_tokens", "tokens/step predicted", "{:.2f}"), ("measured_tokens", "measured", "{:.2f}"))


def prediction_table(summary: dict, predicted_only: bool = True) -> str:
    """Markdown: per (rate, arm) and live batch size, the predicted step time, forward, build,
    rest and tokens per step beside the measured ones; ``predicted_only``: only the arms whose
    allocator predicts (else every arm, its measured side alone). Empty when there is none."""
    order = {arm: i for i, arm in enumerate(summary.get("arms", []))}
    cells = sorted(summary["cells"], key=lambda c: (c["rate"], order.get(c["arm"], len(order))))
    lines = []
    for c in cells:
        rows = c.get("by_live") or []
        if predicted_only and not any(r["predicted_steps"] for r in rows):
            continue
        for r in rows:
            values = [r.get(key) for key, _, _ in COLUMNS]
            lines.append(f"| {c['rate']:g} | {c['arm']} | " + " | ".join(
                "-" if v is None else form.format(v) for v, (_, _, form) in zip(values, COLUMNS)) + " |")
    if not lines:
        return ""
    head = "| rate (req/s) | arm | " + " | ".join(title for _, title, _ in COLUMNS) + " |"
    return "\n".join([head, "|" + "|".join("---" for _ in range(len(COLUMNS) + 2)) + "|", *lines]) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Print the predicted-beside-measured table of ``DIR/summary.json`` (every arm with ``--all``)."""
    args = sys.argv[1:] if argv is None else argv
    every = "--all" in args
    paths = [a for a in args if a != "--all"]
    if len(paths) != 1:
        print("usage: python -m specframe.experiments.load.prediction DIR [--all]", file=sys.stderr)
        return 2
    path = Path(paths[0])
    path = path / "summary.json" if path.is_dir() else path
    print(prediction_table(json.loads(path.read_text(encoding="utf-8")), predicted_only=not every), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
