"""Device-aware pairing: which answers a speedup may pair, and the per-device breakdown.

An arm's answer pairs with the autoregressive answer of the same question and repeat **on the
same device** (:func:`pair_key`), so a sharded run's speedups compare times taken side by
side. Answers without a device (runs written before devices were recorded) all count as one
device, and pair exactly as they always did. A run whose answers ran on devices of different
kinds (:func:`~specframe.experiments.device.device_kind`) is refused unless the
caller allows it (``--allow-mixed-devices``); the report then says its speedups pool unlike
devices. tau, delta, tokens and mismatches do not depend on the device and pool as before.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from specframe.errors import ExperimentError
from specframe.experiments.device import device_id, device_kind
from specframe.experiments.runs import answer_key

MIXED_FIX = "pass --allow-mixed-devices to report them anyway (the report then says its speedups pool unlike devices)"


def pair_key(record: dict) -> tuple[str, int, str | None]:
    """``(question id as JSON, repeat, device)``: what pairs an answer with its baseline's."""
    return (*answer_key(record["question_id"], record.get("repeat", 0)), device_id(record.get("device")))


def devices(run: dict) -> dict[str, dict]:
    """``{device id: description}`` of every answer of the run that recorded one (sorted)."""
    found = {device_id(r.get("device")): r["device"] for records in run["arms"].values() for r in records
             if r.get("device")}
    return {k: found[k] for k in sorted(found)}


def check_devices(run: dict, allow_mixed: bool = False) -> dict[str, Any]:
    """What the summary says of the run's devices: ``{"devices": {id: description}}`` and,
    when they are of more than one kind and ``allow_mixed``, ``"mixed_devices": [kinds]``.
    Unlike kinds without ``allow_mixed`` raise :class:`ExperimentError` in one line."""
    found = devices(run)
    kinds = sorted({device_kind(d) for d in found.values()})
    if len(kinds) > 1 and not allow_mixed:
        raise ExperimentError(f"the answers ran on devices of {len(kinds)} kinds ({'; '.join(kinds)}): "
                              f"a speedup pooled over them is no device's; {MIXED_FIX}")
    return {"devices": found, **({"mixed_devices": kinds} if len(kinds) > 1 else {})}


def per_device(records: list[dict], base: list[dict], measure: Callable[[list[dict], list[dict]], dict]) -> dict:
    """``{device id: measure(the arm's answers there, the baseline's there)}``."""
    ids = sorted({device_id(r.get("device")) for r in records}, key=json.dumps)
    return {str(i): {"answers": sum(device_id(r.get("device")) == i for r in records),
                     **measure([r for r in records if device_id(r.get("device")) == i],
                               [r for r in base if device_id(r.get("device")) == i])}
            for i in ids}


def device_lines(summary: dict) -> list[str]:
    """The report's "Devices" section: each device, each arm's speedup per device, and the
    statement that speedups pool unlike devices when they do (empty for one device)."""
    found = summary.get("devices") or {}
    if len(found) < 2:
        return []
    lines = ["", "## Devices", "", "Each speedup pairs an arm's answer with the autoregressive answer of the same "
             "question on the same device.", ""]
    lines += [f"- `{i}`: {device_kind(d)}" for i, d in found.items()]
    if summary.get("mixed_devices"):
        lines += ["", f"**The overall speedups pool unlike devices** ({'; '.join(summary['mixed_devices'])}): "
                  "read them per device below."]
    lines += ["", "| arm | " + " | ".join(f"`{i}`" for i in found) + " |",
              "|---|" + "---:|" * len(found)]
    for arm in summary["arms"]:
        cells = []
        for i in found:
            m = (arm.get("devices") or {}).get(i) or {}
            cells.append("-" if m.get("speedup") is None else f"{m['speedup']:.2f}x ({m.get('paired', 0)} paired)")
        lines.append(f"| {arm['name']} | " + " | ".join(cells) + " |")
    return lines
