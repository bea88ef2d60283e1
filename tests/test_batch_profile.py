"""Cost curves at a batch shape, and budget = "auto" pricing a batched step with them."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from specframe.decode import batch_curves as batch_profile
from specframe.sizing import profile
from specframe.decode.batch import BatchDecoder
from specframe.decode.kv_padded import BatchKV
from specframe.decode.batch_curves import BatchCurves, batch_curve_for, measured_batches
from specframe.cli import cli
from specframe.decode.engine import SpecDecoder, make_plugin
from specframe.interfaces import StepStats, TreePolicy
from specframe.sizing.profile import CostCurve
from specframe.models.target import TargetModel
from specframe.testing.fixtures import default_drafter, tiny_target

SIZES, LENS = (1, 2, 4), (8, 16)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECFRAME_CACHE", str(tmp_path))
    monkeypatch.setattr(profile, "_MEMO", {})
    return tmp_path / "profiles"


def flat(key: str, per_node: float, base: float) -> CostCurve:
    """T(n) = base + per_node * n at both cache lengths (the longer 10% dearer)."""
    return CostCurve(key, list(SIZES), list(LENS),
                     [[base + per_node * n for n in SIZES], [1.1 * (base + per_node * n) for n in SIZES]])


CURVES = BatchCurves({1: flat("k", 1.0, 10.0), 2: flat("k_b2", 2.0, 11.0), 4: flat("k_b4", 4.0, 13.0)})


def test_measured_batches_are_the_powers_of_two_up_to_the_batch():
    assert measured_batches(1) == [1]
    assert measured_batches(4) == [1, 2, 4]
    assert measured_batches(6) == [1, 2, 4, 6]


@pytest.mark.parametrize("live", [2, 4])
def test_a_row_pays_its_share_of_a_measured_batch_forward(live):
    row = CURVES.row_curve(live)
    for n in SIZES:
        for c in LENS:
            assert row.time(n, c) == pytest.approx(CURVES.curves[live].time(n, c) / live)


def test_a_batch_of_one_keeps_the_one_row_curve():
    assert CURVES.row_curve(1) is CURVES.curves[1]


def test_an_unmeasured_batch_size_is_interpolated_between_its_neighbours():
    row = CURVES.row_curve(3)
    for n in SIZES:
        between = (CURVES.curves[2].time(n, 8) + CURVES.curves[4].time(n, 8)) / 2
        assert row.time(n, 8) == pytest.approx(between / 3)


@pytest.mark.parametrize("layout", ["flat", "padded"])
def test_packed_forward_timing_leaves_the_prefix_as_it_was(layout):
    from specframe.decode.kv_flat import make_batch_kv

    target = TargetModel(tiny_target())
    kv = make_batch_kv(target, layout)
    kv.prefill([torch.arange(5)] * 3)
    width, lengths = kv.width, list(kv.lengths)
    spent = batch_profile._time_batch(target, kv, [profile.balanced_tree(4, target.vocab_size)] * 3, width)
    assert spent > 0 and kv.width == width and kv.lengths == lengths


def test_a_batch_curve_is_measured_once_and_cached_under_its_own_key(cache, monkeypatch):
    target = TargetModel(tiny_target())
    real = batch_profile.measure_batch
    monkeypatch.setattr(batch_profile, "measure_batch",
                        lambda t, b, layout="padded": real(t, b, SIZES, LENS, 1, layout=layout))
    curve = batch_curve_for(target, 2)
    assert curve.key.endswith("_b2") and curve.sizes == list(SIZES) and curve.cache_lens == list(LENS)
    flat = batch_curve_for(target, 2, layout="flat")  # the flat layout's own curve, under its own key
    assert flat.key == f"{curve.key}_flat" and (cache / f"{flat.key}.json").exists()
    assert all(t > 0 for row in curve.seconds for t in row)
    assert json.loads((cache / f"{curve.key}.json").read_text())["sizes"] == list(SIZES)
    monkeypatch.setattr(batch_profile, "measure_batch", lambda *a: pytest.fail("measured again"))
    monkeypatch.setattr(profile, "_MEMO", {})  # read back from the file, not the memo
    assert batch_curve_for(target, 2).seconds == curve.seconds
    assert batch_curve_for(target, 4, measure_if_missing=False) is None


class PricedPolicy(TreePolicy):
    """A fixed talon(3) that asks for batch prices and records what it is given and observes."""

    name = "priced-test"

    def __init__(self) -> None:
        self.inner = make_plugin("policies", ("talon", {"budget": 3}))
        super().__init__(self.inner.options)
        self.prices: list[CostCurve] = []
        self.seen: list[StepStats] = []

    @property
    def wants_batch_curve(self) -> bool:
        return True

    def price_batch(self, curve) -> None:
        self.prices.append(curve)

    def build(self, session, budget):
        return self.inner.build(session, budget)

    def observe(self, stats: StepStats) -> None:
        self.seen.append(stats)


def test_a_batch_priced_policy_gets_its_row_curve_then_the_one_row_curve_back():
    target = TargetModel(tiny_target())
    policies = [PricedPolicy() for _ in range(3)]
    decoder = SpecDecoder(target, default_drafter("ngram", target), policies[0], make_plugin("verifiers", "greedy"))
    it = iter(policies[1:])
    batch = BatchDecoder(decoder, policy_factory=lambda d: next(it))
    batch._curves[3] = CURVES
    prompts = [[1, 2, 3], [4, 5, 6, 7], [8, 9]]
    out = batch.generate(prompts, max_new_tokens=12, eos_token_id=None)
    steps = [len(o.steps) for o in out.outputs]
    live_at = [sum(1 for n in steps if n > s) for s in range(max(steps))]
    for policy, result in zip(policies, out.outputs):
        # Priced once per live batch size it decoded in (rows finish when their acceptance says),
        # at that size's row share, then given the one-row curve back.
        sizes = sorted(set(live_at[: len(result.steps)]), reverse=True)
        assert len(policy.prices) == len(sizes) + 1
        for price, live in zip(policy.prices, sizes):
            assert price.time(2, 8) == pytest.approx(CURVES.row_curve(live).time(2, 8))
        assert policy.prices[-1] is CURVES.curves[1]
        for s, (seen, step) in enumerate(zip(policy.seen, result.steps)):
            # The recorded step's policy time adds the observe itself, which the policy cannot see.
            assert seen.draft_time == step.draft_time and seen.policy_time <= step.policy_time
            assert seen.target_time == pytest.approx(step.target_time / live_at[s])


def test_a_policy_that_does_not_ask_is_never_priced_and_observes_the_whole_step(monkeypatch):
    monkeypatch.setattr(BatchCurves, "for_target", classmethod(lambda cls, *a: pytest.fail("measured")))
    target = TargetModel(tiny_target())
    decoder = SpecDecoder(target, default_drafter("ngram", target), make_plugin("policies", ("talon", {"budget": 4})),
                          make_plugin("verifiers", "greedy"))
    seen = []
    decoder.policy.observe = seen.append
    out = BatchDecoder(decoder).generate([[1, 2], [3, 4, 5]], max_new_tokens=4, eos_token_id=None)
    assert [s.target_time for s in seen] == [s.target_time for s in out.outputs[0].steps]


def test_talon_auto_asks_for_batch_prices_and_fixed_talon_does_not():
    assert make_plugin("policies", ("talon", {"budget": "auto"})).wants_batch_curve
    assert not make_plugin("policies", ("talon", {"budget": 8})).wants_batch_curve


def test_talon_auto_in_a_batch_stays_lossless_and_ends_on_the_one_row_curve():
    target = TargetModel(tiny_target())
    decoder = SpecDecoder(target, default_drafter("model", target), make_plugin("policies", ("talon", {"budget": "auto"})),
                          make_plugin("verifiers", "greedy"))
    batch = BatchDecoder(decoder)
    batch._curves[2] = CURVES
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8]]
    out = batch.generate(prompts, max_new_tokens=8, eos_token_id=None)
    alone = SpecDecoder(target, default_drafter("model", target), make_plugin("policies", ("talon", {"budget": 4})),
                        make_plugin("verifiers", "greedy"))
    for prompt, result in zip(prompts, out.outputs):  # greedy output, whatever the trees
        assert result.tokens == alone.generate(prompt, max_new_tokens=8, eos_token_id=None).tokens
    assert decoder.policy.sizer.curve is CURVES.curves[1]


def test_profile_command_measures_each_batch_size(cache, tmp_path):
    png = tmp_path / "rows.png"
    result = CliRunner().invoke(cli, ["profile", "demo-target", "--sizes", "1,2", "--cache-lens", "16",
                                      "--reps", "1", "--threads", "1", "--batch", "1,2", "--plot", str(png)])
    assert result.exit_code == 0, result.output
    assert "batch 2:" in result.output and "B=2 ms/row" in result.output
    keys = sorted(p.stem for p in cache.glob("*.json"))
    assert len(keys) == 2 and keys[1] == keys[0] + "_b2"
    assert png.stat().st_size > 0
    flat = CliRunner().invoke(cli, ["profile", "demo-target", "--sizes", "1,2", "--cache-lens", "16", "--reps", "1",
                                    "--threads", "1", "--batch", "2", "--layout", "flat", "--plot", str(png)])
    assert flat.exit_code == 0, flat.output
    assert keys[0] + "_b2_flat" in {p.stem for p in cache.glob("*.json")}
