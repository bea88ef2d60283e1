"""Every file and directory name of a run directory, in one place.

```
<run dir>/
  run.json              RUN_FILE: settings fingerprint, arm definitions, greedy flags (resume checks)
  answers/<arm>.jsonl   ANSWERS_DIR: one answer record per line, append-only
  divergences.json      DIVERGENCES_FILE: where greedy arms left the autoregressive answers
  summary.json          SUMMARY_FILE: every metric (written by the report)
  report.md             REPORT_FILE: tables and figures (written by the report)
  plots/*.png           PLOTS_DIR: the report's figures
  trees.html            EXPLORER_FILE: every recorded step's tree, in words (written by the report)
```
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import shutil
from pathlib import Path
from typing import Any

RUN_FILE = "run.json"
ANSWERS_DIR = "answers"
ANSWERS_SUFFIX = ".jsonl"
DIVERGENCES_FILE = "divergences.json"
SUMMARY_FILE = "summary.json"
REPORT_FILE = "report.md"
PLOTS_DIR = "plots"
EXPLORER_FILE = "trees.html"


def slugify(name: str) -> str:
    """``talon[mu=0.01,budget=32]`` -> ``talon.mu=0.01.budget=32`` (safe as a file name)."""
    text = name.replace("[", ".").replace(",", ".").replace("]", "")
    return re.sub(r"[^A-Za-z0-9._=+-]", "_", text)


class RunDir:
    """The paths of one run directory (nothing is created until something writes)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.run_file = self.path / RUN_FILE
        self.answers_dir = self.path / ANSWERS_DIR
        self.divergences = self.path / DIVERGENCES_FILE
        self.summary = self.path / SUMMARY_FILE
        self.report = self.path / REPORT_FILE
        self.plots = self.path / PLOTS_DIR
        self.explorer = self.path / EXPLORER_FILE

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    def answers(self, arm: str) -> Path:
        """The answers file of the arm called ``arm``."""
        return self.answers_dir / f"{slugify(arm)}{ANSWERS_SUFFIX}"

    def is_run(self) -> bool:
        """True when the directory holds a run (its run file)."""
        return self.run_file.is_file()

    def discard(self) -> None:
        """Remove what a run and its report write (answers, run file, summary, report, plots,
        trees.html, divergences), nothing else."""
        for d in (self.answers_dir, self.plots):
            if d.is_dir():
                shutil.rmtree(d)
        for f in (self.run_file, self.summary, self.report, self.explorer, self.divergences):
            f.unlink(missing_ok=True)


def write_json(path: Path, obj: Any, indent: int | None = 2) -> None:
    """Write ``obj`` as JSON to ``path`` atomically, the one JSON writer of runs and load runs: a
    temporary file of its own (two writers never share one) is fsynced and renamed over it, so
    a crash leaves the old file or the new one, never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(obj, fh, indent=indent)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
