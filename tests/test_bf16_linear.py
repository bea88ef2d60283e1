"""bf16 linears (specframe.models.bf16_linear): each path the CPU has agrees with a plain
reference, sums in the order its instruction is documented to, and gives a row the same bits
whatever rows share the call; the float32 fallback, the path switch and its errors; lossless
speculative decoding on a model whose linears are bf16. Tests of a path this CPU lacks skip
naming the feature; the fallback's tests run everywhere."""

import copy
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import specframe
from specframe.models import bf16_linear
from specframe.models.bf16_linear import (PAIR_ORDER, Bf16Linear, emulated_linear, missing, reference_linear,
                                          select_path)
from specframe.models.linears import linears_label, use_linears
from specframe.testing.models import tiny_model

#: The largest tree a policy builds on the cost curve's sizes (QUICK_SIZES): the row counts
#: whose invariance matters.
MAX_ROWS = 64
each_path = pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.skipif(
    bool(missing(p)), reason=f"bf16 path {p}: {missing(p)}")) for p in ("amx", "avx512_bf16")])


@each_path
@pytest.mark.parametrize("rows", [1, 2, 7, 16, 17, 33, MAX_ROWS, 100])
@pytest.mark.parametrize("shape", [(48, 100), (70, 16), (576, 192)])  # K not a multiple of 32; a partial panel
def test_bf16_linear_equals_the_exact_sum_of_rounded_operands_up_to_float32_rounding(path, rows, shape):
    k, n = shape
    torch.manual_seed(rows * 7 + k)
    lin = nn.Linear(k, n)
    x = torch.randn(rows, k)
    with torch.no_grad():
        got = Bf16Linear(lin, path)(x)
    want = reference_linear(x, lin.weight.detach(), lin.bias.detach())
    scale = reference_linear(x.abs(), lin.weight.detach().abs()) + 1  # the sum of |products|: what rounding scales with
    assert got.dtype == torch.float32 and got.shape == (rows, n)
    assert ((got.double() - want).abs() <= scale * k * 2 ** -23).all()
    # And not merely float32's answer: bf16 rounding of the operands is visible.
    assert not torch.allclose(got, lin(x).detach(), rtol=0, atol=1e-6)


@each_path
@pytest.mark.parametrize("bias", [True, False])
def test_bf16_linear_sums_in_the_documented_order_bit_for_bit(path, bias):
    if path == "amx":
        pytest.skip("TDPBF16PS's pair order is checked by scripts/device_bf16_check.sh (printed, not asserted)")
    torch.manual_seed(3)
    lin = nn.Linear(90, 40, bias=bias)
    x = torch.randn(5, 90)
    with torch.no_grad():
        got = Bf16Linear(lin, path)(x)
    assert torch.equal(got, emulated_linear(x, lin.weight, lin.bias, PAIR_ORDER[path]))


@each_path
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_a_row_is_bitwise_the_same_whatever_rows_share_the_call(path, data):
    """Row invariance: every output element is summed in one order for every row count from 1
    to the largest tree, so a tree node's logits are those of the token fed alone."""
    k = data.draw(st.sampled_from([16, 40, 64, 96]), label="in_features")
    n = data.draw(st.sampled_from([16, 24, 80]), label="out_features")
    rows = data.draw(st.integers(1, MAX_ROWS), label="rows")
    seed = data.draw(st.integers(0, 2 ** 16), label="seed")
    gen = torch.Generator().manual_seed(seed)
    lin = nn.Linear(k, n)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(n, k, generator=gen))
        layer = Bf16Linear(lin, path)
        x = torch.randn(rows, k, generator=gen) * torch.rand(rows, 1, generator=gen) * 10
        together = layer(x)
        i = data.draw(st.integers(0, rows - 1), label="row")
        others = torch.randn(data.draw(st.integers(0, MAX_ROWS - 1), label="company"), k, generator=gen)
        at = data.draw(st.integers(0, len(others)), label="position")
        mixed = layer(torch.cat([others[:at], x[i:i + 1], others[at:]]))
        assert torch.equal(layer(x[i:i + 1])[0], together[i])
        assert torch.equal(mixed[at], together[i])


@each_path
def test_a_bf16_model_decodes_speculatively_as_it_decodes_greedily(path):
    """Lossless keeps its meaning: greedy output of the same bf16 model, every forward (prompt,
    tree, single token) through the same kernel."""
    model = tiny_model("llama", seed=0, dtype=torch.float32)
    assert use_linears(model, "bf16", path=path) == f"bf16-{path}" == linears_label(model)
    assert not any(type(m) is nn.Linear for m in model.modules())
    prompt = [5, 6, 7, 8, 9]
    ref = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=20)[0, len(prompt):].tolist()
    dec = specframe.SpecDecoder.build(target=model, drafter=("ngram", {}), policy=("talon", {"budget": 16}),
                                      verifier="greedy")
    assert dec.generate(prompt, max_new_tokens=20, eos_token_id=None).tokens == ref


