"""Durable JSONL files: one record a line, appended and fsynced, a torn last line dropped.

Answers files and a sweep's ``results.jsonl`` are both written this way, so a crash, a
``kill -9`` or a full disk loses at most the line being written, and the next reader or
appender drops that half line with a warning that names the file instead of failing on it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO, Any

from specframe.errors import ExperimentError, warn


def append_line(fh: IO[str], obj: Any) -> None:
    """Write ``obj`` as one JSON line and make it durable (flush + fsync) before returning."""
    fh.write(json.dumps(obj) + "\n")
    fh.flush()
    os.fsync(fh.fileno())


def open_for_append(path: Path) -> IO[str]:
    """``path`` opened for appending, after dropping a torn last line (see :func:`drop_partial_line`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    drop_partial_line(path)
    return path.open("a", encoding="utf-8")


def drop_partial_line(path: Path) -> None:
    """Truncate a half-written last line in place (a crash mid-write) so appends stay valid JSONL.

    In place, not a rewrite: a crash during the repair itself leaves the file as it was or
    repaired, never empty."""
    if not path.exists():
        return
    size = path.stat().st_size
    if size == 0:
        return
    with path.open("rb+") as fh:
        fh.seek(size - 1)
        if fh.read(1) == b"\n":
            return
        keep = _last_newline_end(fh, size)
        fh.truncate(keep)
        fh.flush()
        os.fsync(fh.fileno())


def _last_newline_end(fh: Any, size: int, block: int = 1 << 16) -> int:
    """Offset just past the last ``\\n`` of the file (0 when it has none), reading backwards."""
    end = size
    while end > 0:
        start = max(0, end - block)
        fh.seek(start)
        chunk = fh.read(end - start)
        i = chunk.rfind(b"\n")
        if i >= 0:
            return start + i + 1
        end = start
    return 0


def read_lines(path: str | Path, what: str = "record") -> list[dict]:
    """Every JSON line of ``path`` (none when it does not exist).

    A half-written last line (an interrupted write) is dropped with a warning naming the file;
    a damaged line elsewhere raises :class:`ExperimentError` naming the file and line."""
    path = Path(path)
    if not path.exists():
        return []
    out = []
    lines = path.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                warn(f"{path}:{i + 1}: dropped a half-written last {what} (an interrupted run); "
                     "it is recomputed on the next run")
                break
            raise ExperimentError(f"corrupt {what} ({path}:{i + 1}): delete the line, or rerun with --fresh") from None
    return out
