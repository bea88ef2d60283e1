"""Build and load ``csrc/exact_ops.cpp``, the exact forward's attention and SiLU, compiled for
this CPU at first use (like the linear kernels, :mod:`specframe.models.native_gemm`)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from types import ModuleType

from specframe.models import native_gemm

SOURCE = Path(__file__).parent.parent / "csrc" / "exact_ops.cpp"


@lru_cache(maxsize=1)
def _build() -> tuple[ModuleType | None, str]:
    return native_gemm.compile_source(SOURCE, "specframe_exact_ops")


def load_extension() -> ModuleType | None:
    """The compiled extension (built now if this machine has none yet), or None when it cannot
    be built here (:func:`unavailable_reason` says why)."""
    return _build()[0]


def unavailable_reason() -> str:
    """Why :func:`load_extension` returns None ("" when it builds)."""
    return _build()[1]
