"""What a replayed sweep costs against running it live: overall and per budget, per drafter.

Replays every configuration of a sweep file over a trace (recorded first unless --trace names
one), runs --sample configurations per drafter live (spread over the budgets), and extrapolates
the live cost of the others from the sampled ones (linear in the budget). Costs are generation
seconds summed over the prompts (model loads excluded on both sides); the sweep's whole wall
time, loads and processes included, is printed beside them.

    python benchmarks/replay_sweep_cost.py --sweep examples/smollm2-sweep.toml --trace runs/smollm2-trace \\
        --sample 3 --workers 2 --out runs/replay-cost
    python benchmarks/replay_sweep_cost.py --sweep SMALL.toml --limit 2 --max-new-tokens 16 --sample 2 --out /tmp/rc
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections import defaultdict
from pathlib import Path

from specframe.experiments.experiment import run_experiment
from specframe.replay import record_trace
from specframe.replay.sweep import load_sweep, run_sweep


def _override(sweep, args):
    base = sweep.base
    if args.limit:
        base = dataclasses.replace(base, data=dataclasses.replace(base.data, limit=args.limit))
    if args.max_new_tokens:
        base = dataclasses.replace(base, max_new_tokens=args.max_new_tokens)
    return dataclasses.replace(sweep, base=base)


def _budget(arm) -> int:
    return int(arm.policy.options.get("budget", 0) or 0)


def _sampled(configs: list, k: int) -> list:
    """``k`` configurations spread evenly over the budgets (smallest and largest included)."""
    ordered = sorted(configs, key=_budget)
    if k >= len(ordered):
        return ordered
    idx = sorted({round(i * (len(ordered) - 1) / max(k - 1, 1)) for i in range(k)})
    return [ordered[i] for i in idx]


def _live_seconds(run_dir: Path, names: list[str]) -> dict[str, float]:
    from specframe.experiments.runs import RunDir, read_answers
    from specframe.experiments.runs.layout import slugify

    out = {}
    for name in names:
        records = read_answers(RunDir(run_dir).path / "answers" / f"{slugify(name)}.jsonl")
        out[name] = sum(sum(r["choices"][0]["wall_time"]) for r in records)
    return out


def _line(points: list[tuple[int, float]], x: int) -> float:
    """Least-squares line through ``points`` at ``x`` (a constant for one point)."""
    if len(points) == 1:
        return points[0][1]
    mx = sum(p[0] for p in points) / len(points)
    my = sum(p[1] for p in points) / len(points)
    var = sum((p[0] - mx) ** 2 for p in points)
    slope = sum((p[0] - mx) * (p[1] - my) for p in points) / var if var else 0.0
    return my + slope * (x - mx)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", type=Path, required=True)
    parser.add_argument("--trace", type=Path, default=None)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sample", type=int, default=3, help="Live configurations per drafter.")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--max-new-tokens", type=int, default=None)
    args = parser.parse_args()
    sweep = _override(load_sweep(args.sweep), args)
    trace = args.trace or args.out / "trace"
    if not (trace / "trace.json").exists():
        start = time.perf_counter()
        record_trace(sweep.base, trace, progress=False)
        print(f"record: {time.perf_counter() - start:.1f} s")
    start = time.perf_counter()
    rows = run_sweep(sweep, trace, args.out / "sweep", workers=args.workers)
    sweep_wall = time.perf_counter() - start
    print(f"replayed {len(rows)} configurations in {sweep_wall:.1f} s wall ({args.workers} worker(s), loads included)")
    by_drafter: dict[str, list] = defaultdict(list)
    for arm in sweep.configs:
        by_drafter[arm.drafter.name].append(arm)
    sample = [a for arms in by_drafter.values() for a in _sampled(arms, args.sample)]
    start = time.perf_counter()
    run_experiment(dataclasses.replace(sweep.base, arms=sample), args.out / "live", progress=False)
    print(f"live sample: {len(sample)} configurations in {time.perf_counter() - start:.1f} s")
    live = _live_seconds(args.out / "live", [a.name for a in sample])
    failed = [r["name"] for r in rows if r.get("failed")]
    if failed:
        print(f"left out, failed: {', '.join(failed)}")
    replay = {r["name"]: r["replay_seconds"] for r in rows if not r.get("failed")}
    for drafter, arms in by_drafter.items():
        points = [(_budget(a), live[a.name]) for a in arms if a.name in live]
        per_budget: dict[int, list] = defaultdict(list)
        for a in arms:
            if a.name in replay:
                per_budget[_budget(a)].append((replay[a.name], live.get(a.name, _line(points, _budget(a)))))
        total_r = sum(r for v in per_budget.values() for r, _ in v)
        total_l = sum(lv for v in per_budget.values() for _, lv in v)
        print(f"\n{drafter}: {len(arms)} configurations; live sampled at budgets {[p[0] for p in points]}: "
              + ", ".join(f"{s:.1f} s" for _, s in points))
        print("budget | configs | replay s/config | live s/config | replay / live")
        for b in sorted(per_budget):
            v = per_budget[b]
            r, lv = sum(x for x, _ in v) / len(v), sum(y for _, y in v) / len(v)
            print(f"{b} | {len(v)} | {r:.2f} | {lv:.2f} | 1/{lv / max(r, 1e-9):.1f}")
        print(f"overall: replay {total_r:.1f} s, live (extrapolated) {total_l:.1f} s, ratio 1/{total_l / max(total_r, 1e-9):.1f}")
    json.dump({"replay": replay, "live": live, "sweep_wall": sweep_wall},
              (args.out / "cost.json").open("w"), indent=1)


if __name__ == "__main__":
    main()
