"""The index of each row's largest logit, as ``torch.max(dim=-1).indices`` gives it (the first
index of the maximum, a NaN counting as the maximum), for the greedy verdict.

On the CPU, torch's index reduction over a [5, 49152] float32 block took 150-380 us, ten times
its plain ``amax``: most of a 5-node chain's verification. The output layer's native kernel
(:class:`specframe.models.packed_linear.NativeLinear` with ``argmax_rows``) folds each row's
argmax into its forward while the outputs are in L1 and :func:`remember` keeps it; rows of those
logits are answered from it. Other float32 rows on the CPU go through ``argmax_rows`` of the
same extension (:mod:`specframe.models.native_gemm`), which scans each thread's own range of
columns in registers; other tensors, and a machine where the extension cannot be built, take
torch's reduction.
"""

from __future__ import annotations

import torch

from specframe.models import native_gemm


def native_argmax_available() -> bool:
    """Whether float32 CPU rows take the native scan here (the extension builds)."""
    return native_gemm.load_extension() is not None


#: The output layer's last fused answer: (its logits, their version then, the argmax).
_LAST: list[tuple[torch.Tensor, int, torch.Tensor]] = []


def remember(logits: torch.Tensor, argmax: torch.Tensor) -> None:
    """Keep the argmax the output layer's kernel folded into its forward (``linear_argmax``)
    for ``logits`` (``[rows, V]``), so :func:`row_argmax` of those rows (or a run of them) reads
    it instead of scanning logits the weight stream has evicted. The logits are held until the
    next call, so no other tensor can take their memory and be mistaken for them."""
    _LAST[:] = [(logits, -1 if logits.is_inference() else logits._version, argmax)]


def _remembered(x: torch.Tensor) -> torch.Tensor | None:
    """The remembered argmax of ``x`` when ``x`` is whole rows of the remembered logits, not
    written to since; else None."""
    if not _LAST:
        return None
    base, version, argmax = _LAST[0]
    cols = base.shape[-1]
    if x.shape[-1] != cols or x.dtype != base.dtype or not x.is_contiguous():
        return None
    if not x.is_inference() and x._version != version:  # (inference tensors keep no version)
        return None
    # Whole rows inside the held logits' memory (held, so no other tensor can live there):
    # addresses, not storages, since each storage() call builds an object (each counts after a forward).
    row_bytes = cols * base.element_size()
    offset = x.data_ptr() - base.data_ptr()
    first, rows = offset // row_bytes, x.numel() // cols
    if offset % row_bytes or first < 0 or first + rows > base.shape[0]:
        return None
    picked = argmax if first == 0 and rows == len(argmax) else argmax[first : first + rows]
    return picked if x.dim() == 2 else picked.view(x.shape[:-1])  # (each op counts after a forward)


def row_argmax(logits: torch.Tensor, fresh: bool = False) -> torch.Tensor:
    """``logits.max(dim=-1).indices`` (long, shape ``logits.shape[:-1]``), by the native scan
    where it applies; :func:`reference_row_argmax` is the rule it must keep.

    ``fresh``: the caller passes rows of the target's latest logits, not written since (the
    greedy verdict, straight after the forward): they take the argmax the output layer's kernel
    folded into the forward, when it did. A write to them is seen only outside inference mode
    (inference tensors keep no version), hence the caller's word."""
    if logits.device.type != "cpu" or logits.dtype != torch.float32 or logits.dim() == 0 or logits.numel() == 0:
        return reference_row_argmax(logits)
    fused = _remembered(logits) if fresh else None
    if fused is not None:
        return fused
    ext = native_gemm.load_extension()
    if ext is None:
        return reference_row_argmax(logits)
    return ext.argmax_rows(logits.reshape(-1, logits.shape[-1])).view(logits.shape[:-1])


def reference_row_argmax(logits: torch.Tensor) -> torch.Tensor:
    """torch's own reduction: what :func:`row_argmax` returns, on every device and dtype."""
    return logits.max(dim=-1).indices
