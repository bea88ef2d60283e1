"""Linear layers for the small row counts of tree forwards (float32 on CPU): specframe's own
small-row GEMM, oneDNN or MKL-packed.

A speculative step runs the target on a handful of tree tokens. At that size a CPU GEMM is far
from the memory-bound limit: plain ``F.linear`` re-packs the whole weight matrix on every call,
so two rows cost about twice one row although they read the same weights. MKL can pack a weight
once for a given row count (``torch.ops.mkl._mkl_reorder_linear_weight``, what inductor's
freezing uses for float32 CPU linears). A packed weight only serves that exact row count, so
:class:`PackedLinear` keeps one packing per *bucket* of row counts and pads the rows up to the
next bucket; larger inputs (the prompt's prefill) take plain ``F.linear``.

Which library is fastest depends on the CPU. MKL takes its slow paths on AMD processors: on a
2-core AMD EPYC (Zen 4) a packed 16-row forward of SmolLM2-135M cost 2.3 one-row forwards,
while oneDNN's matmul (``torch.ops.mkldnn._linear_pointwise``, JIT kernels for the CPU at hand)
cost 1.6 and was as fast for one row; on a 2-core Intel Xeon packed MKL is faster than oneDNN
(docs/results.md). :class:`OneDnnLinear` needs no packed copies. :class:`NativeLinear` runs
``csrc/small_gemm.cpp`` (:mod:`specframe.models.native_gemm` compiles it for this CPU at first use):
on a 2-core Intel Xeon it made a SmolLM2-135M tree forward 15-16% faster than packed MKL at
every size from 1 to 16 tokens, and a row's result does not depend on the number of rows.
:func:`pack_linears` with ``kernel="auto"`` times whole forwards of the model at 1 and 16 tokens
with each available kernel, keeps the incumbent unless another is clearly faster, and caches the
choice beside the cost curves, so every later load on this machine takes the same kernel (timing
the largest linear alone flipped between near-tied kernels from run to run). A choice whose
repetitions spread too wide (a busy machine: :mod:`specframe.models.timing`) is timed again, and
if the machine stays busy it serves this process only, uncached, with one warning line.

Memory: one extra copy of the weights per bucket (MKL), one in all (native). Both copies are
taken when the layer is wrapped, so weights changed later are not seen. Numerics: a packed GEMM adds in another order
than ``F.linear`` does, so logits differ from the unpacked model's in the last bits. Every arm of
an experiment runs the same packed model, so greedy speculative output still equals greedy
decoding of that model; against the *unpacked* model a float32 near-tie can flip.
"""

from __future__ import annotations

import statistics
import time
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from specframe.models import native_gemm, row_argmax, timing
from specframe.models.cache_keys import (kernel_choice_key, load_kernel_choice, profile_command, remember_kernel_choice,
                                         save_kernel_choice)

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32)
#: Kernels :func:`pack_linears` can install (``"auto"``: the fastest on this machine).
KERNELS = ("native", "onednn", "mkl")
#: Most rows :class:`NativeLinear` takes: row tiles past the first re-read a cached panel without
#: the weight stream to hide behind, and at 64 rows a SmolLM2 forward was already faster through
#: ``F.linear`` (142 against 128 ms; 103 against 105 at 48). A prefill goes to ``F.linear``.
NATIVE_MAX_ROWS = 48


def packing_available() -> bool:
    """Whether this torch build has MKL's packed float32 linear."""
    return torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear")


