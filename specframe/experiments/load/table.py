"""The markdown table of a load run's summary.json (docs/load.md, docs/results.md):
``python -m specframe.experiments.load.table DIR`` prints it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

COLUMNS = (("rate", "rate (req/s)", "{:g}"), ("arm", "arm", "{}"), ("throughput", "tok/s", "{:.1f}"),
           ("request_throughput", "req/s", "{:.2f}"), ("ttft_p50", "TTFT p50 (s)", "{:.2f}"),
           ("tpot_mean", "TPOT mean (ms)", "ms"), ("tpot_p99", "TPOT p99 (ms)", "ms"),
           ("latency_p50", "latency p50 (s)", "{:.2f}"), ("latency_p99", "latency p99 (s)", "{:.2f}"),
           ("goodput", "goodput (tok/s)", "{:.1f}"), ("live_batch_mean", "live batch", "{:.1f}"),
           ("speculated", "speculating", "{:.0%}"), ("mismatches", "mismatches", "mismatches"))


def _cell(value: object, form: str, cell: dict) -> str:
    if value is None:
        return "-"
    if form == "mismatches":
        ties = cell.get("near_ties") or 0
        return f"{value}" + (f" ({ties} near-tie{'s' if ties > 1 else ''})" if ties else "")
    if form == "ms":
        return f"{1000 * float(value):.1f}"
    return form.format(value)


def markdown_table(summary: dict) -> str:
    """One row per (rate, arm), rates ascending, arms in the file's order."""
    order = {arm: i for i, arm in enumerate(summary.get("arms", []))}
    cells = sorted(summary["cells"], key=lambda c: (c["rate"], order.get(c["arm"], len(order))))
    lines = ["| " + " | ".join(title for _, title, _ in COLUMNS) + " |",
             "|" + "|".join("---" for _ in COLUMNS) + "|"]
    for c in cells:
        lines.append("| " + " | ".join(_cell(c.get(key), form, c) for key, _, form in COLUMNS) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Print the table of ``DIR/summary.json`` (or of a summary.json path)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m specframe.experiments.load.table DIR", file=sys.stderr)
        return 2
    path = Path(args[0])
    path = path / "summary.json" if path.is_dir() else path
    print(markdown_table(json.loads(path.read_text(encoding="utf-8"))), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
