"""The goodput allocator's model of a step (docs/load.md, "The goodput rule"): a tree is valued
by the depth the row's policy reaches with it, drafting is paid per depth, and the model's
predicted step time and tokens are kept beside the measured ones (tiny numbers, no timing)."""

from __future__ import annotations

from pathlib import Path

import pytest

from specframe.decode.allocate import make_allocator
from specframe.interfaces import StepStats
from stand_in_curves import Curves



def stats(size: int, depth: int, accepted: int, draft: float = 0.0, policy: float = 0.0, rest: float = 0.0) -> StepStats:
    return StepStats(tree_size=size, depth=depth, accepted=accepted, emitted=accepted + 1, draft_forwards=depth,
                     draft_time=draft, policy_time=policy, target_time=0.0, verify_time=rest / 2, other_time=rest / 2,
                     widths=[1] * (depth + 1), accepted_ranks=[0] * accepted)


def goodput(curve, **options):
    alloc = make_allocator(("goodput", options))
    alloc.price_batch(Curves(curve), "flat")
    return alloc


# ---------------------------------------------------------------- a tree valued by its depth
def test_a_chain_of_n_nodes_is_valued_as_an_n_minus_1_deep_chain():
    from specframe.strategies.goodput_model import RowModel

    chain = RowModel(alpha=0.8, depth_ratio=1.0)
    assert [chain.depth(n) for n in (1, 2, 5)] == [0, 1, 4]
    assert chain.value(5) == pytest.approx(sum(0.8 ** k for k in range(1, 5)))


def test_budgets_whose_trees_differ_in_depth_get_different_values():
    from specframe.strategies.goodput_model import RowModel

    # Two policies, same acceptance per depth: a chain and a tree four nodes wide per depth.
    chain, wide = RowModel(alpha=0.8, depth_ratio=1.0), RowModel(alpha=0.8, depth_ratio=0.25)
    assert wide.depth(17) == 4 and chain.depth(17) == 16
    assert wide.value(17) == pytest.approx(sum(0.8 ** k for k in range(1, 5)))
    assert wide.value(17) < chain.value(17) - 1.5


def test_a_rows_shape_and_costs_come_from_its_steps():
    from specframe.strategies.goodput_model import row_model

    # 16 draft nodes 2 deep; 0.2 s of drafting (one forward per depth) and 0.32 s of building.
    model = row_model([stats(17, 2, 2, draft=0.2, policy=0.32)] * 4, window=8, alpha=0.9)
    assert model.depth_ratio == pytest.approx(2 / 16)
    assert model.depth_cost == pytest.approx(0.1) and model.node_cost == pytest.approx(0.02)
    # Drafting is paid per depth: a 17-node tree 2 deep pays two draft forwards, not 16.
    assert model.cost(17) == pytest.approx(2 * 0.1 + 16 * 0.02)


def test_a_wide_tree_is_not_over_valued_as_a_deep_chain():
    # A row whose policy builds 17-node trees 2 deep and accepts both depths: valued as a
    # 16-deep chain (the old rule) it takes all 17 nodes; valued by its depth, one depth pays
    # (a few nodes), the second (up to 10) costs more than its ~0.9 token.
    wide = [[stats(17, 2, 2)] * 8]
    sizes = goodput(lambda n: 1.0 + 0.1 * n, draft_cost=False).budgets([17], wide, 17)
    assert sizes == [2]
    chain = [[stats(17, 16, 16)] * 8]  # the same budget in a chain row: every node a depth
    assert goodput(lambda n: 1.0 + 0.1 * n, draft_cost=False).budgets([17], chain, 17) == [17]


def test_the_steps_rest_is_priced_so_speculation_pays_as_measured():
    # Where a step costs more than its forward (verification, host read, bookkeeping: on
    # load-tiny 2-4 ms a step, absent from the old model), a drafted node is a smaller share
    # of it: at acceptance 2/3 and a node costing 80% of a root-only forward, speculation pays
    # only once that rest (0.5 of a forward here) is counted.
    hist = [[stats(5, 4, 2, rest=0.5)] * 8]
    alloc = goodput(lambda n: 1.0 + 0.8 * (n - 1), draft_cost=False)
    assert alloc.budgets([5], hist, 5) == [2]
    assert alloc.prediction().overhead_time == pytest.approx(0.5)
    assert alloc.prediction().step_time == pytest.approx(1.8 + 0.5)
    assert goodput(lambda n: 1.0 + 0.8 * (n - 1), draft_cost=False, step_overhead=False).budgets([5], hist, 5) == [1]


