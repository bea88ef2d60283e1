"""The figures of one cell, under plain names (the keys of ``summary.json``).

A (rate, arm) may be served in several rounds (``[load] rounds``); its figures pool the rounds:
every request's times in one sample for the percentiles, tokens and busy time summed for the
throughputs. One round's record (:func:`round_record`) is what a cell file keeps, so a resumed
run pools stored rounds with new ones.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from specframe.experiments.load.serve import Served
from specframe.experiments.metrics import NEAR_TIE


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) of ``values``, interpolated linearly between order
    statistics (numpy's default method); None for no values."""
    return float(np.percentile(values, q)) if len(values) else None


def request_rows(served: Served, reference: Sequence[Sequence[int]]) -> list[dict]:
    """Per request: its times (seconds), tokens and whether its output differs from its own
    greedy decoding (``reference``)."""
    return [{"arrival": served.arrivals[i], "joined": served.joined[i], "first_token": served.first_token[i],
             "finish": served.finish[i], "tokens": len(tokens), "mismatch": list(tokens) != list(reference[i])}
            for i, tokens in enumerate(served.tokens)]


def request_figures(row: dict) -> dict:
    """A request row's TTFT, TPOT (None for a one-token answer), latency and queueing (seconds)."""
    first, finish = row["first_token"], row["finish"]
    return {"ttft": first - row["arrival"], "latency": finish - row["arrival"], "queue": row["joined"] - row["arrival"],
            "tpot": (finish - first) / (row["tokens"] - 1) if row["tokens"] > 1 else None}


def live_batch_mean(step_times: Sequence[float], step_live: Sequence[int]) -> float:
    """The live batch size averaged over busy time: each step's live sequences weighted by its
    own duration (``step_times``). Not by the time since the previous step: after an idle gap
    the open-loop clock jumps to the next arrival, and that jump is no step's work."""
    total = sum(step_times)
    return sum(t * live for t, live in zip(step_times, step_live)) / total if total > 0 else 0.0


def round_record(served: Served, reference: Sequence[Sequence[int]]) -> dict:
    """What one round of a cell keeps: its request rows, its span (first arrival to last
    finish), the live batch (mean over busy time, max) and its sequence-steps (all, and those
    that verified more than their root)."""
    rows = request_rows(served, reference)
    return {"requests": rows, "span": max(r["finish"] for r in rows) - min(r["arrival"] for r in rows),
            "live_batch_mean": live_batch_mean(served.step_times, served.step_live),
            "live_batch_max": max(served.step_live, default=0), "row_steps": served.row_steps,
            "speculated_steps": served.speculated}


def pooled(rounds: Sequence[dict], slo_tpot_ms: float | None) -> dict:
    """The figures of a cell's rounds (:func:`round_record` each): throughput (tokens/s),
    request_throughput (requests/s), ttft_*, tpot_*, latency_*, queue_* (p50/p90/p99 and mean,
    seconds), goodput (tokens/s of the requests whose TPOT met ``slo_tpot_ms``; None without an
    SLO), live_batch_mean / _max, speculated (share of sequence-steps that verified more than
    their root), mismatches, near_ties (those at a float32 near-tie of the target: their
    ``margin``, set by the run, below ``NEAR_TIE``) and rounds."""
    rows = [r for rnd in rounds for r in rnd["requests"]]
    timed = [request_figures(r) for r in rows]
    span = sum(rnd["span"] for rnd in rounds)
    tokens = sum(r["tokens"] for r in rows)
    out: dict = {"requests": len(rows), "tokens": tokens, "duration": span, "rounds": len(rounds),
                 "throughput": tokens / span if span > 0 else 0.0,
                 "request_throughput": len(rows) / span if span > 0 else 0.0}
    for name in ("ttft", "tpot", "latency", "queue"):
        values = [t[name] for t in timed if t[name] is not None]
        out[f"{name}_mean"] = sum(values) / len(values) if values else None
        for q in (50, 90, 99):
            out[f"{name}_p{q}"] = percentile(values, q)
    if slo_tpot_ms is None:
        out["goodput"] = None
    else:
        met = [r for r, t in zip(rows, timed) if t["tpot"] is not None and t["tpot"] * 1000.0 <= slo_tpot_ms]
        out["goodput"] = sum(r["tokens"] for r in met) / span if span > 0 else 0.0
        out["slo_met"] = len(met) / len(rows)
    out["live_batch_mean"] = sum(rnd["live_batch_mean"] * rnd["span"] for rnd in rounds) / span if span > 0 else 0.0
    out["live_batch_max"] = max(rnd["live_batch_max"] for rnd in rounds)
    steps = sum(rnd["row_steps"] for rnd in rounds)
    out["speculated"] = sum(rnd["speculated_steps"] for rnd in rounds) / steps if steps else 0.0
    out["mismatches"] = sum(1 for r in rows if r["mismatch"])
    # A divergence where the target's top-2 margin is a float32 near-tie (batched shapes round
    # differently) is told apart from one at a clear margin (a bug), as a run's report does.
    out["near_ties"] = sum(1 for r in rows if r["mismatch"] and r.get("margin") is not None and r["margin"] < NEAR_TIE)
    return out


def summarize(served: Served, reference: Sequence[Sequence[int]], slo_tpot_ms: float | None) -> dict:
    """The figures (:func:`pooled`) of one round."""
    return pooled([round_record(served, reference)], slo_tpot_ms)