@each_path
def test_a_bf16_model_deep_copies_and_keeps_autograd_on_float32(path):
    model = tiny_model("llama", seed=0, dtype=torch.float32)
    use_linears(model, "bf16", path=path)
    twin = copy.deepcopy(model)
    x = torch.tensor([[3, 4, 5]])
    with torch.no_grad():
        assert torch.equal(twin(x).logits, model(x).logits)
    lin = nn.Linear(8, 4)
    xg = torch.randn(2, 8, requires_grad=True)
    Bf16Linear(lin, path)(xg).sum().backward()  # autograd on: F.linear, gradients flow
    assert xg.grad is not None and lin.weight.grad is not None


# ---------------------------------------------------------------------------- fallback and switch
def test_without_the_features_bf16_falls_back_to_float32_with_one_line(monkeypatch):
    monkeypatch.setenv(bf16_linear.PATH_ENV, "float32")
    model = tiny_model("llama", seed=0, dtype=torch.float32)
    plain = tiny_model("llama", seed=0, dtype=torch.float32)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        label = use_linears(model, "bf16", fallback=None)
    assert label == "float32" and linears_label(model) == "float32"
    lines = [str(w.message) for w in seen if "bf16" in str(w.message)]
    assert len(lines) == 1 and "float32" in lines[0] and "\n" not in lines[0]
    x = torch.tensor([[3, 4, 5]])
    with torch.no_grad():
        assert torch.equal(model(x).logits, plain(x).logits)


def test_the_fallback_takes_the_kernel_it_is_given(monkeypatch):
    from specframe.models.packed_linear import onednn_available

    if not onednn_available():
        pytest.skip("no oneDNN in this torch build")
    monkeypatch.setenv(bf16_linear.PATH_ENV, "float32")
    model = tiny_model("llama", seed=0, dtype=torch.float32)
    with pytest.warns(RuntimeWarning, match="onednn"):
        assert use_linears(model, "bf16", fallback="onednn") == "float32-onednn"


def test_float32_linears_leave_the_model_alone():
    model = tiny_model("llama", seed=0, dtype=torch.float32)
    assert use_linears(model, "float32") == "float32"
    assert any(type(m) is nn.Linear for m in model.modules())


def test_a_forced_path_the_cpu_lacks_is_refused_naming_the_feature(monkeypatch):
    monkeypatch.setattr(bf16_linear, "available_paths", lambda: ("float32",))
    with pytest.raises(RuntimeError, match="amx_bf16"):
        select_path("amx")
    monkeypatch.setenv(bf16_linear.PATH_ENV, "avx512_bf16")
    with pytest.raises(RuntimeError, match="avx512_bf16"):
        select_path()
    assert select_path("float32") == "float32"


def test_auto_takes_the_fastest_path_the_cpu_has(monkeypatch):
    monkeypatch.delenv(bf16_linear.PATH_ENV, raising=False)
    monkeypatch.setattr(bf16_linear, "available_paths", lambda: ("avx512_bf16", "float32"))
    assert select_path() == "avx512_bf16"
    monkeypatch.setattr(bf16_linear, "available_paths", lambda: ("float32",))
    assert select_path() == "float32"


def test_unknown_paths_and_linears_are_refused_naming_the_valid_ones(monkeypatch):
    with pytest.raises(ValueError, match="'avx2'.*auto, amx, avx512_bf16, float32"):
        select_path("avx2")
    with pytest.raises(ValueError, match="'int8'.*float32, bf16"):
        use_linears(tiny_model("llama", seed=0, dtype=torch.float32), "int8")


def test_the_emulation_is_not_the_float32_answer():
    """The exact reference rounds as bf16 does (else the bitwise test above proves nothing)."""
    torch.manual_seed(0)
    x, w = torch.randn(3, 64), torch.randn(8, 64)
    emu = emulated_linear(x, w)
    assert not torch.equal(emu, x @ w.T)
    assert torch.allclose(emu.double(), reference_linear(x, w), atol=1e-4)
    x, w = torch.randn(16, 256), torch.randn(32, 256)  # enough sums for the two orders to part somewhere
    assert not torch.equal(emulated_linear(x, w, first="odd"), emulated_linear(x, w, first="even"))
