"""Cells on disk: one JSON file per (rate, arm, round), written atomically (runs.layout.write_json),
reused when its key matches."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specframe.experiments.runs.layout import slugify


def read_json(path: Path) -> Any:
    """``path``'s JSON, or None when it is missing or damaged (then it is recomputed)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def cell_path(out_dir: Path, rate: float, arm: str, round_: int = 0) -> Path:
    """Where round ``round_`` of ``arm`` at ``rate`` lives: ``cells/rate-<rate>__<arm>__<round>.json``."""
    return Path(out_dir) / "cells" / f"rate-{rate:g}__{slugify(arm)}__{round_}.json"


def done_cell(out_dir: Path, rate: float, arm: str, round_: int, key: dict) -> dict | None:
    """The stored round when it was computed for ``key`` (the arm, the round, the settings and
    the inputs), else None."""
    cell = read_json(cell_path(out_dir, rate, arm, round_))
    return cell if isinstance(cell, dict) and cell.get("key") == key else None
