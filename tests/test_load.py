"""specframe load (docs/load.md): arrivals, open-loop queueing, the load-aware allocators, the
cheap switch, and a whole run's cells, summary and resume (tiny models, no timing asserts)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specframe.decode.allocate import check_allocation, make_allocator
from specframe.decode.batch import BatchDecoder
from specframe.decode.engine import SpecDecoder, make_plugin
from specframe.interfaces import StepStats
from specframe.models.target import TargetModel
from specframe.testing.fixtures import default_drafter, tiny_target
from specframe.testing.harness import greedy_by_recomputation
from specframe.tree import DraftTree

from specframe.experiments.load.arrivals import file_arrivals, poisson_arrivals, read_arrivals
from specframe.experiments.load.metrics import percentile, summarize
from specframe.experiments.load.settings import load_settings
from stand_in_curves import Curves

PROMPTS = [[5, 9, 2], [7], [11, 3, 3, 8, 1, 40], [2, 2], [1, 2, 3]]


def decoder(drafter: str = "model", policy: tuple = ("chain", {"gamma": 3})) -> SpecDecoder:
    target = TargetModel(tiny_target())
    return SpecDecoder(target, default_drafter(drafter, target), make_plugin("policies", policy),
                       make_plugin("verifiers", "greedy"))


# ---------------------------------------------------------------- arrivals
def test_poisson_arrivals_are_seeded_and_start_at_zero():
    a, b, c = poisson_arrivals(2.0, 200, 1), poisson_arrivals(2.0, 200, 1), poisson_arrivals(2.0, 200, 2)
    assert a == b and a != c
    assert a[0] == 0.0 and all(y >= x for x, y in zip(a, a[1:]))
    assert 0.35 < a[-1] / 199 < 0.7  # mean gap near 1 / rate (seeded: fixed, not flaky)


def test_file_arrivals_keep_the_pattern_at_the_rate(tmp_path):
    path = tmp_path / "times.txt"
    path.write_text("# burst then gap\n0\n0.1\n0.2\n\n3.0\n")
    times = read_arrivals(path)
    assert times == [0.0, 0.1, 0.2, 3.0]
    out = file_arrivals(times, rate=2.0, count=8)
    gaps = [y - x for x, y in zip(out, out[1:])]
    assert sum(gaps) / len(gaps) == pytest.approx(0.5)  # mean rate 2 requests/s
    assert gaps[0] == pytest.approx(gaps[1]) and gaps[2] > 10 * gaps[0]  # the burst stays a burst
    path.write_text("0\n2\n1\n")
    with pytest.raises(ValueError, match="times.txt:3"):
        read_arrivals(path)


def test_settings_name_the_bad_key_and_the_valid_ones():
    with pytest.raises(ValueError, match="rates"):
        load_settings({"rates": [1, -2]}, {})
    with pytest.raises(ValueError, match="max_live"):
        load_settings({"rates": [1], "nope": 3}, {})
    s = load_settings({"rates": [4, 1], "requests": 9}, {"requests": 3, "seed": None})
    assert s.rates == [1.0, 4.0] and s.requests == 3 and s.seed == 0


# ---------------------------------------------------------------- open-loop queueing
def test_requests_queue_beyond_max_live_and_join_only_after_arriving():
    dec = decoder("ngram")
    greedy = [greedy_by_recomputation(dec.target.model, p, 6, None) for p in PROMPTS]
    arrivals = [0.0, 0.0, 0.0, 0.0, 1000.0]  # the last arrives long after the others finish
    out = BatchDecoder(dec).generate(PROMPTS, 6, None, max_live=2, arrivals=arrivals)
    assert [o.tokens for o in out.outputs] == greedy
    assert max(out.step_live) == 2
    assert out.joined[2] > 0 and out.joined[3] > 0  # queued behind the first two
    assert out.joined[4] >= 1000.0  # never before its arrival; the idle gap was skipped, not slept
    assert all(f >= j for f, j in zip(out.first_token, out.joined))
    with pytest.raises(ValueError, match="non-decreasing"):
        BatchDecoder(dec).generate(PROMPTS, 6, None, arrivals=[1, 0, 2, 3, 4])


# ---------------------------------------------------------------- allocators
def stats(tree_size: int, depth: int, accepted: int) -> StepStats:
    return StepStats(tree_size=tree_size, depth=depth, accepted=accepted, emitted=accepted + 1, draft_forwards=depth,
                     draft_time=0.0, policy_time=0.0, target_time=0.0, verify_time=0.0, other_time=0.0,
                     widths=[1] * (depth + 1), accepted_ranks=[0] * accepted)


def test_threshold_switches_every_row_off_at_the_batch_size():
    alloc = make_allocator(("threshold", {"disable_by_batch_size": 3}))
    assert alloc.budgets([5, 5], [[], []], 10) == [5, 5]
    assert alloc.budgets([5, 5, 5], [[], [], []], 15) == [1, 1, 1]


def test_schedule_follows_vllms_ranges_gaps_and_tail():
    alloc = make_allocator(("schedule", {"schedule": [[1, 1, 4], [2, 3, 2], [6, 8, 0]]}))
    sizes = {live: alloc.budgets([8] * live, [[]] * live, 8 * live)[0] for live in (1, 2, 3, 4, 5, 6, 9)}
    assert sizes == {1: 5, 2: 3, 3: 3, 4: 3, 5: 3, 6: 1, 9: 1}  # a gap keeps the range before it
    assert alloc.budgets([2], [[]], 2) == [2]  # capped by the row's own budget
    with pytest.raises(ValueError, match="overlap"):
        make_allocator(("schedule", {"schedule": [[1, 4, 2], [3, 5, 1]]}))


def goodput(curve, layout: str = "flat"):
    alloc = make_allocator(("goodput", {"draft_cost": False}))
    alloc.price_batch(Curves(curve), layout)
    return alloc


def test_goodput_speculates_deep_when_nodes_are_cheap_and_not_at_all_when_dear():
    good = [[stats(5, 4, 4)] * 4] * 2  # acceptance ~1: every drafted token accepted
    assert goodput(lambda n: 1.0).budgets([16, 16], good, 32) == [16, 16]
    poor = [[stats(5, 4, 0)] * 4] * 2  # nothing accepted
    assert goodput(lambda n: 1.0 + n).budgets([16, 16], poor, 32) == [1, 1]


def test_goodput_gives_the_row_that_accepts_the_tree():
    hist = [[stats(5, 4, 4)] * 8, [stats(5, 4, 0)] * 8]
    sizes = goodput(lambda n: 1.0 + 0.05 * n).budgets([8, 8], hist, 16)
    assert sizes[0] == 8 and sizes[1] <= 2  # the rejecting row keeps at most a probe node


def test_goodput_keeps_a_row_on_after_one_rejected_step_where_trees_are_cheap():
    # A sequence whose first speculative step was rejected has measured almost nothing: with
    # nodes that cost 1% of a step it must keep drafting (an estimate of 0 would switch it off
    # for good, since a row that never speculates never measures again).
    once = [[stats(5, 4, 0)]]
    assert goodput(lambda n: 1.0 + 0.01 * n).budgets([5], once, 5)[0] > 1
    # Steps rejected again and again still switch it off where nodes are dear.
    assert goodput(lambda n: 1.0 + 0.5 * n).budgets([5], [[stats(5, 4, 0)] * 8], 5) == [1]


def test_goodput_starts_a_joining_row_from_its_companions_acceptance():
    # A row that just joined (no steps) beside rows that accept little: with the pooled prior it
    # starts from their rate and stays off where a step of 2-node trees costs 10% more (3 rows,
    # flat layout: the fixed prior's 0.6 more tokens would pay for it, their ~0.07 does not).
    # Beside rows that accept everything it speculates.
    fresh, poor, good = [], [stats(5, 4, 0)] * 8, [stats(5, 4, 4)] * 8
    dear = lambda n: 1.0 + 0.1 * (n - 1)  # noqa: E731
    assert goodput(dear).budgets([5, 1, 1], [fresh, poor, poor], 7)[0] == 1
    fixed = make_allocator(("goodput", {"draft_cost": False, "pool_prior": False}))
    fixed.price_batch(Curves(dear), "flat")
    assert fixed.budgets([5, 1, 1], [fresh, poor, poor], 7)[0] > 1
    assert goodput(dear).budgets([5, 1, 1], [fresh, good, good], 7)[0] > 1


@pytest.mark.parametrize("name", ["threshold", "schedule", "goodput"])
def test_load_allocators_keep_the_engine_rules(name):
    alloc = make_allocator(name)
    if name == "goodput":
        alloc.price_batch(Curves(lambda n: 1.0 + 0.1 * n), "padded")
    hist = [[stats(4, 3, 2)], [], [stats(2, 1, 0)]]
    # Budgets in [1, cap] at every live size (tests/test_batch.py runs the full rules unpriced).
    for caps in ([4, 6, 2], [8], [3] * 8):
        check_allocation(alloc, caps, (hist * 3)[: len(caps)], sum(caps), lambda b, k: DraftTree.root(1))


# ---------------------------------------------------------------- the cheap switch
def test_a_row_switched_off_builds_nothing_and_drafts_nothing(monkeypatch):
    dec = decoder("model")
    greedy = [greedy_by_recomputation(dec.target.model, p, 6, None) for p in PROMPTS]
    batcher = BatchDecoder(dec, ("threshold", {"disable_by_batch_size": 1}))
    batcher.prepare(len(PROMPTS))
    for policy in batcher._policies:
        monkeypatch.setattr(policy, "build", lambda *a, **k: pytest.fail("a switched-off row was built"))
    out = batcher.generate(PROMPTS, 6, None)
    assert [o.tokens for o in out.outputs] == greedy
    steps = [s for o in out.outputs for s in o.steps]
    assert all(s.tree_size == 1 and s.draft_forwards == 0 for s in steps)
    assert all(rows == live for rows, live in zip(out.step_rows, out.step_live))  # one token per row: plain decoding


# ---------------------------------------------------------------- metrics and a whole run
def test_percentiles_and_summary_names():
    assert percentile([1, 2, 3, 4], 50) == 2.5 and percentile([], 50) is None
    from specframe.experiments.load.serve import Served

    served = Served([0.0, 1.0], [0.0, 1.5], [0.5, 2.0], [1.5, 2.5], [[1, 2, 3], [4]], [0.5, 1.5, 2.0, 2.5], [1, 1, 1, 1])
    s = summarize(served, [[1, 2, 3], [5]], slo_tpot_ms=600)
    assert s["mismatches"] == 1 and s["tokens"] == 4 and s["throughput"] == pytest.approx(4 / 2.5)
    assert s["ttft_p50"] == pytest.approx(0.75) and s["tpot_mean"] == pytest.approx(0.5)
    assert s["goodput"] == pytest.approx(3 / 2.5)  # the one-token request has no TPOT
    for name in ("request_throughput", "latency_p99", "tpot_p90", "live_batch_mean"):
        assert name in s


def test_live_batch_mean_weights_each_step_by_its_own_duration_across_an_idle_gap():
    """Two busy periods, 0.1 s at one live sequence and 0.1 s at two, ten idle seconds between:
    the busy-time mean is 1.5, however long the gap (the clock's jump to the next arrival is
    no step's duration)."""
    from specframe.decode.batch import BatchOutput
    from specframe.decode.engine import GenerationOutput
    from specframe.experiments.load.metrics import round_record
    from specframe.experiments.load.serve import from_batch

    outputs = [GenerationOutput(tokens=[1], wall_time=t) for t in (0.1, 10.1, 10.1)]
    out = BatchOutput(outputs=outputs, step_times=[0.1, 0.1], joined=[0.0, 10.0, 10.0], first_token=[0.1, 10.1, 10.1],
                      step_at=[0.1, 10.1], step_live=[1, 2])
    record = round_record(from_batch(out, [0.0, 10.0, 10.0]), [[1], [1], [1]])
    assert record["live_batch_mean"] == pytest.approx(1.5)


def test_load_run_writes_cells_summary_and_plots_and_resumes(tmp_path, monkeypatch):
    from specframe.experiments.config import load_config
    from specframe.experiments.load.run import LoadRun

    example = Path(__file__).resolve().parents[1] / "examples"
    config = load_config(example / "load-tiny.toml")
    config.arms = [a for a in config.arms if a.name in ("autoregressive", "goodput")]
    config.max_new_tokens = 8
    settings = load_settings(config.load, {"rates": [4.0], "requests": 3})
    summary = LoadRun(config, settings, tmp_path).run()
    assert {c["arm"] for c in summary["cells"]} == {"autoregressive", "goodput"}
    assert all(c["mismatches"] == 0 and c["requests"] == 3 for c in summary["cells"])
    assert json.loads((tmp_path / "summary.json").read_text())["cells"][0]["throughput"] > 0
    assert (tmp_path / "plots" / "load_latency.png").is_file() and (tmp_path / "table.md").is_file()
    monkeypatch.setattr(LoadRun, "_compute", lambda *a: pytest.fail("a stored cell was recomputed"))
    again = LoadRun(config, settings, tmp_path).run()
    assert again["cells"] == summary["cells"]


def test_load_aware_arms_export_to_vllm_and_sglang_with_fidelity():
    from specframe.experiments.config import load_config
    from specframe.serving.engines import export_arm

    arms = {a.name: a for a in load_config(Path(__file__).resolve().parents[1] / "examples" / "load-tiny.toml").arms}
    vllm = export_arm(arms["threshold"], "vllm")
    assert vllm.settings["num_speculative_tokens_per_batch_size"] == [[1, 2, 4], [3, 3, 0]]
    assert any("disable_by_batch_size = 3" in need for need in vllm.needs)
    sglang = export_arm(arms["threshold"], "sglang")
    # The fork's rule is "off above the threshold", vLLM's (and the allocator's) "off at it": 3 -> 2.
    assert sglang.settings["apdative_speculative_batch_size_threshold"] == 2
    assert any("mit-han-lab/fastrl" in need for need in sglang.needs)
    assert export_arm(arms["goodput"], "vllm").fidelity.level == "not expressible"
    assert "num_speculative_tokens_per_batch_size" not in export_arm(arms["fixed"], "vllm").settings


def test_rounds_take_turns_pool_their_requests_and_extend_a_finished_run(tmp_path, monkeypatch):
    from specframe.experiments.config import load_config
    from specframe.experiments.load.run import LoadRun

    config = load_config(Path(__file__).resolve().parents[1] / "examples" / "load-tiny.toml")
    config.arms = [a for a in config.arms if a.name in ("autoregressive", "threshold")]
    config.max_new_tokens = 6
    LoadRun(config, load_settings(config.load, {"rates": [4.0], "requests": 3}), tmp_path).run()
    order: list[tuple[str, int]] = []
    compute = LoadRun._compute

    def spy(self, rate, arm, round_, prompts, key):
        order.append((arm.name, round_))
        return compute(self, rate, arm, round_, prompts, key)

    monkeypatch.setattr(LoadRun, "_compute", spy)
    summary = LoadRun(config, load_settings(config.load, {"rates": [4.0], "requests": 3, "rounds": 3}), tmp_path).run()
    # Round 0 is on disk; rounds 1 and 2 rotate the file's order.
    assert order == [("threshold", 1), ("autoregressive", 1), ("autoregressive", 2), ("threshold", 2)]
    cells = {c["arm"]: c for c in summary["cells"]}
    assert all(c["rounds"] == 3 and c["requests"] == 9 and c["mismatches"] == 0 for c in cells.values())
    rounds = [json.loads(p.read_text()) for p in sorted((tmp_path / "cells").glob("rate-4__autoregressive__*.json"))]
    assert cells["autoregressive"]["throughput"] == pytest.approx(
        sum(r["tokens"] for c in rounds for r in c["requests"]) / sum(c["span"] for c in rounds))


def test_pooled_rounds_take_percentiles_over_every_request():
    from specframe.experiments.load.metrics import pooled

    def rnd(tpots, span):
        rows = [{"arrival": 0.0, "joined": 0.0, "first_token": 0.0, "finish": 2 * t, "tokens": 3, "mismatch": False}
                for t in tpots]
        return {"requests": rows, "span": span, "live_batch_mean": 1.0, "live_batch_max": 1, "row_steps": 4,
                "speculated_steps": 1}

    figures = pooled([rnd([1.0, 3.0], 4.0), rnd([2.0], 2.0)], None)
    assert figures["tpot_p50"] == 2.0 and figures["tpot_mean"] == 2.0  # over all three requests
    assert figures["throughput"] == pytest.approx(9 / 6.0) and figures["speculated"] == 0.25


def test_the_batch_allocators_and_auto_sized_policies_serve_under_load(tmp_path):
    """The closed-loop allocators (shared, acceptance) and a policy sized "auto" at the live batch
    shape run in the load benchmark beside the load-aware ones, greedy-exact."""
    from specframe.experiments.config import load_config
    from specframe.experiments.load.run import LoadRun

    prompts = Path(__file__).resolve().parents[1] / "examples" / "prompts" / "code.jsonl"
    arm = 'drafter = "ngram"\npolicy = "chain"\npolicy_options = {{ gamma = {gamma} }}\n'
    (tmp_path / "load.toml").write_text(
        'name = "load-allocators"\nmax_new_tokens = 8\nwarmup = 0\nthreads = 1\n'
        '[target]\nmodel = "demo-target"\ndtype = "float32"\n'
        '[load]\nrates = [8.0]\nrequests = 4\nmax_live = 3\n'
        '[[arm]]\nbaseline = "autoregressive"\n'
        '[[arm]]\nname = "shared"\n' + arm.format(gamma=4) + 'batch_allocator = "shared"\n'
        '[[arm]]\nname = "acceptance"\n' + arm.format(gamma=4) + 'batch_allocator = "acceptance"\n'
        '[[arm]]\nname = "auto"\n' + arm.format(gamma='"auto"') +
        f'[data]\npath = "{prompts}"\nchat_template = false\n[output]\ndir = "{tmp_path / "runs"}"\n')
    config = load_config(tmp_path / "load.toml")
    summary = LoadRun(config, load_settings(config.load, {}), tmp_path / "out").run()
    cells = {c["arm"]: c for c in summary["cells"]}
    assert set(cells) == {"autoregressive", "shared", "acceptance", "auto"}
    assert all(c["mismatches"] == 0 and c["requests"] == 4 for c in cells.values())
    assert {c["allocator"] for c in cells.values()} == {None, "shared", "acceptance"}


def test_a_request_leaving_its_greedy_decoding_is_listed_with_the_targets_margin(tmp_path, monkeypatch):
    from specframe.experiments.config import load_config
    from specframe.experiments.divergence import logit_margin
    from specframe.experiments.load import run as load_run
    from specframe.experiments.load.command import mismatch_lines
    from specframe.experiments.load.table import markdown_table

    config = load_config(Path(__file__).resolve().parents[1] / "examples" / "load-tiny.toml")
    config.arms = [a for a in config.arms if a.name == "autoregressive"]
    config.max_new_tokens = 6
    serve = load_run.serve_autoregressive

    def one_wrong_token(*args, **kwargs):
        served = serve(*args, **kwargs)
        served.tokens[1][3] = (served.tokens[1][3] + 1) % 50  # request 1 leaves its greedy decoding at token 3
        return served

    monkeypatch.setattr(load_run, "serve_autoregressive", one_wrong_token)
    run = load_run.LoadRun(config, load_settings(config.load, {"rates": [4.0], "requests": 3}), tmp_path)
    summary = run.run()
    (cell,) = summary["cells"]
    assert cell["mismatches"] == 1
    row = json.loads(next((tmp_path / "cells").glob("*.json")).read_text())["requests"][1]
    reference = run._reference[1]
    assert (row["diverged_at"], row["reference_token"], row["token"]) == (3, reference[3], (reference[3] + 1) % 50)
    prompt = run._prompts[1]
    assert row["margin"] == pytest.approx(logit_margin(run._target().model, prompt + reference[:3]))
    assert cell["near_ties"] == (1 if row["margin"] < 1e-3 else 0)
    (line,) = mismatch_lines(tmp_path, summary)
    assert "round 1, request 1: token 3" in line and f"{row['margin']:.3g}" in line
    assert markdown_table(summary).rstrip().endswith("| 1 |" if not cell["near_ties"] else "| 1 (1 near-tie) |")


def test_near_ties_count_only_mismatches_at_a_float32_margin():
    from specframe.experiments.load.metrics import pooled

    rows = [{"arrival": 0.0, "joined": 0.0, "first_token": 0.0, "finish": 1.0, "tokens": 2, "mismatch": m, **extra}
            for m, extra in ((True, {"margin": 3e-5}), (True, {"margin": 0.4}), (False, {}), (True, {}))]
    figures = pooled([{"requests": rows, "span": 1.0, "live_batch_mean": 1.0, "live_batch_max": 1, "row_steps": 1,
                       "speculated_steps": 0}], None)
    assert (figures["mismatches"], figures["near_ties"]) == (3, 1)


def test_specframe_load_prints_mismatches_of_this_runs_cells_only(tmp_path, monkeypatch):
    """A cell file of a rate or arm not in this run (an earlier run into the same folder) is
    not this run's: its mismatch is not printed."""
    import io

    from rich.console import Console

    from specframe.experiments.load import table
    from specframe.experiments.load.command import load_command
    from specframe.experiments.load.run import LoadRun
    from specframe.experiments.load.store import cell_path
    from specframe.experiments.runs import write_json

    def cell(rate, arm):
        row = {"mismatch": True, "diverged_at": 2, "token": 7, "reference_token": 8, "margin": 0.5}
        return {"arm": arm, "rate": rate, "round": 0, "requests": [row]}

    write_json(cell_path(tmp_path, 4.0, "autoregressive", 0), cell(4.0, "autoregressive"))
    write_json(cell_path(tmp_path, 9.0, "autoregressive", 0), cell(9.0, "autoregressive"))  # a rate not in this run
    write_json(cell_path(tmp_path, 4.0, "gone", 0), cell(4.0, "gone"))  # an arm not in this run
    summary = {"settings": {"rates": [4.0], "rounds": 1}, "arms": ["autoregressive"],
               "cells": [{"rate": 4.0, "arm": "autoregressive"}]}
    monkeypatch.setattr(LoadRun, "run", lambda self: summary)
    monkeypatch.setattr(table, "markdown_table", lambda s: "")
    printed = io.StringIO()
    example = Path(__file__).resolve().parents[1] / "examples" / "load-tiny.toml"
    load_command(example, {}, tmp_path, False, Console(file=printed, width=300))
    lines = [ln for ln in printed.getvalue().splitlines() if ln.startswith("mismatch:")]
    assert len(lines) == 1 and "autoregressive @ 4/s" in lines[0], lines
