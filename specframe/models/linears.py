"""The ``linears`` switch: which arithmetic a loaded model's linears run, in one place for every
path that loads a target (experiments, replay, tuning, batching, ``specframe profile``, and
``load_causal_lm(..., linears=...)``).

``"float32"``: the model's own float32 linears, or the kernel ``packed_linears`` names
(:mod:`specframe.models.packed_linear`). ``"bf16"``: :mod:`specframe.models.bf16_linear`'s
row-invariant bf16 kernel; where the CPU has neither ``amx_bf16`` nor ``avx512_bf16``, the float32
path ``packed_linears`` names (the native kernel when it names none), with one warning line.
Torch-free at import, so a configuration can be checked before anything loads.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

#: Values of ``[target] linears``, ``specframe profile --linears`` and ``load_causal_lm(linears=)``.
LINEARS = ("float32", "bf16")
#: What an unset switch means (and what fingerprints leave out, so older runs still match).
DEFAULT_LINEARS = "float32"


def check_linears(linears: object) -> str:
    """``linears`` if it is one of :data:`LINEARS`, else ValueError naming them."""
    if linears not in LINEARS:
        raise ValueError(f"linears {linears!r}: use one of {', '.join(LINEARS)}")
    return str(linears)


def apply_linears(model: Any, linears: str = DEFAULT_LINEARS, packed_linears: bool | str = False) -> str:
    """Install ``linears`` in ``model`` (in place) the way every loader does, and return what runs
    them (:func:`linears_label`): ``"bf16-amx"``,
    ``"bf16-avx512_bf16"``, ``"float32-native"`` / ``-onednn`` / ``-mkl`` or ``"float32"``.
    ``packed_linears`` is the float32 kernel setting of ``[target] packed_linears`` (also the
    fallback of ``"bf16"``)."""
    from specframe.models.packed_linear import kernel_option, pack_linears

    if check_linears(linears) == "bf16":
        return use_linears(model, "bf16", fallback=kernel_option(packed_linears) if packed_linears else "native")
    if packed_linears:
        pack_linears(model, kernel_option(packed_linears))
    return linears_label(model)


def planned_label(linears: str, packed_linears: bool | str = False) -> str:
    """What :func:`apply_linears` will install on this machine, before any model loads (what
    run.json records): ``"bf16-<path>"``, ``"float32 (bf16 unsupported here)"``, or the float32
    setting (``"float32"``, ``"float32-<kernel>"``; ``auto`` is decided by timing, at load)."""
    if check_linears(linears) == "bf16":
        from specframe.models.bf16_linear import select_path

        path = select_path()
        return f"bf16-{path}" if path != "float32" else "float32 (bf16 unsupported here)"
    if packed_linears:
        from specframe.models.packed_linear import kernel_option

        return f"float32-{kernel_option(packed_linears)}"
    return "float32"


def use_linears(model: Any, linears: str = "bf16", fallback: str | None = "native",
                path: str | None = None) -> str:
    """Install ``linears`` (one of :data:`LINEARS`) in every float32 CPU ``nn.Linear`` of
    ``model``, in place, and return what runs them (:func:`linears_label`).

    ``"bf16"``: :class:`~specframe.models.bf16_linear.Bf16Linear` on ``path`` (None:
    :func:`~specframe.models.bf16_linear.select_path`). Where the CPU has
    neither bf16 feature, ``fallback`` is installed instead, a kernel of
    :func:`~specframe.models.packed_linear.pack_linears` (None: the plain float32 linears), with
    one warning line saying so. ``"float32"`` leaves the model as it is. Raises ValueError
    naming the valid values for anything else."""
    from specframe.models.bf16_linear import Bf16Linear, select_path
    from specframe.models.packed_linear import _linears, pack_linears

    if check_linears(linears) == "float32":
        return linears_label(model)
    chosen = select_path(path)
    if chosen != "float32":
        for parent, name, child in _linears(model):
            setattr(parent, name, Bf16Linear(child, chosen))
        return linears_label(model)
    warnings.warn(f"bf16 linears: {_fallback_reason(path)}; running float32 {fallback or 'plain'} linears instead",
                  RuntimeWarning, stacklevel=2)
    if fallback and linears_label(model) == "float32":
        pack_linears(model, fallback if fallback != "native" or _native_builds() else "auto")
    return linears_label(model)


def _fallback_reason(path: str | None) -> str:
    """Why :func:`~specframe.models.bf16_linear.select_path` answered ``"float32"``, in words."""
    from specframe.models.bf16_linear import PATH_ENV, load_extension, unavailable_reason

    if (path or os.environ.get(PATH_ENV)) == "float32":
        return f"the float32 path was asked for ({PATH_ENV})" if not path else "the float32 path was asked for"
    if load_extension() is None:
        return f"the bf16 kernel does not build here ({unavailable_reason()})"
    return "this CPU has neither amx_bf16 nor avx512_bf16"


def _native_builds() -> bool:
    from specframe.models.packed_linear import native_available

    return native_available()


def linears_label(model: Any) -> str:
    """What runs ``model``'s linears: ``"bf16-amx"`` / ``"bf16-avx512_bf16"``, a float32
    kernel ``"float32-native"`` / ``"-onednn"`` / ``"-mkl"``, or ``"float32"`` (plain)."""
    from specframe.models.bf16_linear import Bf16Linear
    from specframe.models.packed_linear import linear_kernel

    layer = next((m for m in model.modules() if isinstance(m, Bf16Linear)), None)
    if layer is not None:
        return f"bf16-{layer.path}"
    kernel = linear_kernel(model)
    return f"float32-{kernel}" if kernel else "float32"
