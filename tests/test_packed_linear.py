"""Fast small-batch linears (native, oneDNN, MKL-packed): same results as nn.Linear up to
float32 rounding, for every row count (inside an MKL bucket, between buckets, above the largest,
past a native row tile and past the native row limit), the "auto" kernel choice, and lossless
speculative decoding on a model whose linears are all replaced (every forward, plain or tree,
runs the replaced model)."""

import pytest
import torch
from torch import nn

import specframe
from specframe.models import cache_keys
from specframe.models import packed_linear
from specframe.sizing import profile
from specframe.models.packed_linear import (KERNELS, NATIVE_MAX_ROWS, NativeLinear, OneDnnLinear, _wrap,
                                     available_kernels, choose_kernel, fastest_kernel, linear_kernel, pack_linears,
                                     time_model_kernels)
from specframe.testing.models import tiny_model

HAVE = available_kernels()
pytestmark = pytest.mark.skipif(not HAVE, reason="this torch build has neither oneDNN nor MKL (non-x86)")
each_kernel = pytest.mark.parametrize("kernel", [pytest.param(k, marks=pytest.mark.skipif(
    k not in HAVE, reason=f"no {k} in this torch build")) for k in KERNELS])


def _wrapped(kernel: str, lin: nn.Linear) -> nn.Module:
    return _wrap(lin, kernel, buckets=(1, 2, 4, 8))


@each_kernel
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 9, 17, 40, NATIVE_MAX_ROWS + 1])
def test_fast_linear_matches_linear(kernel, rows):
    torch.manual_seed(rows)
    lin = nn.Linear(48, 100)  # 100 outputs: the native kernel's last 16-column panel is partial
    fast = _wrapped(kernel, lin)
    x = torch.randn(1, rows, 48)
    with torch.no_grad():
        want, got = lin(x), fast(x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


native_only = pytest.mark.skipif("native" not in HAVE, reason="the native kernel does not build here (no C++ compiler)")


@native_only
@pytest.mark.parametrize("bias", [True, False])
def test_a_native_row_does_not_depend_on_the_rows_beside_it(bias):
    """Every output is summed over the inputs in one order whatever the row count, so a tree
    node's logits equal those of the same token fed alone, bit for bit."""
    torch.manual_seed(0)
    lin = NativeLinear(nn.Linear(40, 70, bias=bias))
    x = torch.randn(NATIVE_MAX_ROWS, 40)
    with torch.no_grad():
        together = lin(x)
        for rows in (1, 5, 16, 17, NATIVE_MAX_ROWS):
            assert torch.equal(lin(x[:rows]), together[:rows])
        assert torch.equal(torch.cat([lin(x[i:i + 1]) for i in range(len(x))]), together)


@pytest.mark.parametrize("kernel", [pytest.param(k, marks=pytest.mark.skipif(k not in HAVE, reason=f"no {k} here"))
                                    for k in ("native", "onednn")])  # MKL's packed weights are opaque tensors
def test_a_fast_linear_model_can_be_deep_copied(kernel):
    import copy

    model = tiny_model("llama", seed=0, dtype=torch.float32)
    pack_linears(model, kernel)
    twin = copy.deepcopy(model)
    x = torch.tensor([[3, 4, 5]])
    with torch.no_grad():
        assert torch.equal(twin(x).logits, model(x).logits) and linear_kernel(twin) == kernel


@native_only
def test_native_linear_leaves_float64_and_large_inputs_to_f_linear():
    lin = nn.Linear(8, 4).double()
    x = torch.randn(3, 8, dtype=torch.float64)
    with torch.no_grad():
        assert torch.equal(NativeLinear(lin)(x), lin(x))
        lin32 = nn.Linear(8, 4)
        big = torch.randn(NATIVE_MAX_ROWS + 1, 8)
        assert torch.equal(NativeLinear(lin32)(big), lin32(big))  # the same F.linear call


@native_only
def test_the_native_build_is_keyed_by_source_and_cpu(monkeypatch):
    from specframe.models import native_gemm

    name = native_gemm.extension_name()
    assert name == native_gemm.extension_name() and name.startswith("specframe_small_gemm_")
    monkeypatch.setattr(native_gemm, "_cpu_flags", lambda: "flags : another processor")
    assert native_gemm.extension_name() != name


@pytest.mark.skipif("onednn" not in HAVE, reason="no oneDNN in this torch build")
def test_onednn_linear_leaves_float64_to_f_linear():
    lin = nn.Linear(8, 4).double()  # oneDNN has no float64 matmul
    x = torch.randn(3, 8, dtype=torch.float64)
    with torch.no_grad():
        assert torch.equal(OneDnnLinear(lin)(x), lin(x))


@each_kernel
def test_fast_linear_keeps_autograd(kernel):
    lin32 = nn.Linear(8, 4)
    x32 = torch.randn(2, 8, requires_grad=True)
    _wrapped(kernel, lin32)(x32).sum().backward()  # autograd on: plain F.linear, gradients flow
    assert x32.grad is not None and lin32.weight.grad is not None


@each_kernel
def test_pack_linears_replaces_every_float32_linear_and_keeps_the_weights(kernel):
    model = tiny_model("llama", seed=0, dtype=torch.float32)
    n_linear = sum(type(m) is nn.Linear for m in model.modules())
    weight = model.lm_head.weight
    assert n_linear > 0 and linear_kernel(model) is None
    assert pack_linears(model, kernel) == kernel == linear_kernel(model)
    assert not any(type(m) is nn.Linear for m in model.modules())
    assert model.lm_head.weight is weight  # same parameter (ties survive)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cost-curve cache (where the "auto" kernel choice is kept), as in a new process."""
    monkeypatch.setenv("SPECFRAME_CACHE", str(tmp_path))
    monkeypatch.setattr(cache_keys, "_CHOSEN", {})
    return tmp_path


def test_auto_takes_an_available_kernel_and_keeps_it_for_the_process(cache):
    model = tiny_model("llama", seed=0, dtype=torch.float32)
    first = fastest_kernel(model)
    assert first in HAVE and fastest_kernel(model) == first
    assert pack_linears(model) == first


def test_unknown_kernel_is_refused_by_name():
    with pytest.raises(ValueError, match="'blas'.*auto, native, onednn, mkl"):
        pack_linears(tiny_model("llama", seed=0, dtype=torch.float32), "blas")


@each_kernel
def test_speculative_decoding_on_a_fast_linear_model_equals_its_greedy_decoding(kernel):
    model = tiny_model("llama", seed=0, dtype=torch.float32)
    pack_linears(model, kernel)
    prompt = [5, 6, 7, 8, 9]
    ref = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=20)[0, len(prompt):].tolist()
    dec = specframe.SpecDecoder.build(target=model, drafter=("ngram", {}), policy=("talon", {"budget": 8}),
                                      verifier="greedy")
    assert dec.generate(prompt, max_new_tokens=20, eos_token_id=None).tokens == ref


