"""The greedy verdict's argmax (specframe.models.row_argmax): the native scan of float32 CPU rows
gives torch's own reduction's index for every row, ties (the first maximal index), NaN (the first
NaN), infinities and widths on both sides of a register and of the threads' column split."""

import pytest
import torch
from hypothesis import given, strategies as st

from specframe.models.row_argmax import native_argmax_available, reference_row_argmax, row_argmax

NATIVE = native_argmax_available()
# Register edges (8, 16 lanes), the single-thread limit (8192 columns) and a vocabulary's width.
WIDTHS = (1, 7, 8, 9, 15, 16, 17, 31, 33, 100, 8191, 8192, 8193, 16400, 49152)
SPECIALS = (float("nan"), float("inf"), float("-inf"))


@st.composite
def logit_rows(draw) -> torch.Tensor:
    rows, cols = draw(st.integers(1, 6)), draw(st.sampled_from(WIDTHS))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    # A few distinct values make ties common; a wide draw makes them rare.
    levels = draw(st.sampled_from((3, 1 << 20)))
    x = torch.randint(0, levels, (rows, cols), generator=g).float()
    for value in SPECIALS:
        if draw(st.booleans()):
            x[torch.rand(rows, cols, generator=g) < draw(st.sampled_from((1e-4, 0.01, 1.0)))] = value
    return x


@pytest.mark.skipif(not NATIVE, reason="the native kernel does not build here (no C++ compiler)")
@given(logit_rows())
def test_native_argmax_is_torchs_first_maximal_index(x):
    assert torch.equal(row_argmax(x), reference_row_argmax(x))


@pytest.mark.skipif(not NATIVE, reason="the native kernel does not build here (no C++ compiler)")
def test_native_argmax_reads_rows_of_a_wider_tensor_and_keeps_leading_dims():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 7, 49152, generator=g)
    rows = logits[0, :5]  # the verifier's view of a forward's output
    assert torch.equal(row_argmax(rows), rows.max(dim=-1).indices)
    assert row_argmax(logits).shape == (1, 7) and torch.equal(row_argmax(logits), logits.max(dim=-1).indices)
    strided = torch.randn(49152, 3, generator=g).t()  # rows that are not contiguous
    assert torch.equal(row_argmax(strided), strided.max(dim=-1).indices)


def test_other_dtypes_take_torchs_reduction():
    x = torch.tensor([[1.0, 3.0, 3.0], [float("nan"), 0.0, float("nan")]], dtype=torch.float64)
    assert row_argmax(x).tolist() == [1, 0]


@pytest.mark.skipif(not NATIVE, reason="the native kernel does not build here (no C++ compiler)")
@given(seed=st.integers(0, 2**31 - 1), rows=st.integers(1, 20), n_out=st.sampled_from((1, 5, 16, 17, 40, 8193)),
       kind=st.sampled_from(("wide", "ties", "nan", "-inf bias")))
def test_the_output_layers_fused_argmax_is_torchs(seed, rows, n_out, kind):
    """linear_argmax folds each row's argmax into the GEMM, panel by panel and thread by thread:
    the same index as torch's reduction over the logits it returns (ties, NaN, a -inf row)."""
    from specframe.models import native_gemm

    ext = native_gemm.load_extension()
    g = torch.Generator().manual_seed(seed)
    levels = 2 if kind == "ties" else 1 << 20
    weight = torch.randint(0, levels, (n_out, 8), generator=g).float()
    x = torch.randint(0, levels, (rows, 8), generator=g).float()
    if kind == "nan":
        x[torch.rand(rows, 8, generator=g) < 0.1] = float("nan")
    bias = torch.full((n_out,), float("-inf")) if kind == "-inf bias" else None
    logits, argmax = ext.linear_argmax(x, ext.pack(weight), n_out, bias)
    assert torch.equal(argmax, logits.max(dim=-1).indices)


@pytest.mark.skipif(not NATIVE, reason="the native kernel does not build here (no C++ compiler)")
def test_rows_of_the_output_layers_logits_take_its_fused_argmax_until_written():
    from specframe.models import row_argmax as module
    from specframe.models.packed_linear import NativeLinear

    g = torch.Generator().manual_seed(1)
    head = NativeLinear(torch.nn.Linear(16, 300, bias=False))
    head.argmax_rows = True
    with torch.no_grad():
        logits = head(torch.randn(1, 6, 16, generator=g))
    rows = logits[0, 2:5]
    assert module._remembered(rows) is not None
    assert torch.equal(row_argmax(rows, fresh=True), rows.max(dim=-1).indices)
    rows[0, 7] = 1e9  # written since: the remembered answer is stale and must not be used
    assert module._remembered(rows) is None and int(row_argmax(rows, fresh=True)[0]) == 7
    other = logits.clone()[0, 2:5]  # the same values elsewhere: scanned, not matched
    assert module._remembered(other) is None and torch.equal(row_argmax(other, fresh=True), other.max(dim=-1).indices)
