"""bf16 linears for tree forwards on a CPU: half the weight bytes of float32, and a row's result
independent of the rows beside it.

A one-token forward of a small model streams every weight once, so its time is the bytes of
the weights; in bf16 they are half those of float32. :class:`Bf16Linear` keeps a copy of the
weight packed once into bf16 panels (``csrc/bf16_gemm.cpp``, compiled for this CPU at first
use, :func:`load_extension`), rounds its input to bf16 and accumulates the products in float32
with the CPU's bf16 dot products: AMX tiles (``amx_bf16``, after Linux grants the process the
tile data state) or AVX512_BF16 (``avx512_bf16``). Every output element is summed in one fixed
order for every row count, so a row's output does not depend on the rows beside it. That alone
does not make a tree node's logits equal those of the same token fed alone: attention and the
element-wise ops still sum by shape, and the next bf16 rounding widens their last-bit
differences (docs/performance.md measures greedy answers leaving the bf16 baseline). With the
exact forward on (:mod:`specframe.models.exact`, ``[target] exact = true``) they are equal bit
for bit, and greedy speculative output equals greedy decoding of the same bf16 model by
construction. Every row count takes the kernel (a prompt's prefill too): rows sent to another
GEMM would make a second model.

Only the linears change numerics: norms, attention, rotary embeddings and the embedding lookup
stay as the model runs them (float32). :func:`use_linears` installs the layers in a model;
``[target] linears = "bf16"``, ``specframe profile --linears bf16`` and
``load_causal_lm(..., linears="bf16")`` call it. On a CPU with neither feature it installs the
float32 path instead (the native kernel of :mod:`specframe.models.packed_linear`, or what the
caller names) and says so in one warning line.

The path is chosen from the CPU's features (AMX, else AVX512_BF16, else float32);
``SPECFRAME_BF16_PATH`` (one of :data:`PATHS`, or ``auto``) forces one, for tests and
comparisons. A forced path the CPU lacks is an error naming the feature.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn

from specframe.models import native_gemm

SOURCE = Path(__file__).parent / "csrc" / "bf16_gemm.cpp"
#: The kernel's paths, fastest first; ``"float32"`` is the fallback (no bf16 at all).
PATHS = ("amx", "avx512_bf16", "float32")
#: The CPU feature (``/proc/cpuinfo`` flag) each bf16 path needs.
FEATURES = {"amx": "amx_bf16", "avx512_bf16": "avx512_bf16"}
#: Environment variable forcing a path (``auto`` or one of :data:`PATHS`).
PATH_ENV = "SPECFRAME_BF16_PATH"
_PATH_CODE = {"avx512_bf16": 0, "amx": 1}


@lru_cache(maxsize=1)
def _build() -> tuple[ModuleType | None, str]:
    return native_gemm.compile_source(SOURCE, "specframe_bf16_gemm")


def load_extension() -> ModuleType | None:
    """The compiled extension (built now if this machine has none yet), or None when it cannot
    be built here (:func:`unavailable_reason` says why)."""
    return _build()[0]


def unavailable_reason() -> str:
    """Why :func:`load_extension` returns None ("" when it builds)."""
    return _build()[1]


@lru_cache(maxsize=1)
def available_paths() -> tuple[str, ...]:
    """The paths of :data:`PATHS` this CPU, OS and build run, fastest first (``"float32"`` is
    always there). Asking for AMX makes Linux grant this process the tile data state."""
    ops = load_extension()
    found = []
    if ops is not None and ops.has_amx_bf16() and ops.request_amx():
        found.append("amx")
    if ops is not None and ops.has_avx512_bf16():
        found.append("avx512_bf16")
    return (*found, "float32")


def missing(path: str) -> str:
    """Why ``path`` cannot run here, in words naming the feature ("" when it can)."""
    if path in available_paths():
        return ""
    if load_extension() is None:
        return f"the bf16 kernel does not build here ({unavailable_reason()})"
    if path == "amx" and load_extension().has_amx_bf16():
        return "this CPU has amx_bf16 but Linux refused the tile data permission (arch_prctl; kernel 5.16+)"
    return f"this CPU has no {FEATURES[path]}"


def select_path(path: str | None = None) -> str:
    """The path to run: ``path``, else ``$SPECFRAME_BF16_PATH``, else ``"auto"``: the fastest
    of :func:`available_paths`. Raises ValueError for an unknown name and RuntimeError for a
    path this CPU lacks (naming the feature)."""
    path = path or os.environ.get(PATH_ENV) or "auto"
    if path not in ("auto",) + PATHS:
        raise ValueError(f"bf16 path {path!r} ({PATH_ENV}): use one of auto, {', '.join(PATHS)}")
    if path == "auto":
        return available_paths()[0]
    why = missing(path)
    if why:
        raise RuntimeError(f"bf16 path {path!r}: {why}")
    return path


class Bf16Linear(nn.Module):
    """A drop-in ``nn.Linear`` (same ``weight``/``bias`` tensors) whose float32 inference forward
    rounds the input and a packed copy of the weight to bf16 and sums their products in float32,
    through AMX tiles or AVX512_BF16 (``path``), in one order per output element whatever the
    number of rows. Autograd, other dtypes and other devices take ``F.linear`` on the float32
    weight (not the bf16 model: inference only)."""

    kernel = "bf16"

    def __init__(self, linear: nn.Linear, path: str | None = None) -> None:
        super().__init__()
        path = select_path(path)
        if path == "float32":
            raise RuntimeError("Bf16Linear needs a bf16 path; this CPU has neither amx_bf16 nor avx512_bf16")
        ops = load_extension()
        self.path = path
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        w = self.weight.detach()
        if w.dtype != torch.float32 or w.device.type != "cpu":
            raise ValueError(f"Bf16Linear takes a float32 CPU linear, got {w.dtype} on {w.device}")
        self._packed = ops.pack(w)
        self._code = _PATH_CODE[path]
        self._linear = ops.linear  # the function: deep-copies as itself, unlike the module

    def repack(self) -> None:
        """Pack :attr:`weight` again (after it changed in place, e.g. a perturbed copy)."""
        self._packed = load_extension().pack(self.weight.detach())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``bf16(x) @ bf16(weight)^T + bias`` in float32 (``F.linear`` under autograd)."""
        if x.dtype != torch.float32 or x.device.type != "cpu" or torch.is_grad_enabled():
            return F.linear(x, self.weight, self.bias)
        rows = x.numel() // x.shape[-1] if x.numel() else 0
        out = self._linear(x.reshape(rows, x.shape[-1]), self._packed, self.out_features,
                           None if self.bias is None else self.bias.detach(), self._code)
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, kernel=bf16, path={self.path}"


