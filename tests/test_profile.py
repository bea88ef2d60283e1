"""The cost curve T(n): measuring, interpolating, caching per key, and ``specframe profile``."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch
from click.testing import CliRunner

from specframe.models import cache_keys
from specframe.sizing import profile
from specframe.cli import cli
from specframe.models.packed_linear import pack_linears, packing_available
from specframe.sizing.profile import CostCurve
from specframe.models.target import TargetModel
from specframe.testing.models import tiny_model


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECFRAME_CACHE", str(tmp_path))
    monkeypatch.setattr(profile, "_MEMO", {})
    return tmp_path / "profiles"


def test_interpolates_in_size_and_context_and_never_decreases():
    curve = CostCurve("k", [1, 4], [100, 300], [[1.0, 4.0], [2.0, 8.0]])
    assert curve.time(2, 100) == pytest.approx(2.0)
    assert curve.time(4, 200) == pytest.approx(6.0)
    assert curve.time(8, 100) == pytest.approx(8.0)  # extended linearly
    dipping = CostCurve("k", [1, 2, 4], [0], [[1.0, 3.0, 2.0]])
    assert dipping.times(4) == pytest.approx([1.0, 2.5, 2.5, 2.5])  # the dip is pooled with its peak


def test_a_noisy_dip_does_not_flatten_the_slope_after_it():
    """A running maximum read this curve flat from n = 2 to 8 (T(8) = T(2), the noisy peak)."""
    curve = CostCurve("k", [1, 2, 4, 8, 16], [0], [[3.2, 3.6, 3.1, 3.6, 4.1]])
    times = curve.times(16)
    assert all(b >= a for a, b in zip(times, times[1:]))
    assert times[7] - times[3] > 0.2 and times[15] > times[7]


@pytest.mark.parametrize("values", [[1.0, 2.0, 1.6, 3.0, 4.0], [5.0, 4.0, 3.0], [1.0, 1.0, 2.0], [2.0]])
def test_isotonic_fit_is_the_nearest_non_decreasing_sequence(values):
    fit = profile.isotonic(values)
    assert len(fit) == len(values) and all(b >= a - 1e-12 for a, b in zip(fit, fit[1:]))
    assert sum(fit) == pytest.approx(sum(values))  # pooling keeps block means
    if values == sorted(values):
        assert fit == values
    # No other non-decreasing sequence is nearer: compare with the running maximum.
    running = [max(values[: i + 1]) for i in range(len(values))]
    sq = lambda seq: sum((a - b) ** 2 for a, b in zip(seq, values))  # noqa: E731
    assert sq(fit) <= sq(running) + 1e-12


def test_sizes_a_target_pads_up_cost_what_the_padded_size_costs():
    """MKL-packed linears pad 5 rows to 8: the curve is a staircase there, not a line."""
    seconds = [[1.0, 2.0, 4.0, 8.0]]
    line = CostCurve("k", [1, 2, 4, 8], [0], seconds)
    stairs = CostCurve("k", [1, 2, 4, 8], [0], seconds, padded_to=[1, 2, 4, 8, 16])
    assert line.time(5) == pytest.approx(5.0)
    assert [stairs.time(n) for n in (1, 3, 4, 5, 7, 8)] == pytest.approx([1.0, 4.0, 4.0, 8.0, 8.0, 8.0])
    assert stairs.times(8) == pytest.approx([1.0, 2.0, 4.0, 4.0, 8.0, 8.0, 8.0, 8.0])
    assert stairs.time(12) == pytest.approx(12.0)  # 16 was not measured: interpolated
    again = CostCurve.from_json(stairs.to_json())
    assert again.padded_to == [1, 2, 4, 8, 16] and again.time(5) == pytest.approx(8.0)
    old = json.loads(stairs.to_json())
    del old["padded_to"]  # a file cached before the field
    assert CostCurve.from_json(json.dumps(old)).padded_to == []


@pytest.mark.skipif(not packing_available(), reason="no MKL in this torch build")
def test_a_packed_target_prices_its_buckets_even_from_an_older_cached_curve(cache):
    model = tiny_model("llama", seed=0, dtype=torch.float32)
    pack_linears(model, "mkl", buckets=(1, 2, 4, 8))
    target = TargetModel(model)
    assert profile.padded_rows(model) == [1, 2, 4, 8] and profile.padded_rows(tiny_model("llama", seed=0)) == []
    key = profile.curve_key(model, target.device, target.dtype)
    cache.mkdir(parents=True)
    (cache / f"{key}.json").write_text(json.dumps({"key": key, "sizes": [1, 2, 4, 8], "cache_lens": [8],
                                                   "seconds": [[1.0, 2.0, 3.0, 4.0]]}))
    curve = profile.curve_for(target, measure_if_missing=False)
    assert curve.padded_to == [1, 2, 4, 8] and curve.time(5) == pytest.approx(4.0)


def test_key_names_model_device_dtype_threads_and_torch():
    model = tiny_model("llama", seed=0)
    key = profile.curve_key(model, torch.device("cpu"), torch.float64, threads=3)
    assert "cpu" in key and "float64" in key and "_t3_" in key and torch.__version__.split("+")[0] in key
    assert profile.curve_key(tiny_model("llama", seed=1), torch.device("cpu"), torch.float64, 3) == key
    assert profile.curve_key(model, torch.device("cpu"), torch.float32, 3) != key
    from specframe.models import native_gemm
    from specframe.models.packed_linear import available_kernels

    for kernel in available_kernels():  # the kernel changes T(n), so it is part of the key
        packed = tiny_model("llama", seed=0, dtype=torch.float32)
        plain_key = profile.curve_key(packed, torch.device("cpu"), torch.float32, 3)
        pack_linears(packed, kernel)
        # the native kernel carries its build's digest: a rebuilt kernel times differently
        build = native_gemm.extension_name().rsplit("_", 1)[-1][:8] if kernel == "native" else ""
        assert profile.curve_key(packed, torch.device("cpu"), torch.float32, 3) == plain_key.replace(
            "_cpu-", f"-{kernel}{build}_cpu-", 1)


def test_key_names_the_cpu_model_and_bf16_linears(monkeypatch):
    from specframe.models import bf16_linear
    from specframe.models.linears import use_linears

    model = tiny_model("llama", seed=0, dtype=torch.float32)
    key = profile.curve_key(model, torch.device("cpu"), torch.float32, 2)
    assert f"_cpu-{cache_keys.cpu_label()}_" in key
    monkeypatch.setattr(profile, "cpu_label", lambda: "Another-CPU")
    assert profile.curve_key(model, torch.device("cpu"), torch.float32, 2) == key.replace(
        cache_keys.cpu_label(), "Another-CPU")
    monkeypatch.undo()
    path = next((p for p in ("amx", "avx512_bf16") if not bf16_linear.missing(p)), None)
    if path is None:
        pytest.skip("this CPU has neither amx_bf16 nor avx512_bf16")
    use_linears(model, "bf16", path=path)
    assert profile.curve_key(model, torch.device("cpu"), torch.float32, 2) == key.replace(
        "_cpu-", f"-bf16-{path.replace('_', '-')}_cpu-", 1)


def test_a_measured_curve_keeps_its_spread_and_where_and_when(cache):
    target = TargetModel(tiny_model("llama", seed=0))
    curve = profile.measure(target, (1, 2), (8,), 4)
    assert len(curve.spread) == 1 and len(curve.spread[0]) == 2 and all(v >= 0 for v in curve.spread[0])
    assert curve.measured["cpu"] == cache_keys.cpu_label() and curve.measured["reps"] == 4 and curve.measured["at"]
    again = profile.CostCurve.from_json(curve.to_json())
    assert again.spread == curve.spread and again.measured == curve.measured
    assert curve.measured["host"] in again.provenance() and "spread" in again.provenance()
    assert "unrecorded" in profile.CostCurve("k", [1], [0], [[1.0]]).provenance()


def test_relative_spread_is_the_interquartile_range_over_the_median():
    assert profile.relative_spread([1.0]) == 0.0
    assert profile.relative_spread([1.0, 1.0, 1.0, 1.0, 1.0]) == 0.0
    assert profile.relative_spread([1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx((4.0 - 2.0 - 0.001) / 3.0)


def test_a_spread_finer_than_a_millisecond_is_not_counted_and_a_busy_tiny_forward_still_is():
    """A quiet tiny-target curve (forwards of 4-12 ms at 2 threads) spreads by a few hundred
    microseconds, which no reader of a curve resolves; a concurrent job spreads it by its length."""
    quiet = [0.0040, 0.0046, 0.0052, 0.0058, 0.0049, 0.0041, 0.0056, 0.0050, 0.0044]
    assert profile.relative_spread(quiet) == 0.0  # 16% by the interquartile range alone
    busy = [0.004, 0.008, 0.005, 0.011, 0.004, 0.009, 0.006, 0.012, 0.007]
    assert profile.relative_spread(busy) > profile.MAX_SPREAD


def _noisy(spreads):
    """measure() stand-in whose n-th curve has spread ``spreads[n]`` at every point."""
    calls = []

    def fake(target, sizes, cache_lens, reps):
        calls.append(1)
        return profile.CostCurve("k", [1, 2], [0], [[1.0, 2.0]], spread=[[spreads[len(calls) - 1]] * 2])
    return fake, calls


def test_a_curve_spread_too_wide_is_measured_again_then_refused_as_busy(monkeypatch, capsys):
    monkeypatch.setenv(profile.SPREAD_ENV, "0.15")
    monkeypatch.setattr(profile, "profile_hint", lambda model: "specframe profile tiny --threads 1")
    target = TargetModel(tiny_model("llama", seed=0))
    fake, calls = _noisy([0.5, 0.05])
    monkeypatch.setattr(profile, "measure", fake)
    assert profile.measure_trusted(target).noise() == 0.05 and len(calls) == 2
    assert capsys.readouterr().err.count("measuring again (2 of 3)") == 1  # one progress line per new try
    fake, calls = _noisy([0.5, 0.4, 0.45])
    monkeypatch.setattr(profile, "measure", fake)
    with pytest.raises(profile.BusyMachineError, match="busy.*40%.*in 3 tries") as err:
        profile.measure_trusted(target)
    assert len(calls) == 3 and "\n" not in str(err.value)
    assert "`specframe profile tiny --threads 1` when it is quiet" in err.value.fix


def test_curve_for_logs_where_and_when_its_curve_was_measured(cache, monkeypatch, caplog):
    import logging

    monkeypatch.setattr(profile, "_SHOWN", set())
    target = TargetModel(tiny_model("llama", seed=0))
    monkeypatch.setattr(profile, "measure", lambda t, *a, **k: profile.CostCurve(
        profile.curve_key(t.model, t.device, t.dtype), [1, 2], [0], [[1.0, 2.0]],
        measured={"at": "2026-12-07T10:00:00+00:00", "host": "quiet-box", "cpu": "X", "threads": 2, "reps": 5}))
    with caplog.at_level(logging.INFO, logger="specframe.sizing"):
        profile.curve_for(target)
    assert any("2026-12-07T10:00:00" in r.getMessage() and "quiet-box" in r.getMessage() for r in caplog.records)


def test_first_use_measures_once_and_caches(cache, monkeypatch):
    target = TargetModel(tiny_model("llama", seed=0))
    calls = []
    real = profile.measure
    monkeypatch.setattr(profile, "measure", lambda t, *a, **k: calls.append(1) or real(t, (1, 2, 4), (8,), 1))
    curve = profile.curve_for(target)
    assert calls == [1] and (cache / f"{curve.key}.json").exists()
    assert curve.sizes == [1, 2, 4] and all(t > 0 for t in curve.seconds[0])
    monkeypatch.setattr(profile, "_MEMO", {})  # a new process reads the file
    assert profile.curve_for(target).seconds == curve.seconds and calls == [1]
    assert target.cache_len == 0  # the measurement leaves the target reset


def test_damaged_cache_file_is_measured_again(cache):
    target = TargetModel(tiny_model("llama", seed=0))
    key = profile.curve_key(target.model, target.device, target.dtype)
    cache.mkdir(parents=True)
    (cache / f"{key}.json").write_text("{not json")
    assert profile.curve_for(target, measure_if_missing=False) is None


def test_measured_tree_forward_matches_an_engine_step():
    """The profiled forward is a real tree verification: logits equal a causal run's at the
    chain's positions (a balanced tree of fan-out 1 is a chain)."""
    target = TargetModel(tiny_model("llama", seed=2))
    tree = profile.balanced_tree(4, target.vocab_size, fanout=1)
    target.reset()
    target.causal_forward(torch.arange(7))
    out = target.tree_forward(tree.tokens, tree.positions(8), tree.ancestor_mask()).logits[0]
    target.reset()
    ref = target.causal_forward(torch.cat([torch.arange(7), tree.tokens])).logits[0, 7:]
    assert torch.allclose(out, ref, atol=1e-9)