def onednn_available() -> bool:
    """Whether this torch build has oneDNN's float32 linear."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def native_available() -> bool:
    """Whether specframe's own small-row GEMM builds here (a C++ compiler; the first call
    compiles it, later processes load the cached build)."""
    return native_gemm.load_extension() is not None


def kernel_available(kernel: str) -> bool:
    """Whether this machine has ``kernel`` (one of :data:`KERNELS`); only ``"native"`` may
    compile anything to find out."""
    return {"native": native_available, "onednn": onednn_available, "mkl": packing_available}[kernel]()


def available_kernels() -> tuple[str, ...]:
    """The kernels of :data:`KERNELS` this machine has."""
    return tuple(k for k in KERNELS if kernel_available(k))


def _plain(x: torch.Tensor) -> bool:
    """Inputs the fast kernels do not take: not float32 on the CPU, or autograd is on."""
    return x.dtype != torch.float32 or x.device.type != "cpu" or torch.is_grad_enabled()


class NativeLinear(nn.Module):
    """A drop-in ``nn.Linear`` (same ``weight``/``bias`` tensors) whose float32 inference forward
    of at most :data:`NATIVE_MAX_ROWS` rows runs specframe's small-row GEMM
    (``csrc/small_gemm.cpp``, compiled for this CPU) on a weight packed once into one-vector
    panels; anything else takes ``F.linear``. Each row's result is the same whatever the number
    of rows in the call."""

    kernel = "native"

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        ops = native_gemm.load_extension()
        if ops is None:
            raise RuntimeError("the native kernel cannot be built here (see specframe.models.native_gemm.unavailable_reason)")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        #: Most rows the kernel takes (None: every row count, as the exact forward needs, for
        #: a row's result must not depend on which kernel its call size picks).
        self.max_rows: int | None = NATIVE_MAX_ROWS
        w = self.weight.detach()
        self._packed = ops.pack(w) if w.dtype == torch.float32 and w.device.type == "cpu" else None
        # The extension's function, not its module: a builtin function deep-copies as itself (a
        # module object does not copy), and holding it spares a lookup on each of a forward's
        # two hundred calls.
        self._linear = ops.linear
        self._linear_argmax = ops.linear_argmax
        #: Fold each output row's argmax into the forward (the model's output layer: the
        #: greedy verdict reads it through :func:`specframe.models.row_argmax.row_argmax`).
        self.argmax_rows = False

    def repack(self) -> None:
        """Pack :attr:`weight` again (after it changed in place, e.g. a perturbed copy)."""
        if self._packed is not None:
            self._packed = native_gemm.load_extension().pack(self.weight.detach())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``F.linear(x, weight, bias)``, through the packed panels for a few float32 rows."""
        rows = x.numel() // x.shape[-1] if x.numel() else 0
        if not 0 < rows <= (self.max_rows or rows) or self._packed is None or _plain(x):
            return F.linear(x, self.weight, self.bias)
        bias = None if self.bias is None else self.bias.detach()
        if self.argmax_rows:
            out, argmax = self._linear_argmax(x.reshape(rows, x.shape[-1]), self._packed, self.out_features, bias)
            row_argmax.remember(out, argmax)
        else:
            out = self._linear(x.reshape(rows, x.shape[-1]), self._packed, self.out_features, bias)
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, kernel=native"