def reference_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """What :class:`Bf16Linear` computes, slowly and plainly: both operands rounded to bf16,
    their products summed exactly (float64: a bf16 product is exact in float32, and float64
    holds a sum of a few thousand of them to well under a float32 ulp), the bias added. The
    kernel's float32 sums differ from it only by float32 rounding."""
    xb = x.to(torch.bfloat16).to(torch.float64)
    wb = weight.to(torch.bfloat16).to(torch.float64)
    out = xb @ wb.T
    if bias is not None:
        out = out + bias.to(torch.float64)
    return out


#: The order in which each path's instruction adds the two products of a k pair to the
#: accumulator: VDPBF16PS adds the odd one first (Intel's pseudocode; bitwise so on AMD Zen 4),
#: TDPBF16PS the even one first (Intel's pseudocode).
PAIR_ORDER = {"avx512_bf16": "odd", "amx": "even"}


def emulated_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                    first: str = "odd") -> torch.Tensor:
    """The kernel's arithmetic step by step in torch, for a bitwise check: operands rounded to
    bf16, one float32 accumulator per output starting at zero, and for each k pair in ascending
    order the ``first`` ("odd" or "even") product added and rounded, then the other, then the
    bias (a bf16 product is exact in float32, so only the additions round). Slow: one step per
    k pair. Denormals are not flushed as the instructions flush them."""
    k = x.shape[-1]
    pad = (0, k % 2)
    xb = F.pad(x.to(torch.bfloat16).float(), pad).reshape(x.shape[0], -1, 2)
    wb = F.pad(weight.detach().to(torch.bfloat16).float(), pad).reshape(weight.shape[0], -1, 2)
    one, two = (1, 0) if first == "odd" else (0, 1)
    acc = torch.zeros(x.shape[0], weight.shape[0], dtype=torch.float32)
    for p in range(xb.shape[1]):
        acc = acc + xb[:, p, one, None] * wb[None, :, p, one]
        acc = acc + xb[:, p, two, None] * wb[None, :, p, two]
    return acc if bias is None else acc + bias.detach()
