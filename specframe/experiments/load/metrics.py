"""The figures of one cell, under plain names (the keys of ``summary.json``)."""

from __future__ import annotations

import math
from typing import Sequence

from specframe.experiments.load.serve import Served


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) of ``values``, interpolated linearly between order
    statistics (numpy's default); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    at = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(at), math.ceil(at)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (at - lo)


def request_rows(served: Served, reference: Sequence[Sequence[int]]) -> list[dict]:
    """Per request: its times (seconds), tokens, TTFT, TPOT, latency, queueing and whether its
    output differs from its own greedy decoding (``reference``)."""
    rows = []
    for i, tokens in enumerate(served.tokens):
        arrival, first, finish = served.arrivals[i], served.first_token[i], served.finish[i]
        rows.append({
            "arrival": arrival, "joined": served.joined[i], "first_token": first, "finish": finish,
            "tokens": len(tokens), "ttft": first - arrival, "latency": finish - arrival,
            "queue": served.joined[i] - arrival,
            "tpot": (finish - first) / (len(tokens) - 1) if len(tokens) > 1 else None,
            "mismatch": list(tokens) != list(reference[i]),
        })
    return rows


def live_batch_mean(step_at: Sequence[float], step_live: Sequence[int], joined: Sequence[float]) -> float:
    """The live batch size averaged over busy time: each step's live sequences weighted by its
    duration (the first step of a busy period counted from its batch's prefill)."""
    total = weighted = 0.0
    previous = None
    first_join = min(joined) if joined else 0.0
    for at, live in zip(step_at, step_live):
        begin = first_join if previous is None else previous
        span = max(at - begin, 0.0)
        total += span
        weighted += span * live
        previous = at
    return weighted / total if total > 0 else 0.0


def summarize(served: Served, reference: Sequence[Sequence[int]], slo_tpot_ms: float | None) -> dict:
    """The cell's figures: throughput (tokens/s), request_throughput (requests/s), ttft_*,
    tpot_*, latency_* (p50/p90/p99 and mean, seconds), goodput (tokens/s of the requests whose
    TPOT met ``slo_tpot_ms``; None without an SLO), live_batch_mean / _max, speculated (share of
    sequence-steps that verified more than their root) and mismatches."""
    rows = request_rows(served, reference)
    span = max(r["finish"] for r in rows) - min(r["arrival"] for r in rows)
    tokens = sum(r["tokens"] for r in rows)
    out: dict = {"requests": len(rows), "tokens": tokens, "duration": span,
                 "throughput": tokens / span if span > 0 else 0.0,
                 "request_throughput": len(rows) / span if span > 0 else 0.0}
    for name in ("ttft", "tpot", "latency", "queue"):
        values = [r[name] for r in rows if r[name] is not None]
        out[f"{name}_mean"] = sum(values) / len(values) if values else None
        for q in (50, 90, 99):
            out[f"{name}_p{q}"] = percentile(values, q)
    if slo_tpot_ms is None:
        out["goodput"] = None
    else:
        met = [r for r in rows if r["tpot"] is not None and r["tpot"] * 1000.0 <= slo_tpot_ms]
        out["goodput"] = sum(r["tokens"] for r in met) / span if span > 0 else 0.0
        out["slo_met"] = len(met) / len(rows)
    out["live_batch_mean"] = live_batch_mean(served.step_at, served.step_live, served.joined)
    out["live_batch_max"] = max(served.step_live, default=0)
    out["speculated"] = served.speculated / served.row_steps if served.row_steps else 0.0
    out["mismatches"] = sum(1 for r in rows if r["mismatch"])
    return out
