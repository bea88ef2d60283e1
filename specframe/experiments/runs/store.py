"""The answers of a run: one append-only JSONL file per arm, crash- and Ctrl-C-safe, resumable.

Each record is written, flushed and fsynced before the next generation starts, so an interrupted
run loses at most the answer in progress; a half-written last line is dropped when the file is
next read or appended to. :func:`read_answers` is the one reader of answers files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specframe.errors import warn
from specframe.experiments.runs.jsonl import append_line, open_for_append, read_lines
from specframe.experiments.runs.layout import RunDir
from specframe.experiments.runs.record import AnswerRecord, answer_key


class AnswerStore:
    """Append-only per-arm answer files of a run directory, with fsync after every record."""

    def __init__(self, out_dir: str | Path) -> None:
        self.run_dir = RunDir(out_dir)
        self.dir = self.run_dir.answers_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self._files: dict[str, Any] = {}

    def path(self, arm: str) -> Path:
        """The answers file of the arm called ``arm``."""
        return self.run_dir.answers(arm)

    def read(self, arm: str) -> list[dict]:
        """The arm's records (see :func:`read_answers`)."""
        return read_answers(self.path(arm))

    def done(self, arm: str) -> set[tuple[str, int]]:
        """Keys ``(question_id as JSON, repeat)`` already answered by ``arm`` (records of another
        arm in its file, e.g. one whose name slugs the same, do not count)."""
        return {answer_key(r["question_id"], r["repeat"]) for r in self.read(arm) if r.get("arm") == arm}

    def append(self, record: AnswerRecord) -> dict:
        """Write one record to its arm's file and make it durable before returning; the dict written."""
        fh = self._files.get(record.arm)
        if fh is None:
            fh = self._files[record.arm] = open_for_append(self.path(record.arm))
        data = record.to_dict()
        append_line(fh, data)
        return data

    def close(self) -> None:
        """Close every open file."""
        for fh in self._files.values():
            fh.close()
        self._files.clear()

    def __enter__(self) -> "AnswerStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def read_answers(path: str | Path) -> list[dict]:
    """Records of an answers file (dicts, see :class:`AnswerRecord`), each (arm, question, repeat) once.

    A half-written last line (a crash mid-write) is dropped and a repeated (arm, question_id,
    repeat) keeps its first record (e.g. two runs that once shared a directory); both warn.
    """
    path = Path(path)
    return _unique_answers(read_lines(path, "answer record"), path)


def _unique_answers(records: list[dict], path: Path) -> list[dict]:
    """The first record of each (arm, question_id, repeat); warns when any repeat."""
    seen: set[tuple] = set()
    unique = []
    for rec in records:
        key = (rec.get("arm"), *answer_key(rec.get("question_id"), rec.get("repeat", 0)))
        if key not in seen:
            seen.add(key)
            unique.append(rec)
    if len(unique) < len(records):
        warn(f"{path}: {len(records) - len(unique)} duplicate answer record(s) ignored (same arm, question "
             "and repeat; two runs once wrote this directory); the first of each is kept")
    return unique
