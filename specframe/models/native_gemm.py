"""Build and load ``csrc/small_gemm.cpp``: a float32 small-row GEMM compiled for this CPU.

The extension is compiled once per machine (about 25 s on the 2-core Xeon, with the C++ compiler torch's extension
builder finds) into torch's extension cache and loaded from there afterwards. Its name carries
a digest of the source, the compiler flags and this CPU's instruction-set flags, so a cache
shared between machines never loads code built for another processor. Nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import platform
import warnings
from functools import lru_cache
from pathlib import Path
from types import ModuleType

SOURCE = Path(__file__).parent / "csrc" / "small_gemm.cpp"
# -fopenmp: at::parallel_for's pragmas. -ffp-contract=off: the compiler never fuses a multiply
# and an add on its own, a choice it may make differently for two instantiations of one loop
# (a 1-row and a 12-row tile summed the same k differently); the kernels write every fused
# multiply-add they want explicitly, so a row's arithmetic cannot depend on its tile.
FLAGS = ("-O3", "-march=native", "-fopenmp", "-ffp-contract=off")


def _link_flags() -> list[str]:
    """Link OpenMP from torch's own library folder when it ships one, so the process keeps a
    single OpenMP runtime and thread pool (two pools would fight over the cores)."""
    import torch

    lib = Path(torch.__file__).parent / "lib"
    if (lib / "libgomp.so.1").exists():
        return [f"-L{lib}", "-l:libgomp.so.1", f"-Wl,-rpath,{lib}"]
    return ["-fopenmp"]


def _cpu_flags() -> str:
    """This CPU's instruction-set flags (x86 Linux), else the machine name."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.machine()


def extension_name(source: Path = SOURCE, prefix: str = "specframe_small_gemm") -> str:
    """The cache name of the build of ``source`` with these flags for this CPU."""
    digest = hashlib.sha256(source.read_bytes() + " ".join(FLAGS).encode() + _cpu_flags().encode())
    return f"{prefix}_{digest.hexdigest()[:16]}"


def compile_source(source: Path, prefix: str) -> tuple[ModuleType | None, str]:
    """Build (or load the cached build of) the extension ``source``: ``(module, "")``, or
    ``(None, why)`` when it cannot be built here."""
    try:
        from torch.utils.cpp_extension import load

        return load(name=extension_name(source, prefix), sources=[str(source)], extra_cflags=list(FLAGS),
                    extra_ldflags=_link_flags(), verbose=False), ""
    except Exception as exc:  # no compiler, no ninja, a failed build: the other kernels remain
        lines = str(exc).strip().splitlines() or [""]
        return None, f"{type(exc).__name__}: {lines[-1]}"  # a build log's last line names the failure


@lru_cache(maxsize=1)
def _build() -> tuple[ModuleType | None, str]:
    return compile_source(SOURCE, "specframe_small_gemm")


def load_extension() -> ModuleType | None:
    """The compiled extension (built now if this machine has none yet), or None when it cannot be
    built here; :func:`unavailable_reason` then says why (warned once)."""
    module, reason = _build()
    if module is None and not getattr(load_extension, "_warned", False):
        load_extension._warned = True  # type: ignore[attr-defined]
        warnings.warn(f"specframe's native small-row GEMM is unavailable: {reason}", RuntimeWarning, stacklevel=2)
    return module


def unavailable_reason() -> str:
    """Why :func:`load_extension` returns None ("" when it builds)."""
    return _build()[1]
