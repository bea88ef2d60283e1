"""The questions of a sharded recording (``record --ray``) kept as they finish, so that one
stopped part way (a lost Ray node, Ctrl-C, a crash) loses none of them: the same command
records only the rest.

They live beside the trace's directory, in ``.<name>.partial-<recorded_for>``: one JSON file
per question (its turns' entries and timings), written atomically after its hidden-state
files, and ``meta.json``, the curve every worker measured against and the device kind that
recorded (a resumed recording keeps both, so its questions are timed as the earlier ones). The
directory is named for the experiment (:func:`~specframe.replay.record.recorded_for`): another
experiment's questions are never mixed in. A finished trace takes the hidden files with it and
the directory goes; ``--fresh`` discards it first.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict
from pathlib import Path

from specframe.experiments.config import ExperimentConfig
from specframe.replay.record import RecordedTurn, recorded_for
from specframe.replay.trace import HIDDEN_DIR, PromptTrace, write_hidden

META = "meta.json"
UNITS = "questions"


class PartialRecording:
    """The kept questions of ``config``'s sharded recording into ``final`` (module docstring)."""

    def __init__(self, final: Path, config: ExperimentConfig) -> None:
        self.final = Path(final)
        self.dir = self.final.parent / f".{self.final.name}.partial-{recorded_for(config)}"

    def discard_others(self, fresh: bool) -> None:
        """Remove other experiments' kept questions for ``final`` (and this one's if ``fresh``)."""
        for path in self.final.parent.glob(f".{self.final.name}.partial-*"):
            if fresh or path != self.dir:
                shutil.rmtree(path, ignore_errors=True)

    def meta(self) -> dict | None:
        """``{"curve": JSON or None, "device": dict}`` of the recording being resumed, or None."""
        try:
            return json.loads((self.dir / META).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def begin(self, curve: str | None, device: dict) -> None:
        """Keep the curve and the first device of a new recording."""
        (self.dir / UNITS).mkdir(parents=True, exist_ok=True)
        _write_atomically(self.dir / META, json.dumps({"curve": curve, "device": device}))

    def kept(self) -> dict[int, list[RecordedTurn]]:
        """The questions recorded before, by their position in the data file (a damaged file
        is recorded again)."""
        out: dict[int, list[RecordedTurn]] = {}
        for file in sorted((self.dir / UNITS).glob("*.json")):
            try:
                turns = json.loads(file.read_text(encoding="utf-8"))
                out[int(file.stem)] = [RecordedTurn(PromptTrace(**t["entry"]), [tuple(p) for p in t["rest"]],
                                                    list(t["ratios"])) for t in turns]
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return out

    def keep(self, position: int, turns: list[tuple[RecordedTurn, bytes | None]]) -> None:
        """Keep one question: its hidden files first, then its turns (the file that counts)."""
        for turn, data in turns:
            if data is not None:
                write_hidden(self.dir, turn.entry.hidden_file, data)
        rows = [{"entry": asdict(t.entry), "rest": [list(p) for p in t.rest], "ratios": t.ratios} for t, _ in turns]
        _write_atomically(self.dir / UNITS / f"{position}.json", json.dumps(rows))

    def hand_over(self, work: Path) -> None:
        """Move the kept hidden files into the trace being written in ``work``."""
        if (self.dir / HIDDEN_DIR).is_dir():
            work.mkdir(parents=True, exist_ok=True)
            os.replace(self.dir / HIDDEN_DIR, work / HIDDEN_DIR)

    def remove(self) -> None:
        """The trace is in place: the kept questions are in it."""
        shutil.rmtree(self.dir, ignore_errors=True)


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())
    os.replace(tmp, path)
