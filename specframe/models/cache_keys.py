"""Where measured costs are cached, and the keys that say what they belong to.

Cost curves (:mod:`specframe.sizing.profile`) and the ``"auto"`` linear kernel choice
(:mod:`specframe.models.packed_linear`) live side by side in ``specframe.models.gguf.cache_root()/profiles``.
Both are keyed by the model (a readable name plus a hash of its config: weights do not change
the cost), threads and torch version. This module holds the parts both keys share, and reads
and writes the kernel choice, so that neither of the two modules has to import the other.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
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
    model (as the cost curves name it), this CPU, torch threads and torch version."""
    threads = torch.get_num_threads() if threads is None else threads
    return "_".join(["linear-kernel", model_identity(model), cpu_label(), f"t{threads}",
                     "torch" + safe(torch.__version__)])


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


def save_kernel_choice(key: str, kernel: str, seconds: dict[str, float], rows: tuple[int, ...]) -> None:
    """Cache ``kernel`` for ``key`` beside the cost curves (atomically), with the seconds of the
    forwards it was chosen on; a read-only cache keeps it for the process only."""
    where = profiles_dir()
    _CHOSEN[where, key] = kernel
    path = where / f"{key}.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # one temporary name per process: two processes sharing the cache (parallel test workers,
        # two runs) may write the same file at once, and each must rename a whole file of its own
        tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
        tmp.write_text(json.dumps({"key": key, "kernel": kernel, "rows": list(rows), "seconds": seconds},
                                  indent=1), encoding="utf-8")
        tmp.replace(path)
    except OSError:
        pass