@each_kernel
def test_an_eagle_head_loaded_by_the_drafter_takes_the_targets_kernel(kernel):
    from specframe.decode.engine import make_plugin
    from specframe.models.target import TargetModel, load_causal_lm

    plain = make_plugin("drafters", ("eagle3", {"path": "demo-eagle"}),
                        TargetModel(load_causal_lm("demo-target", dtype="float32")))
    assert linear_kernel(plain.head) is None  # an unpacked target: the head stays as loaded
    model = load_causal_lm("demo-target", dtype="float32")
    pack_linears(model, kernel)
    drafter = make_plugin("drafters", ("eagle3", {"path": "demo-eagle"}), TargetModel(model))
    assert linear_kernel(drafter.head) == kernel
    prompt = list(range(5, 25))
    ref = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                         do_sample=False, max_new_tokens=16, min_new_tokens=16)[0, len(prompt):].tolist()
    dec = specframe.SpecDecoder.build(target=model, drafter=drafter, policy=("talon", {"budget": 8}))
    out = dec.generate(prompt, max_new_tokens=16, eos_token_id=None)
    assert out.tokens == ref and out.tau > 1.0


def test_a_machine_that_cannot_build_the_native_kernel_keeps_the_others(monkeypatch):
    import torch.utils.cpp_extension

    from specframe.models import native_gemm

    def no_compiler(**_):
        raise RuntimeError("Error building extension: c++: command not found")

    monkeypatch.setattr(torch.utils.cpp_extension, "load", no_compiler)
    monkeypatch.setattr(native_gemm.load_extension, "_warned", False, raising=False)
    native_gemm._build.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="c\\+\\+: command not found"):
            assert native_gemm.load_extension() is None
        assert "command not found" in native_gemm.unavailable_reason()
        assert "native" not in available_kernels()
        with pytest.raises(RuntimeError, match="native linear kernel cannot be built here.*command not found"):
            pack_linears(tiny_model("llama", seed=0, dtype=torch.float32), "native")
    finally:
        native_gemm._build.cache_clear()  # the next caller loads the real build again


@pytest.mark.parametrize("kernel", [pytest.param(k, marks=pytest.mark.skipif(
    k not in HAVE, reason=f"no {k} in this torch build")) for k in ("onednn", "mkl")])
def test_packing_with_a_library_kernel_never_builds_the_native_one(kernel, monkeypatch):
    # On a machine without the cached build, asking whether native is available compiles it
    # (about 25 s) or warns that it cannot: neither is the business of an "mkl" or "onednn" user.
    from specframe.models import packed_linear

    monkeypatch.setattr(packed_linear, "native_available", lambda: pytest.fail("checked the native kernel"))
    assert pack_linears(tiny_model("llama", seed=0, dtype=torch.float32), kernel) == kernel