def test_profile_command_prints_caches_and_plots(cache, tmp_path):
    png = tmp_path / "curve.png"
    result = CliRunner().invoke(cli, ["profile", "demo-target", "--sizes", "1,2", "--cache-lens", "16",
                                      "--reps", "1", "--threads", "1", "--plot", str(png)])
    assert result.exit_code == 0, result.output
    assert "x T(1)" in result.output and "cached:" in result.output
    assert png.stat().st_size > 0
    stored = json.loads(next(cache.glob("*.json")).read_text())
    assert stored["sizes"] == [1, 2] and stored["cache_lens"] == [16]


def _monotone_grid(draw_incs: list[list[float]], base: float) -> list[list[float]]:
    """A grid non-decreasing along rows and columns: base + 2D cumulative sums of increments."""
    rows, cols = len(draw_incs), len(draw_incs[0])
    out = [[0.0] * cols for _ in range(rows)]
    for i in range(rows):
        for j in range(cols):
            up = out[i - 1][j] if i else base
            left = out[i][j - 1] if j else base
            out[i][j] = max(up, left) + draw_incs[i][j]
    return out


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 4).flatmap(lambda r: st.integers(1, 5).flatmap(lambda c: st.tuples(
    st.lists(st.lists(st.floats(0, 10), min_size=c, max_size=c), min_size=r, max_size=r),
    st.lists(st.lists(st.lists(st.floats(0, 3), min_size=c, max_size=c), min_size=r, max_size=r),
             min_size=3, max_size=3)))))
