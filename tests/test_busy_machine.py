"""A busy machine never ends a run: a cost curve or a linear-kernel choice timed with too wide a
spread is measured again a bounded number of times, then used for this run only (nothing cached)
with one warning line naming ``specframe profile``; a quiet one is cached.

The clock is faked: ``time.perf_counter`` advances by a fixed step on a quiet machine and by
one to five times that on a busy one, whatever the forwards really cost, so the tests do not
depend on the load of the machine that runs them.
"""

from __future__ import annotations

import random
import time
import warnings

import pytest
import torch

from specframe.models import cache_keys, packed_linear, timing
from specframe.models.target import TargetModel
from specframe.sizing import profile
from specframe.testing.models import tiny_model


def fake_clock(busy: bool, seed: int = 0):
    """A ``perf_counter`` stand-in: each call advances 10 ms (quiet), or 10 ms times a load
    factor between 1 and 5 (busy: another job takes the core for a while), so a timed interval
    is one step whatever the code in it costs."""
    rng = random.Random(seed)
    now = [1000.0]

    def clock() -> float:
        now[0] += 0.01 * (rng.uniform(1.0, 5.0) if busy else 1.0)
        return now[0]
    return clock


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh cache folder, the per-process memos emptied, and the 15% rule in force (the
    suite's conftest turns it off for real timings of tiny models)."""
    monkeypatch.setenv("SPECFRAME_CACHE", str(tmp_path))
    monkeypatch.setenv(profile.SPREAD_ENV, "0.15")
    monkeypatch.setattr(profile, "_MEMO", {})
    monkeypatch.setattr(cache_keys, "_CHOSEN", {})
    return tmp_path / "profiles"


def _busy_lines(caught: list) -> list[str]:
    return [str(w.message) for w in caught if "busy" in str(w.message)]


def _curve(busy: bool, monkeypatch) -> tuple[profile.CostCurve, list[str]]:
    target = TargetModel(tiny_model("llama", seed=0))
    with monkeypatch.context() as patch, warnings.catch_warnings(record=True) as caught:
        patch.setattr(time, "perf_counter", fake_clock(busy))  # the real clock is back after the block
        warnings.simplefilter("always")
        curve = profile.curve_for(target)
        again = profile.curve_for(target)  # a second arm of the same run
    assert again is curve
    return curve, _busy_lines(caught)


def test_a_curve_timed_on_a_busy_machine_serves_the_run_uncached_with_one_warning(cache, monkeypatch, capsys):
    curve, lines = _curve(True, monkeypatch)
    assert curve.noise() > 0.15 and curve.time(4) > 0
    assert not list(cache.glob("*.json")), "a curve timed on a busy machine was cached"
    assert len(lines) == 1, lines
    assert "specframe profile" in lines[0] and f"{100 * curve.noise():.0f}%" in lines[0] and "\n" not in lines[0]
    assert capsys.readouterr().err.count("measuring again") >= 1  # the bounded re-measurement says so


def test_a_curve_timed_on_a_quiet_machine_is_cached_without_a_warning(cache, monkeypatch):
    curve, lines = _curve(False, monkeypatch)
    assert curve.noise() <= 0.15 and not lines
    assert [p.stem for p in cache.glob("*.json")] == [curve.key]


def test_tries_are_bounded_in_number_and_in_time(monkeypatch, capsys):
    monkeypatch.setenv(timing.SPREAD_ENV, "0.15")
    spreads = iter([0.5, 0.3, 0.4, 0.05])
    got = timing.until_quiet(lambda: next(spreads), lambda s: s, "a timing", tries=3)
    assert (got.value, got.quiet, got.tries) == (0.3, False, 3)  # the least noisy of three, 0.05 never measured
    assert capsys.readouterr().err.count("a timing: repetitions spread by") == 2  # one line per new try
    spreads = iter([0.5, 0.05])
    got = timing.until_quiet(lambda: next(spreads), lambda s: s, "a timing", tries=3)
    assert (got.value, got.quiet, got.tries) == (0.05, True, 2)
    got = timing.until_quiet(lambda: 0.5, lambda s: s, "a timing", tries=3, budget=0.0)
    assert (got.quiet, got.tries) == (False, 1)  # out of time: no second try


def _kernels() -> tuple[str, ...]:
    # oneDNN and MKL need no compiler; two are enough for a choice
    return tuple(k for k in ("onednn", "mkl") if packed_linear.kernel_available(k))


def _kernel_choice(busy: bool, monkeypatch) -> tuple[str, list[str]]:
    kernels = _kernels()
    if len(kernels) < 2:
        pytest.skip("needs oneDNN and MKL in this torch build")
    monkeypatch.setattr(packed_linear, "available_kernels", lambda: kernels)
    model = tiny_model("llama", seed=0, dtype=torch.float32)
    with monkeypatch.context() as patch, warnings.catch_warnings(record=True) as caught:
        patch.setattr(time, "perf_counter", fake_clock(busy, seed=1))
        warnings.simplefilter("always")
        choice = packed_linear.fastest_kernel(model)
        again = packed_linear.fastest_kernel(model)  # a second model of the run: no new timing
    assert choice in kernels and again == choice
    return choice, _busy_lines(caught)


def test_a_kernel_choice_timed_on_a_busy_machine_serves_the_run_uncached_with_one_warning(cache, monkeypatch):
    choice, lines = _kernel_choice(True, monkeypatch)
    assert not list(cache.glob("linear-kernel_*.json")), "a kernel chosen on a busy machine was cached"
    assert len(lines) == 1, lines
    assert "specframe profile" in lines[0] and "--packed-linears auto" in lines[0] and "\n" not in lines[0]


def test_a_kernel_choice_timed_on_a_quiet_machine_is_cached_without_a_warning(cache, monkeypatch):
    choice, lines = _kernel_choice(False, monkeypatch)
    assert not lines
    assert len(list(cache.glob("linear-kernel_*.json"))) == 1


def test_an_arm_that_fails_on_a_busy_machine_is_not_told_to_fix_its_options(monkeypatch):
    """An error that knows its own fix (a measurement refused on a busy machine) is reported
    with that fix; the arm's drafter / policy / verifier options are not at fault."""
    from specframe.experiments import runners
    from specframe.experiments.config.schema import ArmConfig, PluginRef

    busy = profile.BusyMachineError("cost curve k not kept: the machine is busy (spread 40%)")

    def fail(*args):
        raise busy
    monkeypatch.setattr(runners, "_build_runner", fail)
    arm = ArmConfig("ngram+chain-auto", drafter=PluginRef("ngram", {}), policy=PluginRef("chain", {"gamma": "auto"}))
    with pytest.raises(runners.ContextError) as err:
        runners.build_runner(arm, None, None, None)
    assert "options" not in err.value.fix and "specframe profile" in err.value.fix
    assert "options" not in err.value.what and "busy" in err.value.what
    what, fix = runners.fault(busy, "fix this arm's drafter / policy options")  # what replay's runner reports
    assert what == busy.what and fix == busy.fix
