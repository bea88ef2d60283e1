"""Linear layers with weights pre-packed for small batches (float32 on CPU, MKL).

A speculative step runs the target on a handful of tree tokens. At that size a CPU GEMM is far
from the memory-bound limit: plain ``F.linear`` re-packs the whole weight matrix on every call,
so two rows cost about twice one row although they read the same weights. MKL can pack a weight
once for a given row count (``torch.ops.mkl._mkl_reorder_linear_weight``, what inductor's
freezing uses for float32 CPU linears). A packed weight only serves that exact row count, so
:class:`PackedLinear` keeps one packing per *bucket* of row counts and pads the rows up to the
next bucket; larger inputs (the prompt's prefill) take plain ``F.linear``.

Memory: one extra copy of the weights per bucket. Numerics: a packed GEMM adds in another order
than ``F.linear`` does, so logits differ from the unpacked model's in the last bits. Every arm of
an experiment runs the same packed model, so greedy speculative output still equals greedy
decoding of that model; against the *unpacked* model a float32 near-tie can flip.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32)


def packing_available() -> bool:
    """Whether this torch build has MKL's packed float32 linear."""
    return torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear")


class PackedLinear(nn.Module):
    """A drop-in ``nn.Linear`` (same ``weight``/``bias`` tensors) that uses packed weights for
    inputs of at most ``max(buckets)`` rows."""

    def __init__(self, linear: nn.Linear, buckets: tuple[int, ...] = DEFAULT_BUCKETS) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.buckets = tuple(sorted(buckets))
        with torch.no_grad():
            w = self.weight.detach()
            self._packed = {b: torch.ops.mkl._mkl_reorder_linear_weight(w, b) for b in self.buckets}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``F.linear(x, weight, bias)``, through a packed weight when the rows fit a bucket."""
        rows = x.numel() // x.shape[-1] if x.numel() else 0
        bucket = next((b for b in self.buckets if b >= rows), None)
        if bucket is None or x.dtype != torch.float32 or x.device.type != "cpu" or torch.is_grad_enabled():
            return F.linear(x, self.weight, self.bias)
        flat = x.reshape(rows, x.shape[-1])
        if bucket != rows:
            flat = F.pad(flat, (0, 0, 0, bucket - rows))
        out = torch.ops.mkl._mkl_linear(flat, self._packed[bucket], self.weight.detach(),
                                        None if self.bias is None else self.bias.detach(), bucket)
        return out[:rows].reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, buckets={self.buckets}"


def pack_linears(model: nn.Module, buckets: tuple[int, ...] = DEFAULT_BUCKETS) -> int:
    """Replace every float32 CPU ``nn.Linear`` of ``model`` by a :class:`PackedLinear`, in place;
    returns how many were replaced. Raises RuntimeError when the torch build has no MKL."""
    if not packing_available():
        raise RuntimeError("packed linears need a torch build with MKL (x86 CPU wheels have it)")
    todo = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
            if type(child) is nn.Linear and child.weight.dtype == torch.float32 and child.weight.device.type == "cpu"]
    for parent, name, child in todo:
        setattr(parent, name, PackedLinear(child, buckets))
    return len(todo)
