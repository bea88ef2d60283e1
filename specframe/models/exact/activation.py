"""Activations whose every element has one recipe, whatever the tensor's size or threads.

torch's element-wise kernels run a vector body and a scalar tail (and split between threads)
by the tensor's size, and their vector and scalar ``exp`` may differ in the last bit, so a
token's MLP could depend on how many tokens share the forward. SiLU (Llama, Qwen, Mistral,
SmolLM2, ...) runs the exact kernel's SiLU (``csrc/exact_ops.cpp``); any other transcendental
activation runs one row at a time through the model's own module (:class:`RowwiseActivation`:
the same call shape for every row; slower, correct by construction).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from specframe.models.exact.kernel import load_extension

#: Activation class names computed exactly by the kernel.
SILU = ("SiLUActivation", "SiLU")
#: Activation class names that are exact in torch already (no rounding, or one rounding).
EXACT_ALREADY = ("ReLU", "Identity", "ReLUSquaredActivation")


class ExactSiLU(nn.Module):
    """``x * sigmoid(x)`` through the exact kernel."""

    def __init__(self) -> None:
        super().__init__()
        ops = load_extension()
        if ops is None:
            raise RuntimeError("the exact kernel cannot be built here")
        self._silu = ops.silu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """SiLU of ``x`` (any shape; CPU float32 or float64)."""
        return self._silu(x)


class RowwiseActivation(nn.Module):
    """Runs ``inner`` on one row (the last dimension) at a time: every row sees the same call."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``inner(x)``, row by row."""
        rows = x.reshape(-1, 1, x.shape[-1])
        return torch.cat([self.inner(rows[i]) for i in range(rows.shape[0])]).reshape(x.shape)


def _is_activation(module: nn.Module) -> bool:
    cls = type(module)
    return cls.__module__.startswith(("transformers.activations", "torch.nn.modules.activation"))


def use_exact_activations(model: Any) -> dict[str, int]:
    """Replace every activation module of ``model`` in place: SiLU by :class:`ExactSiLU`,
    other transcendental ones by :class:`RowwiseActivation`. Returns how many of each kind."""
    counts = {"silu": 0, "rowwise": 0}
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if not _is_activation(child) or type(child).__name__ in EXACT_ALREADY:
                continue
            if type(child).__name__ in SILU:
                setattr(parent, name, ExactSiLU())
                counts["silu"] += 1
            else:
                setattr(parent, name, RowwiseActivation(child))
                counts["rowwise"] += 1
    return counts
