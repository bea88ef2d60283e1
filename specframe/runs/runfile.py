"""``run.json``: what a run directory holds answers of, so a resume never mixes experiments.

The fingerprint (settings shared by every arm) and each arm's definition are recorded on the
first run; a later run with a different fingerprint or a changed arm is refused. Arms may be
added and repeats raised freely. The file also keeps which arms decode greedily and which
prompts ``[data] on_overflow = "skip"`` left out.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import ExperimentError
from .layout import RunDir, write_json


class RunFile:
    """The run file of a run directory."""

    def __init__(self, out_dir: str | Path) -> None:
        self.out_dir = Path(out_dir)
        self.path = RunDir(out_dir).run_file

    def read(self) -> dict:
        """The file's contents (empty when there is none yet)."""
        return json.loads(self.path.read_text(encoding="utf-8")) if self.path.exists() else {}

    def write(self, meta: dict) -> None:
        """Replace the file atomically."""
        write_json(self.path, meta)

    def check(self, name: str, fingerprint: dict, arms: dict[str, dict], **settings: Any) -> None:
        """Refuse to mix answers of a different experiment; record this one's settings.

        ``fingerprint``: settings that make old answers incomparable when they change;
        ``arms``: name -> plain-data definition; ``settings``: informative (target, repeats, ...).
        """
        old = self.read()
        arms = dict(arms)
        if self.path.exists():
            diff = sorted(k for k in fingerprint if old.get("fingerprint", {}).get(k) != fingerprint[k])
            if diff:
                raise ExperimentError(
                    f"{self.out_dir} holds answers of a different experiment (differs in: {', '.join(diff)}); "
                    "use another [output] dir or --fresh to discard them"
                )
            for arm, desc in old.get("arms", {}).items():
                if arm in arms and arms[arm] != desc:
                    raise ExperimentError(
                        f"arm {arm!r} changed since its answers in {self.out_dir} were written; rename it, "
                        "or use --fresh to discard all answers"
                    )
                arms.setdefault(arm, desc)
        meta = {"name": name, "fingerprint": fingerprint, "arms": arms, **settings,
                "greedy": old.get("greedy", {})}
        if self.path.exists():
            meta["overflow_skipped"] = old.get("overflow_skipped", [])
        self.write(meta)

    def record_greedy(self, flags: dict[str, bool]) -> None:
        """Note which arms decode greedily (their answers are compared with autoregressive's)."""
        meta = self.read()
        meta.setdefault("greedy", {}).update(flags)
        self.write(meta)

    def add_overflow_skipped(self, skipped: list[dict]) -> None:
        """List prompts left out because they do not fit the target's context."""
        meta = self.read()
        meta["overflow_skipped"] = meta.get("overflow_skipped", []) + skipped
        self.write(meta)

    def overflow_skipped_ids(self) -> set[str]:
        """Question ids (as JSON) an earlier run of this directory skipped as too long."""
        return {json.dumps(s["question_id"]) for s in self.read().get("overflow_skipped", [])}