def test_grid_fit_is_the_nearest_grid_that_never_decreases_in_size_or_cache_length(case):
    """The projection onto a convex set: no monotone grid G makes an acute angle, i.e.
    <data - fit, G - fit> <= 0 for every G (random monotone grids here)."""
    data, others = case
    fit = profile.isotonic_grid(data)
    flat = lambda g: [v for row in g for v in row]  # noqa: E731
    f, d = flat(fit), flat(data)
    assert all(b >= a - 1e-6 for row in fit for a, b in zip(row, row[1:]))
    assert all(fit[i + 1][j] >= fit[i][j] - 1e-6 for i in range(len(fit) - 1) for j in range(len(fit[0])))
    for incs in others:
        g = flat(_monotone_grid(incs, min(d)))
        assert sum((a - b) * (c - b) for a, b, c in zip(d, f, g)) <= 1e-6 * (1 + sum(x * x for x in d))


def test_a_slow_first_size_at_one_cache_length_does_not_make_the_second_token_free():
    """SmolLM2 on this CPU (ms, one profile): T(1) read 63 at L = 64 but 55 at L = 200; fitted
    alone, the L = 64 row pooled T(1) with T(2) and the second token looked free there."""
    curve = CostCurve("k", [1, 2, 4], [64, 200, 512],
                      [[63.1, 60.2, 66.9], [54.6, 58.0, 63.4], [53.7, 62.3, 69.1]])
    row_alone = profile.isotonic(curve.seconds[0])
    assert row_alone[1] - row_alone[0] == pytest.approx(0.0)
    times = curve.times(2, 64)
    assert times[1] - times[0] > 1.0
    assert curve.times(2, 64)[0] <= curve.times(2, 200)[0] + 1e-9  # a longer cache never costs less
