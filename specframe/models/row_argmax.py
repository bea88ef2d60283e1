"""The index of each row's largest logit, as ``torch.max(dim=-1).indices`` gives it (the first
index of the maximum, a NaN counting as the maximum), for the greedy verdict.

On the CPU, torch's index reduction over a [5, 49152] float32 block took 150-380 us, ten times
its plain ``amax``: most of a 5-node chain's verification. float32 rows on the CPU go through
``argmax_rows`` of specframe's small-row GEMM extension (:mod:`specframe.models.native_gemm`,
the output layer's kernel), which scans each thread's own range of columns in registers; other
tensors, and a machine where the extension cannot be built, take torch's reduction.
"""

from __future__ import annotations

import torch

from specframe.models import native_gemm


def native_argmax_available() -> bool:
    """Whether float32 CPU rows take the native scan here (the extension builds)."""
    return native_gemm.load_extension() is not None


def row_argmax(logits: torch.Tensor) -> torch.Tensor:
    """``logits.max(dim=-1).indices`` (long, shape ``logits.shape[:-1]``), by the native scan
    where it applies; :func:`reference_row_argmax` is the rule it must keep."""
    if logits.device.type != "cpu" or logits.dtype != torch.float32 or logits.dim() == 0 or logits.numel() == 0:
        return reference_row_argmax(logits)
    ext = native_gemm.load_extension()
    if ext is None:
        return reference_row_argmax(logits)
    return ext.argmax_rows(logits.reshape(-1, logits.shape[-1])).view(logits.shape[:-1])


def reference_row_argmax(logits: torch.Tensor) -> torch.Tensor:
    """torch's own reduction: what :func:`row_argmax` returns, on every device and dtype."""
    return logits.max(dim=-1).indices
