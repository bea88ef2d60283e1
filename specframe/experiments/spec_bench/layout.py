"""Every file name of a Spec-Bench directory, in one place.

```
<bench dir>/
  run/             RUN_DIR: the experiment's run directory (answers, run.json, report.md, ...),
                   resumed and checked exactly as `specframe run` does
  summary.json     SUMMARY_FILE: per arm and task: speedup, mean accepted tokens, mismatches
  leaderboard.md   TABLE_FILE: the leaderboard's table and the equality check
  spec-bench.png   PLOT_FILE: speedup per task, one bar per arm
```
"""

from __future__ import annotations

from pathlib import Path

RUN_DIR = "run"
SUMMARY_FILE = "summary.json"
TABLE_FILE = "leaderboard.md"
PLOT_FILE = "spec-bench.png"
#: What the default directory adds to the experiment's ``[output] dir``.
DEFAULT_SUFFIX = "-spec-bench"


class BenchDir:
    """The paths of one Spec-Bench directory (nothing is created until something writes)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.run = self.path / RUN_DIR
        self.summary = self.path / SUMMARY_FILE
        self.table = self.path / TABLE_FILE
        self.plot = self.path / PLOT_FILE

    @classmethod
    def default(cls, output_dir: str | Path) -> "BenchDir":
        """The directory beside the experiment's own output: ``<[output] dir>-spec-bench``."""
        return cls(Path(str(output_dir) + DEFAULT_SUFFIX))