# ---------------------------------------------------------------------- the "auto" choice
def test_auto_times_whole_forwards_at_each_row_count_and_puts_the_linears_back():
    """"auto" compares whole-model forwards (every linear replaced, at 1 and 16 tokens), not
    one layer: timing the lm_head alone picked mkl or native from run to run."""
    model = tiny_model("llama", seed=0, dtype=torch.float32)
    before = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
              if type(child) is nn.Linear]
    seen = []
    real = model.forward

    def recording(*args, **kwargs):
        seen.append((linear_kernel(model), kwargs["input_ids"].shape[-1]))
        return real(*args, **kwargs)

    model.forward = recording
    kernels = tuple(HAVE)
    seconds = time_model_kernels(model, kernels, rows=(1, 16), reps=2)
    assert set(seconds) == set(kernels) and all(t > 0 for t in seconds.values())
    # warm-up + 2 repetitions, each as many whole forwards at 1 and 16 rows as fill 20 ms (timing.sample)
    assert set(seen) == {(k, r) for k in kernels for r in (1, 16)}
    assert all(seen.count((k, 1)) == seen.count((k, 16)) >= 3 for k in kernels)
    assert linear_kernel(model) is None
    assert all(getattr(parent, name) is child for parent, name, child in before)


def test_a_kernel_replaces_the_incumbent_only_when_clearly_faster():
    assert choose_kernel({"native": 1.0, "onednn": 0.97, "mkl": 0.96}, "native") == "native"  # near tie
    assert choose_kernel({"native": 1.0, "onednn": 0.97, "mkl": 0.90}, "native") == "mkl"
    assert choose_kernel({"native": 0.90, "mkl": 0.93}, "mkl") == "mkl"
    assert choose_kernel({"native": 1.0, "mkl": 1.0}, "mkl") == "mkl"
    assert choose_kernel({"native": 1.0, "mkl": 0.5}, "native", margin=1.5) == "native"


def test_the_auto_choice_is_cached_with_the_curves_and_read_back_without_timing(cache, monkeypatch):
    model = tiny_model("llama", seed=0, dtype=torch.float32)
    monkeypatch.setattr(packed_linear, "available_kernels", lambda: ("native", "onednn", "mkl"))
    timings = iter([{"native": 1.0, "onednn": 0.97, "mkl": 0.96},   # first machine run: a near tie
                    {"native": 1.0, "onednn": 0.97, "mkl": 0.80},   # refreshed: mkl clearly faster
                    {"native": 0.78, "onednn": 0.9, "mkl": 0.80}])  # refreshed again: a near tie
    runs = lambda *a, **k: {name: [t] * 5 for name, t in next(timings).items()}  # noqa: E731 (quiet: no spread)
    monkeypatch.setattr(packed_linear, "kernel_runs", runs)
    assert fastest_kernel(model) == "native"  # no cache: the first available is the incumbent
    files = list(cache.rglob("linear-kernel_*.json"))
    assert len(files) == 1 and profile.cache_dir() in files[0].parents
    monkeypatch.setattr(cache_keys, "_CHOSEN", {})  # a new process reads the file ...
    monkeypatch.setattr(packed_linear, "kernel_runs", lambda *a, **k: pytest.fail("timed again"))
    assert fastest_kernel(model) == "native"  # ... and times nothing
    monkeypatch.setattr(packed_linear, "kernel_runs", runs)
    assert fastest_kernel(model, refresh=True) == "mkl"
    assert fastest_kernel(model, refresh=True) == "mkl"  # the cached choice is now the incumbent
    monkeypatch.setattr(cache_keys, "_CHOSEN", {})
    assert pack_linears(model, "auto") == "mkl" == linear_kernel(model)


def test_the_auto_choice_is_keyed_by_model_cpu_threads_and_torch():
    model = tiny_model("llama", seed=0, dtype=torch.float32)
    key = cache_keys.kernel_choice_key(model, threads=2)
    assert profile.model_label(model) in key and "t2" in key and cache_keys.cpu_label() in key
    assert torch.__version__.replace("+", "-") in key
    assert cache_keys.kernel_choice_key(model, threads=3) != key
    assert cache_keys.kernel_choice_key(tiny_model("qwen2", seed=0, dtype=torch.float32), threads=2) != key


def test_a_damaged_kernel_choice_counts_as_absent(cache):
    key = cache_keys.kernel_choice_key(tiny_model("llama", seed=0, dtype=torch.float32))
    (cache / "profiles").mkdir(parents=True)
    (cache / "profiles" / f"{key}.json").write_text("{not json", encoding="utf-8")
    assert cache_keys.load_kernel_choice(key) is None
