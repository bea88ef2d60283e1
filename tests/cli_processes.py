"""The real ``specframe`` command in a process of its own, without paying its imports each time.

Tests that run the CLI as a user would (edit files between runs, SIGKILL it mid-run, run two at
once on one directory) need a process per command, and a fresh ``python -m specframe.cli`` spends
most of its few seconds importing torch, transformers and matplotlib. Here one server process per
pytest worker imports those once and forks a child per command: the child is a new process (its
own pid, files, locks and exit status, killable with SIGKILL) that starts from the server's
imported modules and nothing else (the server never builds a model, reads a config or loads a
plugin, so no state of an earlier command or test reaches it), then runs ``specframe.cli.main``
with the command's arguments in the command's folder.

:func:`start` returns a :class:`Command` (``pid``, ``wait``, ``kill``) and :func:`run` a
``subprocess.CompletedProcess``, so a test reads as with ``subprocess``.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: The server: import what every command imports, then fork a child per request line (JSON:
#: id, args, cwd, out, err) and write ``<id>.pid`` at once and ``<id>.rc`` when the child ends.
#: Single-threaded (a fork from a threaded process is unsafe): it polls stdin and reaps children.
SERVER = r"""
import json, os, select, sys
import torch, transformers
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: F401 - the lazy modelling import
import matplotlib.figure, matplotlib.backends.backend_agg  # noqa: F401 - every run draws its plots
import click, specframe.experiments.experiment, specframe.replay.trace  # noqa: F401

done_dir = sys.argv[1]
children = {}

def write(name, text):
    tmp = os.path.join(done_dir, "." + name)
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, os.path.join(done_dir, name))

def reap():
    while children:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            return
        write(children.pop(pid) + ".rc", str(os.waitstatus_to_exitcode(status)))

def child(req):
    code = 1
    try:
        os.chdir(req["cwd"])
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for fd, path in ((1, req["out"]), (2, req["err"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
        sys.argv = ["specframe", *req["args"]]
        from specframe.cli import main
        try:
            main()
            code = 0
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
            if isinstance(stop.code, str):
                print(stop.code, file=sys.stderr)
    except BaseException:
        import traceback
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

print("ready", flush=True)
pending = b""
while True:
    ready, _, _ = select.select([0], [], [], 0.02)
    reap()
    if not ready:
        continue
    chunk = os.read(0, 1 << 16)  # unbuffered: select() sees every request line that is not read yet
    if not chunk:
        break
    *lines, pending = (pending + chunk).split(b"\n")
    for line in lines:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            child(req)
        children[pid] = req["id"]
        write(req["id"] + ".pid", str(pid))
"""


class Command:
    """A command the server started: its ``pid``, and its outputs once it ended."""

    def __init__(self, server: "_Server", ident: str, args: list[str]) -> None:
        self.server, self.id, self.args = server, ident, args
        self.pid = int(server.wait_for(ident + ".pid", 60))

    def wait(self, timeout: float | None = None) -> int:
        """The exit status (negative: the signal that ended it), as ``Popen.wait``."""
        return int(self.server.wait_for(self.id + ".rc", timeout, self))

    def kill(self) -> None:
        """SIGKILL the command (its status then reads ``-SIGKILL``)."""
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def result(self, timeout: float | None = None) -> subprocess.CompletedProcess:
        """Wait, then the exit status and both outputs, as ``subprocess.run`` gives them."""
        code = self.wait(timeout)
        out, err = (Path(self.server.dir, f"{self.id}.{s}").read_text() for s in ("out", "err"))
        return subprocess.CompletedProcess(["specframe", *self.args], code, out, err)


class _Server:
    def __init__(self, env: dict) -> None:
        self.dir = tempfile.mkdtemp(prefix="specframe-cli-")
        self.env, self.count = env, 0
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER, self.dir], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env)
        assert self.proc.stdout.readline().strip() == b"ready", "the CLI server did not start"
        atexit.register(self.close)

    def start(self, args: list[str], cwd: Path) -> Command:
        self.count += 1
        ident = f"c{self.count}"
        req = {"id": ident, "args": args, "cwd": str(cwd), "out": f"{self.dir}/{ident}.out",
               "err": f"{self.dir}/{ident}.err"}
        self.proc.stdin.write((json.dumps(req) + "\n").encode())
        self.proc.stdin.flush()
        return Command(self, ident, args)

    def wait_for(self, name: str, timeout: float | None, command: Command | None = None) -> str:
        path = Path(self.dir, name)
        deadline = None if timeout is None else time.monotonic() + timeout
        while not path.exists():
            assert self.proc.poll() is None, "the CLI server died"
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(["specframe", *(command.args if command else [])], timeout)
            time.sleep(0.02)
        return path.read_text()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        shutil.rmtree(self.dir, ignore_errors=True)


_servers: dict[tuple, _Server] = {}


def _server(env: dict) -> _Server:
    key = tuple(sorted(env.items()))
    if key not in _servers or _servers[key].proc.poll() is not None:
        _servers[key] = _Server(env)
    return _servers[key]


def start(*args: str | Path, cwd: Path, env: dict) -> Command:
    """Start ``specframe ARGS`` in ``cwd`` with the environment ``env`` (one server per ``env``)."""
    return _server(env).start([str(a) for a in args], cwd)


def run(*args: str | Path, cwd: Path, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    """``specframe ARGS`` run to its end: ``subprocess.run(..., capture_output=True, text=True)``."""
    command = start(*args, cwd=cwd, env=env)
    try:
        return command.result(timeout)
    except subprocess.TimeoutExpired:
        command.kill()
        raise