class OneDnnLinear(nn.Module):
    """A drop-in ``nn.Linear`` (same ``weight``/``bias`` tensors) whose inference forward in
    float32 on the CPU runs oneDNN's matmul; anything else takes ``F.linear``."""

    kernel = "onednn"

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``F.linear(x, weight, bias)`` through oneDNN."""
        if _plain(x) or self.weight.dtype != torch.float32:
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.weight.detach(),
                                                  None if self.bias is None else self.bias.detach(), "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, kernel=onednn"


class PackedLinear(nn.Module):
    """A drop-in ``nn.Linear`` (same ``weight``/``bias`` tensors) that uses packed weights for
    inputs of at most ``max(buckets)`` rows (MKL's float32 GEMM on a weight packed per bucket)."""

    kernel = "mkl"

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
        if bucket is None or _plain(x):
            return F.linear(x, self.weight, self.bias)
        flat = x.reshape(rows, x.shape[-1])
        if bucket != rows:
            flat = F.pad(flat, (0, 0, 0, bucket - rows))
        out = torch.ops.mkl._mkl_linear(flat, self._packed[bucket], self.weight.detach(),
                                        None if self.bias is None else self.bias.detach(), bucket)
        return out[:rows].reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, buckets={self.buckets}"


def _linears(model: nn.Module) -> list[tuple[nn.Module, str, nn.Linear]]:
    """(parent, attribute, layer) of every float32 CPU ``nn.Linear`` of ``model``."""
    return [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
            if type(child) is nn.Linear and child.weight.dtype == torch.float32 and child.weight.device.type == "cpu"]


#: Row counts at which "auto" times whole forwards: a plain decoding step and a typical tree.
CHOICE_ROWS = (1, 16)
#: How much faster another kernel must run those forwards than the incumbent (the cached
#: choice, else the first available of :data:`KERNELS`) to replace it: on a near tie the
#: measured order flips from run to run, and with it the cost curve a run reads.
SWITCH_MARGIN = 0.05


def fastest_kernel(model: nn.Module, rows: tuple[int, ...] = CHOICE_ROWS, reps: int = timing.REPS,
                   refresh: bool = False) -> str:
    """The available kernel that runs ``model`` fastest: whole forwards of each of ``rows``
    tokens (:func:`kernel_runs`), another kernel replacing the incumbent only when it
    is more than :data:`SWITCH_MARGIN` faster (:func:`choose_kernel`). The choice is cached
    beside the cost curves (:func:`~specframe.models.cache_keys.kernel_choice_key`: model, CPU,
    threads, torch version), so later processes take it without timing; ``refresh`` times
    again, with the cached choice as the incumbent. Timings that spread wider than
    :func:`~specframe.models.timing.max_spread` are taken again; if they stay that wide the
    choice serves this process only, uncached, with one warning line."""
    kernels = available_kernels()
    if not kernels:
        raise RuntimeError("packed linears need a C++ compiler (native kernel) or a torch build with oneDNN "
                           "or MKL (x86 CPU wheels have both)")
    if len(kernels) < 2 or not _linears(model):
        return kernels[0]
    key = kernel_choice_key(model)
    cached = load_kernel_choice(key)
    if cached in kernels and not refresh:
        return cached
    got = timing.until_quiet(lambda: kernel_runs(model, kernels, rows, reps), kernel_spread, "kernel choice")
    seconds = {k: statistics.median(t) for k, t in got.value.items()}
    choice = choose_kernel(seconds, cached if cached in kernels else kernels[0])
    if got.quiet:
        save_kernel_choice(key, choice, seconds, rows, kernel_spread(got.value))
    else:
        remember_kernel_choice(key, choice)
        warnings.warn(timing.busy_line(f"the kernel choice {key}", kernel_spread(got.value), got.tries,
                                       f"the {choice} kernel", profile_command(model, "auto")),
                      timing.BusyMachineWarning, stacklevel=2)
    return choice


def choose_kernel(seconds: dict[str, float], incumbent: str, margin: float = SWITCH_MARGIN) -> str:
    """The fastest kernel of ``seconds`` if it beats ``incumbent`` by more than ``margin``
    (a fraction of its time), else ``incumbent``."""
    best = min(seconds, key=lambda k: (seconds[k], k != incumbent))
    return best if seconds[incumbent] > seconds[best] * (1 + margin) else incumbent


def kernel_spread(runs: dict[str, list[float]]) -> float:
    """The widest :func:`~specframe.models.timing.relative_spread` of the kernels' repetitions:
    a choice is only as sure as its noisiest timing."""
    return max(timing.relative_spread(t) for t in runs.values())


def time_model_kernels(model: nn.Module, kernels: tuple[str, ...], rows: tuple[int, ...] = CHOICE_ROWS,
                       reps: int = timing.REPS) -> dict[str, float]:
    """Seconds of ``model``'s forwards of each of ``rows`` tokens (summed) with each kernel in
    its linears: the median of :func:`kernel_runs`."""
    return {k: statistics.median(t) for k, t in kernel_runs(model, kernels, rows, reps).items()}


def kernel_runs(model: nn.Module, kernels: tuple[str, ...], rows: tuple[int, ...] = CHOICE_ROWS,
                reps: int = timing.REPS) -> dict[str, list[float]]:
    """Seconds of ``model``'s forwards of each of ``rows`` tokens (summed) with each kernel in
    its linears, ``reps`` repetitions each (a repetition at least
    :data:`~specframe.models.timing.MIN_SAMPLE_SECONDS` long: :func:`~specframe.models.timing.sample`),
    the kernels taking turns in every round so a change of load hits all of them (round 0 warms
    up). The model's linears are put back."""
    layers = _linears(model)
    wrapped = {k: [_wrap(child, k, rows) for _, _, child in layers] for k in kernels}
    vocab = int(getattr(getattr(model, "config", None), "vocab_size", 0) or 2)
    inputs = [torch.arange(r).remainder(vocab).unsqueeze(0) for r in rows]
    times: dict[str, list[float]] = {k: [] for k in kernels}

    def once() -> float:
        start = time.perf_counter()
        for ids in inputs:
            model(input_ids=ids, use_cache=False)
        return time.perf_counter() - start
    try:
        with torch.no_grad():
            for rep in range(reps + 1):
                for k in kernels:
                    for (parent, name, _), module in zip(layers, wrapped[k]):
                        setattr(parent, name, module)
                    spent = timing.sample(once) if rep else once()
                    if rep:
                        times[k].append(spent)
    finally:
        for parent, name, child in layers:
            setattr(parent, name, child)
    return times


def _wrap(linear: nn.Linear, kernel: str, buckets: tuple[int, ...] = DEFAULT_BUCKETS) -> nn.Module:
    if kernel == "native":
        return NativeLinear(linear)
    return OneDnnLinear(linear) if kernel == "onednn" else PackedLinear(linear, buckets)


def pack_linears(model: nn.Module, kernel: str = "auto", buckets: tuple[int, ...] = DEFAULT_BUCKETS) -> str:
    """Replace every float32 CPU ``nn.Linear`` of ``model`` in place by a fast small-batch one:
    ``kernel`` ``"native"`` (:class:`NativeLinear`), ``"onednn"`` (:class:`OneDnnLinear`),
    ``"mkl"`` (:class:`PackedLinear`, MKL packing per row bucket) or ``"auto"``
    (:func:`fastest_kernel`). Returns the kernel used.
    Raises ValueError for an unknown kernel and RuntimeError when the torch build lacks it."""
    if kernel not in ("auto",) + KERNELS:
        raise ValueError(f"linear kernel {kernel!r}: use one of auto, {', '.join(KERNELS)}")
    if kernel == "auto":
        kernel = fastest_kernel(model)
    # Only the kernel asked for: checking the others would compile the native one for an "mkl" user.
    if not kernel_available(kernel):
        if kernel == "native":
            raise RuntimeError(f"the native linear kernel cannot be built here: {native_gemm.unavailable_reason()}")
        library = {"mkl": "MKL", "onednn": "oneDNN"}[kernel]
        raise RuntimeError(f"packed linears need a torch build with {library} (x86 CPU wheels have both)")
    for parent, name, child in _linears(model):
        setattr(parent, name, _wrap(child, kernel, buckets))
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if isinstance(output, NativeLinear):  # the greedy verdict's argmax comes with the logits
        output.argmax_rows = True
    return kernel


def kernel_option(packed_linears: bool | str) -> str:
    """The :func:`pack_linears` kernel of a ``packed_linears`` setting that is on: ``True``
    means ``"auto"``, a string names the kernel."""
    return "auto" if packed_linears is True else str(packed_linears)


def linear_kernel(model: nn.Module) -> str | None:
    """The kernel :func:`pack_linears` installed in ``model`` (None: plain linears)."""
    return next((m.kernel for m in model.modules() if isinstance(m, (NativeLinear, OneDnnLinear, PackedLinear))), None)
