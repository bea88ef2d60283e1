"""The rich progress bar of a run or a recording: prompts x arms (x repeats), and what a
long command says when Ctrl-C stops it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NoReturn


def exit_interrupted(console: Any, kept: str, where: Path | str | None = None) -> NoReturn:
    """Say what an interrupted command kept (``kept``: "answers", "cells", ...; ``where``: its
    directory) and how to resume, then exit 130 (the shell's status for Ctrl-C)."""
    place = f" in {where}" if where is not None else ""
    console.print(f"[yellow]interrupted[/]: finished {kept} are saved{place}; run the same command again to resume")
    raise SystemExit(130)


class ProgressBar:
    """rich progress over prompts x arms (x repeats); a no-op when disabled."""

    def __init__(self, total: int, completed: int, enabled: bool, console: Any) -> None:
        self.total, self.completed, self.enabled, self.console = total, completed, enabled, console

    def __enter__(self):
        if not self.enabled:
            return lambda arm: None
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self._bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                             TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[arm]}"),
                             console=self.console, transient=False)
        self._bar.__enter__()
        task = self._bar.add_task("prompts x arms", total=self.total, completed=self.completed, arm="")
        from rich.markup import escape

        return lambda arm: self._bar.update(task, advance=1, arm=escape(arm))

    def __exit__(self, *exc) -> None:
        if self.enabled:
            self._bar.__exit__(*exc)
