"""Replay against live on one experiment: tau/delta per arm, projected vs measured speedup.

Records the trace (unless --trace names one), replays every arm, and compares with a live run
of the same file (--live names an existing run directory; otherwise it runs live here, which
for examples/smollm2.toml takes ~15 min on 2 cores). Prints one table and the acceptance checks:
exact arms reproduce tau and delta exactly, approximate ones within 1% in tau, the projected
speedup of each arm within 10% of the measured one; auto-sized arms' mean tree sizes live vs
replay (their trees see projected times in replay).

    python benchmarks/replay_vs_live.py --config examples/smollm2.toml --live runs/smollm2 --out runs/replay-bench
    python benchmarks/replay_vs_live.py --config examples/demo-tiny.toml --limit 3 --max-new-tokens 24 --out /tmp/rb
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from specframe.experiments.config import load_config
from specframe.experiments.experiment import run_experiment
from specframe.replay import Trace, record_trace, replay_experiment
from specframe.experiments.report import write_report


def _config(args: argparse.Namespace):
    config = load_config(args.config)
    if args.limit:
        config = dataclasses.replace(config, data=dataclasses.replace(config.data, limit=args.limit))
    if args.max_new_tokens:
        config = dataclasses.replace(config, max_new_tokens=args.max_new_tokens)
    return config


def _timed(label: str, fn):
    start = time.perf_counter()
    out = fn()
    print(f"{label}: {time.perf_counter() - start:.1f} s", flush=True)
    return out


def _arms(run_dir: Path) -> dict:
    return {a["name"]: a for a in write_report(run_dir, plots=False)["arms"]}


def _pct(a: float | None, b: float | None) -> str:
    return "-" if not a or b is None else f"{100 * (b - a) / a:+.2f}%"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--live", type=Path, default=None, help="An existing live run directory of the config.")
    parser.add_argument("--trace", type=Path, default=None, help="An existing trace (default: record into OUT/trace).")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--limit", type=int, default=None, help="Prompts (smoke runs).")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="(smoke runs)")
    args = parser.parse_args()
    config = _config(args)
    trace_dir = args.trace or args.out / "trace"
    if not (trace_dir / "trace.json").exists():
        _timed("record", lambda: record_trace(config, trace_dir, progress=False))
    live_dir = args.live or args.out / "live"
    if args.live is None:
        _timed("live run", lambda: run_experiment(config, live_dir, progress=False))
    replay_dir = args.out / "replay"
    _timed("replay", lambda: replay_experiment(config, trace_dir, replay_dir, fresh=True, progress=False))
    live, replay = _arms(live_dir), _arms(replay_dir)
    meta = json.loads((replay_dir / "run.json").read_text())["replay"]
    print(f"trace {trace_dir} ({Trace.load(trace_dir).environment['curve_key']}); {meta['projection']}")
    header = ("arm", "replay", "tau live", "tau replay", "d tau", "delta live", "delta replay",
              "speedup live", "speedup projected", "d speedup", "tree live", "tree replay")
    print(" | ".join(header))
    failures = []
    for name, r in replay.items():
        if name not in live:
            continue
        l, lo, ro = live[name], live[name]["overall"], r["overall"]
        kind = r.get("replay", "?")
        sizes = (l["shapes"] or {}).get("mean_tree_size"), (r["shapes"] or {}).get("mean_tree_size")
        print(" | ".join([name, str(kind), f"{lo['tau']:.4f}", f"{ro['tau']:.4f}", _pct(lo["tau"], ro["tau"]),
                          f"{lo['delta']:.4f}", f"{ro['delta']:.4f}", f"{lo['speedup'] or 0:.3f}",
                          f"{ro['speedup'] or 0:.3f}", _pct(lo["speedup"], ro["speedup"]),
                          "-" if sizes[0] is None else f"{sizes[0]:.2f}", "-" if sizes[1] is None else f"{sizes[1]:.2f}"]))
        auto = "auto" in json.dumps(l.get("description", {}))
        if kind == "exact" and not auto and (ro["tau"] != lo["tau"] or ro["delta"] != lo["delta"]):
            failures.append(f"{name}: exact arm's tau/delta differ")
        if kind == "approximate" and not auto and abs(ro["tau"] - lo["tau"]) > 0.01 * lo["tau"]:
            failures.append(f"{name}: tau off by more than 1%")
        if lo["speedup"] and ro["speedup"] and abs(ro["speedup"] - lo["speedup"]) > 0.10 * lo["speedup"]:
            failures.append(f"{name}: projected speedup off by more than 10%")
    print("checks: " + ("all pass" if not failures else "; ".join(failures)))
    print("replay seconds per arm: " + ", ".join(f"{k} {v:.2f}" for k, v in meta.get("replay_seconds", {}).items()))


if __name__ == "__main__":
    main()
