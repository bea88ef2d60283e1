"""Where measured costs are cached, and the keys that say what they belong to.

Cost curves (:mod:`specframe.profile`) and the ``"auto"`` linear kernel choice
(:mod:`specframe.packed_linear`) live side by side in ``specframe.gguf.cache_root()/profiles``.
Both are keyed by the model (a readable name plus a hash of its config: weights do not change
the cost), threads and torch version; this module holds the parts both keys share, so that
neither module has to import the other.
"""

from __future__ import annotations

import hashlib
import platform
from pathlib import Path
from typing import Any


def safe(text: str) -> str:
    """``text`` with every character but letters, digits, ``.`` and ``-`` replaced by ``-``."""
    return "".join(c if c.isalnum() or c in ".-" else "-" for c in text)


def profiles_dir() -> Path:
    """``specframe.gguf.cache_root() / "profiles"``: cost curves and kernel choices."""
    from .gguf import cache_root

    return cache_root() / "profiles"


def model_identity(model: Any, kernel: str | None = None) -> str:
    """A readable model name and a hash of its config, then ``-<kernel>`` (the linear kernel
    installed, given by the caller) and ``-gqa`` when its attention is
    :mod:`specframe.attention`'s (both change the cost)."""
    from .attention import NAME as GQA_SDPA

    cfg = model.config
    name = str(getattr(cfg, "_name_or_path", "") or getattr(model, "name_or_path", "") or "")
    name = Path(name).name or (getattr(cfg, "architectures", None) or [type(model).__name__])[0]
    digest = hashlib.sha1(cfg.to_json_string(use_diff=False).encode()).hexdigest()[:10]
    gqa = getattr(cfg, "_attn_implementation", None) == GQA_SDPA
    return f"{safe(name)}-{digest}" + (f"-{kernel}" if kernel else "") + ("-gqa" if gqa else "")


def cpu_label() -> str:
    """This CPU's model name (``/proc/cpuinfo``), else the processor or machine name."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return safe(line.split(":", 1)[1].strip())
    except OSError:
        pass
    return safe(platform.processor() or platform.machine() or "cpu")
