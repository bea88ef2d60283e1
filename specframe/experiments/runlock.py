"""An exclusive lock on a run's output directory, so two runs never write the same answers.

The lock is an OS advisory lock (``flock``) on ``<out_dir>/.specframe.lock``: the kernel drops
it when its holder exits, however it exits, so a lock left by a killed run is simply free and
the next run takes it over (and says so). The file records the holder's pid, host and start
time for the refusal message.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from specframe.errors import warn
from specframe.models.gguf import pid_alive

LOCK_FILE = ".specframe.lock"

try:
    import fcntl
except ImportError:  # Windows: no flock; fall back to an exclusive-create file (see _create_lock)
    fcntl = None  # type: ignore[assignment]


class DirectoryInUseError(RuntimeError):
    """Another live run holds the output directory."""


class RunLock:
    """Context manager holding the exclusive lock of ``out_dir`` for one run."""

    def __init__(self, out_dir: str | Path) -> None:
        self.path = Path(out_dir) / LOCK_FILE
        self._fh: Any = None

    def __enter__(self) -> "RunLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if fcntl is None:
            self._create_lock()
            return self
        fh = self._flock()
        previous = _read_holder(self.path)
        if previous:  # the file outlived its holder: that run was killed before it could clean up
            warn(f"output directory {self.path.parent} was locked by a run that is gone "
                 f"(pid {previous.get('pid')} on {previous.get('host')}); taking the lock over")
        fh.seek(0)
        fh.truncate()
        fh.write(json.dumps(_holder()))
        fh.flush()
        self._fh = fh
        return self

    def _flock(self) -> Any:
        """The lock file, opened and flock-ed; refuses when a live process holds it."""
        while True:
            fh = open(self.path, "a+", encoding="utf-8")
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = _read_holder(self.path)
                fh.close()
                raise DirectoryInUseError(_in_use_message(self.path.parent, holder)) from None
            try:
                same = os.stat(self.path).st_ino == os.fstat(fh.fileno()).st_ino
            except FileNotFoundError:
                same = False
            if same:
                return fh
            # The holder removed the file between our open and our flock: lock the new one.
            fh.close()

    def _create_lock(self) -> None:
        """Exclusive-create fallback without flock: a stale file of a dead local pid is taken over."""
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            holder = _read_holder(self.path)
            if holder.get("host") == socket.gethostname() and not pid_alive(int(holder.get("pid", -1))):
                warn(f"output directory {self.path.parent} was locked by a run that is gone "
                     f"(pid {holder.get('pid')}); taking the lock over")
                self.path.unlink(missing_ok=True)
                return self._create_lock()
            raise DirectoryInUseError(_in_use_message(self.path.parent, holder)) from None
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(_holder()))

    def __exit__(self, *exc: Any) -> None:
        # Remove the file first, then unlock: a waiter that gets the lock sees no stale holder.
        self.path.unlink(missing_ok=True)
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def _holder() -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}


def _read_holder(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _in_use_message(out_dir: Path, holder: dict) -> str:
    who = f"pid {holder.get('pid')} on {holder.get('host')}, started {holder.get('started')}" if holder else "another process"
    return (f"output directory in use by another specframe run ({out_dir}, {who}): wait for it to "
            "finish, or give this run another directory with --out")