def test_goodput_calibrates_its_forward_and_rest_on_what_its_steps_measured():
    from specframe.decode.allocate import StepAccount

    # The curve says a root-only step takes 1.0 and each node 0.8 more; the rows measured no
    # rest of their own. The step then measures its forward at twice the curve and a rest of 1.0
    # (on a busy machine, or at other context lengths): priced so, the node pays.
    hist = [[stats(5, 4, 2)] * 8]
    alloc = goodput(lambda n: 1.0 + 0.8 * (n - 1), draft_cost=False)
    assert alloc.budgets([5], hist, 5) == [1]
    alloc.observe_step(StepAccount(1.0, 2.0, 0.0, 1.0))
    assert alloc.budgets([5], hist, 5) == [2]
    assert alloc.prediction().target_time == pytest.approx(3.6) and alloc.prediction().overhead_time == 1.0
    alloc.observe_step(StepAccount(1.7, 3.6, 0.0, 1.0))  # as predicted: the scale stays 2
    assert alloc.calibration.scale(1) == pytest.approx(2.0)
    fixed = goodput(lambda n: 1.0 + 0.8 * (n - 1), draft_cost=False, calibrate=False)
    fixed.budgets([5], hist, 5)
    fixed.observe_step(StepAccount(1.0, 2.0, 0.0, 1.0))
    assert fixed.budgets([5], hist, 5) == [1]


# ---------------------------------------------------------------- predicted beside measured
def test_by_live_sums_the_measured_and_predicted_steps_of_each_live_size():
    from specframe.experiments.load.prediction import by_live, pooled_by_live, prediction_table
    from specframe.experiments.load.serve import Served

    guess = {"tokens": 1.5, "target_time": 0.010, "build_time": 0.002, "overhead_time": 0.001}
    served = Served([0.0, 0.0], [0.0, 0.0], [0.1, 0.1], [0.3, 0.3], [[1, 2], [3, 4, 5]], [0.1, 0.2, 0.3], [2, 2, 1],
                    step_times=[0.02, 0.04, 0.01], step_tokens=[2, 3, 1], step_forward=[0.01, 0.02, 0.005],
                    step_build=[0.004, 0.006, 0.0], step_predicted=[guess, guess, None])
    rows = by_live(served)
    assert [(r["live"], r["steps"], r["predicted_steps"]) for r in rows] == [(1, 1, 0), (2, 2, 2)]
    means = pooled_by_live([{"by_live": rows}, {"by_live": rows}, {}])  # a round stored before: nothing
    two = means[1]
    assert two["steps"] == 4 and two["measured_ms"] == pytest.approx(30.0)
    assert two["measured_forward_ms"] == pytest.approx(15.0) and two["measured_build_ms"] == pytest.approx(5.0)
    assert two["measured_rest_ms"] == pytest.approx(10.0)
    assert two["measured_tokens"] == pytest.approx(2.5) and two["predicted_tokens"] == pytest.approx(1.5)
    assert two["predicted_ms"] == pytest.approx(13.0) and two["predicted_forward_ms"] == pytest.approx(10.0)
    assert two["predicted_build_ms"] == pytest.approx(2.0) and two["predicted_overhead_ms"] == pytest.approx(1.0)
    assert means[0]["predicted_ms"] is None  # no prediction at live size 1
    summary = {"arms": ["goodput"], "cells": [{"rate": 1.0, "arm": "goodput", "by_live": means}]}
    table = prediction_table(summary)
    assert "| 1 | goodput | 2 | 4 | 13.00 | 30.00 |" in table and "| 1 | goodput | 1 | 2 | - |" in table
    assert prediction_table({"arms": [], "cells": [{"rate": 1.0, "arm": "ar", "by_live": means[:1]}]}) == ""


def test_a_load_run_keeps_goodputs_prediction_beside_the_measurement(tmp_path):
    from specframe.experiments.config import load_config
    from specframe.experiments.load.run import LoadRun
    from specframe.experiments.load.settings import load_settings

    config = load_config(Path(__file__).resolve().parents[1] / "examples" / "load-tiny.toml")
    config.arms = [a for a in config.arms if a.name in ("autoregressive", "goodput")]
    config.max_new_tokens = 6
    summary = LoadRun(config, load_settings(config.load, {"rates": [8.0], "requests": 3}), tmp_path).run()
    cells = {c["arm"]: c for c in summary["cells"]}
    good = cells["goodput"]["by_live"]
    assert sum(r["steps"] for r in good) == sum(r["predicted_steps"] for r in good) > 0  # every step predicted
    for r in good:
        assert r["predicted_ms"] > 0 and r["measured_ms"] > 0 and r["predicted_tokens"] >= r["live"]
        assert r["predicted_ms"] == pytest.approx(r["predicted_forward_ms"] + r["predicted_build_ms"]
                                                  + r["predicted_overhead_ms"])
    assert all(r["predicted_ms"] is None and r["measured_tokens"] == r["live"] for r in cells["autoregressive"]["by_live"])
    assert "goodput" in (tmp_path / "prediction.md").read_text()
