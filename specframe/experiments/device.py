"""The device an answer ran on, as every answer record keeps it (``"device"``).

``{"host", "kind", "name", "index", "threads"}``: the machine's host name; ``cuda`` or
``cpu`` (torch's device type); the GPU's name or the CPU's model; the GPU's index (a Ray
worker's physical GPU) or, on a CPU, the worker's number on its host (0 in one process); and,
on a CPU, torch's thread count. Two answers ran on the same device when host, kind and index
agree (:func:`device_id`); devices are alike when kind, name and threads agree
(:func:`device_kind`), which is what the report may pool speedups over.
"""

from __future__ import annotations

import socket
from typing import Any

from specframe.models import cache_keys


def describe_device(device: Any, index: int | None = None) -> dict[str, Any]:
    """This process's description of ``device`` (the module docstring); ``index`` overrides the
    index (a Ray worker passes its physical GPU, or its number on the host for a CPU)."""
    import torch

    device = torch.device(device)
    out: dict[str, Any] = {"host": socket.gethostname(), "kind": device.type}
    if device.type == "cuda":
        local = device.index if device.index is not None else torch.cuda.current_device()
        out.update(name=torch.cuda.get_device_name(local), index=local if index is None else int(index))
    else:
        out.update(name=cache_keys.cpu_name() or "cpu", index=0 if index is None else int(index),
                   threads=torch.get_num_threads())
    return out


def device_id(description: dict | None) -> str | None:
    """``host/kind:index``: one device (None for an answer that recorded none: old runs)."""
    if not description:
        return None
    return f"{description.get('host')}/{description.get('kind')}:{description.get('index')}"


def device_kind(description: dict | None) -> str | None:
    """What makes devices alike: kind and name, and the threads on a CPU (None: not recorded)."""
    if not description:
        return None
    kind = f"{description.get('kind')} {description.get('name')!s}"
    return kind + (f", {description['threads']} thread(s)" if description.get("threads") is not None else "")

