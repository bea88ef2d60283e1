"""Where measured costs are cached, and the keys that say what they belong to.

Cost curves (:mod:`specframe.sizing.profile`) and the ``"auto"`` linear kernel choice
(:mod:`specframe.models.packed_linear`) live side by side in ``specframe.models.gguf.cache_root()/profiles``.
Both are keyed by the model (a readable name plus a hash of its config: weights do not change
the cost), threads and torch version. This module holds the parts both keys share, reads
and writes the kernel choice, and spells the ``specframe profile`` command that measures both
again (:func:`profile_command`), so that neither of the two modules has to import the other.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shlex
from pathlib import Path
from typing import Any

import torch


def safe(text: str) -> str:
    """``text`` with every character but letters, digits, ``.`` and ``-`` replaced by ``-``."""
    return "".join(c if c.isalnum() or c in ".-" else "-" for c in text)


def profiles_dir() -> Path:
    """``specframe.models.gguf.cache_root() / "profiles"``: cost curves and kernel choices."""
    from specframe.models.gguf import cache_root

    return cache_root() / "profiles"


def model_identity(model: Any, kernel: str | None = None) -> str:
    """A readable model name and a hash of its config, then ``-<kernel>`` (the linear kernel
    installed, given by the caller), ``-gqa`` when its attention is
    :mod:`specframe.models.attention`'s and ``-exact`` when it runs the exact forward
    (:mod:`specframe.models.exact`; all change the cost)."""
    from specframe.models.attention import NAME as GQA_SDPA
    from specframe.models.exact.attention import NAME as EXACT

    cfg = model.config
    name = str(getattr(cfg, "_name_or_path", "") or getattr(model, "name_or_path", "") or "")
    name = Path(name).name or (getattr(cfg, "architectures", None) or [type(model).__name__])[0]
    digest = hashlib.sha1(cfg.to_json_string(use_diff=False).encode()).hexdigest()[:10]
    gqa = getattr(cfg, "_attn_implementation", None) == GQA_SDPA
    exact = getattr(cfg, "_attn_implementation", None) == EXACT
    return f"{safe(name)}-{digest}" + (f"-{kernel}" if kernel else "") + ("-gqa" if gqa else "") + ("-exact" if exact else "")


def cpu_name() -> str:
    """This CPU's model name as ``/proc/cpuinfo`` writes it, else the processor or machine name
    ("" when none is known)."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_label() -> str:
    """:func:`cpu_name` made safe for a cache key."""
    return safe(cpu_name() or "cpu")


#: The "auto" kernel chosen per cache directory and key, for the process (the file is read once).
_CHOSEN: dict[tuple[Path, str], str] = {}


def kernel_choice_key(model: Any, threads: int | None = None) -> str:
    """Cache key of ``model``'s ``"auto"`` kernel (taken before its linears are replaced): the
    model (as the cost curves name it), this CPU, torch threads, torch version and the native
    kernel's build (a digest of its source and flags: a choice timed against an older native
    kernel is stale once the kernel changes)."""
    from specframe.models.native_gemm import extension_name

    threads = torch.get_num_threads() if threads is None else threads
    native = extension_name().rsplit("_", 1)[-1][:8]
    return "_".join(["linear-kernel", model_identity(model), cpu_label(), f"t{threads}",
                     "torch" + safe(torch.__version__), "native" + native])


def load_kernel_choice(key: str) -> str | None:
    """The kernel cached for ``key``, or None (a damaged file counts as absent)."""
    where = profiles_dir()
    if (where, key) not in _CHOSEN:
        try:
            kernel = json.loads((where / f"{key}.json").read_text(encoding="utf-8"))["kernel"]
        except (OSError, ValueError, TypeError, KeyError):
            return None
        if not isinstance(kernel, str):
            return None
        _CHOSEN[where, key] = kernel
    return _CHOSEN[where, key]


def save_kernel_choice(key: str, kernel: str, seconds: dict[str, float], rows: tuple[int, ...],
                       spread: float | None = None) -> None:
    """Cache ``kernel`` for ``key`` beside the cost curves (atomically), with the seconds of the
    forwards it was chosen on and their spread; a read-only cache keeps it for the process only."""
    where = profiles_dir()
    _CHOSEN[where, key] = kernel
    path = where / f"{key}.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # one temporary name per process: two processes sharing the cache (parallel test workers,
        # two runs) may write the same file at once, and each must rename a whole file of its own
        tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
        tmp.write_text(json.dumps({"key": key, "kernel": kernel, "rows": list(rows), "seconds": seconds,
                                   "spread": spread}, indent=1), encoding="utf-8")
        tmp.replace(path)
    except OSError:
        pass


def remember_kernel_choice(key: str, kernel: str) -> None:
    """Use ``kernel`` for ``key`` for the rest of this process without caching it (a choice
    timed on a busy machine: the next process times it again)."""
    _CHOSEN[profiles_dir(), key] = kernel


def command_name(model: Any) -> str:
    """The name ``specframe profile`` loads ``model`` by: a shipped model's short name, a
    registry model's name for its converted checkpoint, else its path or hub id."""
    from specframe.models.assets import SHIPPED_MODELS
    from specframe.models.gguf import REGISTRY_MODELS

    where = str(getattr(model.config, "_name_or_path", "") or getattr(model, "name_or_path", "") or "")
    path = Path(where)
    for name, folder in SHIPPED_MODELS.items():
        if where and path == folder:
            return name
    for name, (_, file) in REGISTRY_MODELS.items():
        if path.parent.name == "gguf" and path.name.startswith(Path(file).stem + "-"):
            return name
    return where or "MODEL"


def profile_command(model: Any, kernel: str | None = None, linears: str = "float32") -> str:
    """The ``specframe profile`` command that measures ``model``'s cost curve as this process
    runs it: its name (:func:`command_name`), torch threads, dtype, device, ``kernel`` (the
    packed-linear kernel installed, ``"auto"`` to choose it too, None: plain linears; a kernel
    that the cached ``"auto"`` choice names is written ``auto``, as the run chose it) and
    ``linears`` (what runs them, as :func:`~specframe.models.linears.linears_label` says)."""
    param = next(model.parameters(), None)
    parts = ["specframe", "profile", shlex.quote(command_name(model)), "--threads", str(torch.get_num_threads())]
    if param is not None and param.dtype != torch.float32:
        parts += ["--dtype", str(param.dtype).replace("torch.", "")]
    if param is not None and (param.device.type != "cpu" or torch.cuda.is_available()):
        parts += ["--device", str(param.device)]
    if kernel and kernel != "auto" and load_kernel_choice(kernel_choice_key(model)) == kernel:
        kernel = "auto"
    if kernel:
        parts += ["--packed-linears", kernel]
    if linears.startswith("bf16"):
        parts += ["--linears", "bf16"]
    if getattr(getattr(model, "config", None), "_attn_implementation", None) == "specframe_exact":
        parts.append("--exact")  # the exact forward's curve is keyed apart (model_identity's -exact)
    return " ".join(parts)
