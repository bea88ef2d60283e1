"""The exact forward: a token's logits depend only on its own prefix (its tokens and positions),
bit for bit, not on how many tokens share the forward, the draft tree around it, the batch, the
layout or padding, the KV cache kind or the thread count.

:func:`use_exact` turns a loaded CPU model into it, in place, without touching its code:

- attention: :mod:`~specframe.models.exact.attention`, registered with transformers' attention
  interface (a row visits exactly its visible keys, in logical order, one fixed accumulation);
- linears: specframe's row-invariant kernels for every row count, the prompt's prefill and the
  LM head included (float32: :class:`~specframe.models.packed_linear.NativeLinear` without its
  48-row limit; bf16: :class:`~specframe.models.bf16_linear.Bf16Linear`, already so);
- rotary embeddings: :mod:`~specframe.models.exact.rotary` (a table built in fixed blocks);
- activations: :mod:`~specframe.models.exact.activation`.

Norms, residual adds, the embedding lookup and the rotary products were checked and need no
change: torch reduces a norm's row along its contiguous last dimension in one order whatever
the rows beside it and the threads (tests/test_exact.py checks it over row counts 1-600 and 1-3
threads), and the others round once per element. docs/performance.md, "Exact losslessness",
says how each was checked.
"""

from __future__ import annotations

from typing import Any

import torch

from specframe.models.exact.attention import NAME, ExactUnavailableError, register

__all__ = ["NAME", "ExactUnavailableError", "check_exact_device", "is_exact", "use_exact"]


def check_exact_device(device: str | torch.device | None) -> None:
    """Raise :class:`ExactUnavailableError` in one line when ``device`` has no exact kernel
    (only the CPU has one)."""
    kind = torch.device(device).type if device is not None else "cpu"
    if kind != "cpu":
        raise ExactUnavailableError(
            f"exact forward: no exact attention kernel for {kind} (specframe_exact_ops is CPU only; "
            "docs/performance.md says what a GPU kernel must satisfy); set [target] exact = false on this device")


def _exact_linears(model: Any) -> None:
    """Every linear row-invariant at every row count: bf16 ones are; float32 ones go through
    the native kernel with no row limit."""
    from torch import nn

    from specframe.models import native_gemm
    from specframe.models.packed_linear import NativeLinear, OneDnnLinear, PackedLinear

    if native_gemm.load_extension() is None:
        raise ExactUnavailableError(
            f"exact forward: the row-invariant float32 linear kernel does not build here ({native_gemm.unavailable_reason()})")
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear or isinstance(child, (OneDnnLinear, PackedLinear)):
                child = NativeLinear(child)
                setattr(parent, name, child)
            if isinstance(child, NativeLinear):
                child.max_rows = None


def use_exact(model: Any) -> Any:
    """Make ``model`` (a float32 CPU transformers causal LM, linears float32 or bf16) run the exact
    forward, in place; returns it. Raises :class:`ExactUnavailableError` in one line for another
    device or dtype, or where a kernel does not build."""
    param = next(model.parameters())
    check_exact_device(param.device)
    if param.dtype != torch.float32:
        raise ExactUnavailableError(f"exact forward: float32 models only (this one is {str(param.dtype).replace('torch.', '')}); "
                                    "bf16 arithmetic comes from [target] linears = \"bf16\"")
    if is_exact(model):
        return model
    from specframe.models.exact.activation import use_exact_activations
    from specframe.models.exact.kernel import load_extension, unavailable_reason
    from specframe.models.exact.rotary import use_exact_rotary

    if load_extension() is None or not register():
        raise ExactUnavailableError(f"exact forward: the exact attention kernel does not build here ({unavailable_reason()})")
    _exact_linears(model)
    use_exact_rotary(model)
    use_exact_activations(model)
    model.set_attn_implementation(NAME)
    return model


def is_exact(model: Any) -> bool:
    """Whether ``model`` runs the exact forward (:func:`use_exact`)."""
    return getattr(getattr(model, "config", None), "_attn_implementation", None) == NAME
