"""The size chooser of the "auto" options, on synthetic cost curves and acceptance statistics."""

from __future__ import annotations

import math
import time
from dataclasses import replace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import specframe
from specframe.clock import TickClock
from specframe.interfaces import DraftSession, StepStats
from specframe.options import OptionError
from specframe.sizing.profile import CostCurve
from specframe.tree import DraftTree
from specframe.decode.engine import make_plugin
from specframe.testing.models import tiny_model
from specframe.models.target import TargetModel
from specframe.sizing import AutoSizer, Calibration, HostTree, MuBandit, cell_of, deeper, stop_growing
from specframe.sizing import subtree as _subtree
from specframe.sizing.calibration import Q_EDGES, RANKS
from specframe.sizing.cost import CHEAP_LAYER
from specframe.sizing.cost import argmax_first as _argmax
from specframe.sizing.growth import PROBE_EVERY, WINDOW
from specframe.testing.strategies import draft_trees

# T(n)/T(1) measured on a 2-core CPU (SmolLM2-135M, issue 16) and a GPU-like flat curve.
CPU_RATIOS = {1: 1.0, 2: 1.6, 4: 1.7, 8: 1.9, 16: 2.1, 32: 2.5, 64: 4.0}
CPU = CostCurve.synthetic(lambda n: 0.01 * CPU_RATIOS[n], sizes=tuple(CPU_RATIOS))
FLAT = CostCurve.synthetic(lambda n: 0.01)
STEEP = CostCurve.synthetic(lambda n: 0.01 * n)


class _Session:
    """What the sizer reads from a session."""

    def __init__(self, draft_time: float = 0.0, context_len: int | None = None) -> None:
        self.draft_time = draft_time
        self.context_len = context_len


def chain_tree(n: int, q: float) -> DraftTree:
    """A chain of n nodes (root included) whose every token has draft probability q."""
    tree = DraftTree.root(0)
    for i in range(1, n):
        tree = tree.add_nodes(torch.tensor([i - 1]), torch.tensor([i]), tree.logp[i - 1:i] + math.log(q),
                              torch.tensor([0]))
    return tree


def sizer_with(curve: CostCurve, acceptance: float, max_size: int = 64) -> AutoSizer:
    """A sizer whose calibration has seen many tries accepted at rate ``acceptance`` in every bin."""
    sizer = AutoSizer(max_size)
    sizer.curve = curve
    cal = sizer.calibration
    cal.set_counts(cal.tried + 1000.0, cal.accepted + 1000.0 * acceptance)
    return sizer


def test_flat_curve_keeps_the_largest_tree():
    tree = chain_tree(16, 0.9)
    assert len(sizer_with(FLAT, 0.8).prune(tree, _Session())) == 16


def test_steep_curve_sends_a_plain_step():
    # T(n) = n * T(1): no tree yields more than one token per T(1), so root only wins.
    assert len(sizer_with(STEEP, 0.9).prune(chain_tree(16, 0.9), _Session())) == 1


def test_cpu_curve_keeps_a_short_chain_when_acceptance_is_high():
    # (1 + sum of 0.9^k) / T(n): the peak is an interior size, neither root-only nor everything.
    sizer = sizer_with(CPU, 0.9)
    kept = len(sizer.prune(chain_tree(32, 0.95), _Session()))
    rates = [(1 + sum(0.9 ** k for k in range(1, m))) / CPU.time(m) for m in range(1, 33)]
    assert kept == 1 + max(range(32), key=lambda j: rates[j])
    assert 2 < kept < 32


def test_cpu_curve_with_worthless_drafts_sends_a_plain_step():
    assert len(sizer_with(CPU, 0.05).prune(chain_tree(8, 0.9), _Session())) == 1


def test_draft_time_already_spent_does_not_shrink_the_tree_but_overhead_prices_it():
    # A large fixed cost per step makes the marginal target time relatively cheap.
    sizer = sizer_with(CPU, 0.5)
    small = len(sizer.prune(chain_tree(16, 0.9), _Session(draft_time=0.0)))
    sizer.overhead = 0.5
    large = len(sizer.prune(chain_tree(16, 0.9), _Session(draft_time=0.0)))
    assert large > small


def test_pruned_tree_is_the_top_n_by_calibrated_path_probability_and_prefix_closed():
    # A star of 4 children with distinct probabilities plus a grandchild under the best one.
    tree = DraftTree.root(0)
    logq = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    tree = tree.add_nodes(torch.zeros(4, dtype=torch.long), torch.tensor([1, 2, 3, 4]), logq,
                          torch.arange(4))
    tree = tree.add_nodes(torch.tensor([1]), torch.tensor([5]), tree.logp[1:2] + math.log(0.9), torch.tensor([0]))
    sizer = sizer_with(CostCurve.synthetic(lambda n: 0.01 * (1 + 0.02 * (n - 1))), 0.5)
    kept = sizer.prune(tree, _Session())
    kept.check_valid(len(tree))
    assert 1 < len(kept) <= len(tree)
    assert bool((kept.logp[1:] <= kept.logp[kept.parents[1:]]).all())


def test_cells_bin_by_conditional_probability_rank_and_depth():
    shape = Calibration.SHAPE
    index = lambda rank_class, depth_class, b: (rank_class * shape[1] + depth_class) * shape[2] + b  # noqa: E731
    assert cell_of(math.log(0.95), 0) == index(0, 0, len(Q_EDGES) - 1)  # the (0.9, 0.97] bin
    assert cell_of(math.log(1e-6), 1) == index(1, 0, 0)  # the lowest bin, "other ranks"
    assert cell_of(0.0, 0) == index(0, 0, len(Q_EDGES))  # probability 1: the last bin
    assert cell_of(0.0, 0, depth=2) == index(0, 1, len(Q_EDGES))
    assert cell_of(0.0, 3, depth=7) == index(1, shape[1] - 1, len(Q_EDGES))  # deep: the last class
    # A node one level deeper: the next depth class, the last one stays.
    assert deeper(cell_of(0.5, 0, depth=1)) == cell_of(0.5, 0, depth=2)
    assert deeper(cell_of(0.5, 1, depth=9)) == cell_of(0.5, 1, depth=9)
    assert len({cell_of(math.log(q), r, d) for q in (1e-6, 0.5, 1.0) for r in (0, 1) for d in (1, 2, 3)}) == 18


def test_host_tree_scores_path_products_incrementally_and_whole_alike():
    cal = Calibration()
    for depth in (1, 2, 3):  # the chain's nodes fill every depth class
        cal.record([cell_of(math.log(0.95), 0, depth)] * 8, [True] * 6 + [False] * 2)
    tree = chain_tree(6, 0.95)
    grown = HostTree()
    grown.extend(tree.select(torch.arange(3)), cal)
    grown.extend(tree, cal)
    whole = HostTree.of(tree, cal)
    c = cal.probabilities()[0, :, len(Q_EDGES) - 1].tolist()  # per depth class
    assert whole.cal == pytest.approx(grown.cal)
    expected = [sum(math.log(c[min(d, len(c)) - 1]) for d in range(1, k + 1)) for k in range(6)]
    assert whole.cal == pytest.approx(expected)


@given(draft_trees(max_nodes=24), st.integers(0, 4))
def test_host_tree_cells_equal_cell_of(tree, run):
    """HostTree inlines cell_of for speed: every node's cell, from its conditional draft
    probability, rank and depth plus the run, is the reference's."""
    host = HostTree.of(tree, Calibration(), run)
    logp, parents = tree.logp.tolist(), tree.parents.tolist()
    expected = [cell_of(logp[i] - logp[parents[i]], int(tree.ranks[i]), int(tree.depths[i]) + run)
                for i in range(1, len(tree))]
    assert host.cells[1:] == expected
    assert host.depths == tree.depths.tolist() and host.parents[1:] == parents[1:]


@given(draft_trees(max_nodes=24), st.floats(0.0, 0.01), st.floats(0.0, 0.005), st.floats(0.0, 0.005),
       st.floats(0.0, 0.003), st.floats(0.0, 0.001), st.sampled_from([CPU, FLAT, STEEP, None]))
def test_one_pass_size_choice_equals_the_rates_reference(tree, sunk, layer, deep, overhead, per_node, curve):
    """The pruner's fused loop picks the sizes that rates() and _argmax pick, for this step
    (draft time sunk) and for the steady state (draft layers priced per depth level)."""
    sizer = sizer_with(curve, 0.6) if curve is not None else AutoSizer(64)
    sizer.layer_cost, sizer.deep_layer_cost, sizer.overhead, sizer.correction = layer, deep, overhead, 1.3
    sizer.node_overhead = per_node
    host = HostTree.of(tree, sizer.calibration)
    order = sorted(range(1, len(host)), key=lambda i: (-host.cal[i], i))
    gains = [math.exp(host.cal[i]) for i in order]
    now = _argmax(sizer.rates(gains, sunk, 100)) + 1
    steady = _argmax(sizer.rates(gains, sizer._layer_costs(order, host.depths), 100)) + 1
    assert sizer._best_sizes(host, order, sunk, 100) == (now, steady)


def test_one_pass_size_choice_breaks_ties_to_the_smaller_tree():
    sizer = sizer_with(FLAT, 0.6)
    host = HostTree()
    host.parents, host.depths, host.cal = [-1, 0, 0], [0, 1, 1], [0.0, -math.inf, -math.inf]  # worthless nodes
    assert sizer._best_sizes(host, [1, 2], 0.0, None) == (1, 1)


def test_calibration_starts_optimistic_and_learns():
    cal = Calibration()
    assert float(cal.probabilities().min()) >= 0.5
    cal.record([0] * 50, [False] * 50)
    assert float(cal.probabilities()[0, 0, 0]) < 0.05
    # A deeper node of that bin, not tried yet, starts from what its bin learned one level up.
    assert float(cal.probabilities()[0, 1, 0]) < 0.1
    assert float(cal.probabilities()[1, 1, 0]) >= 0.5  # ... the other rank class is untouched


@given(st.lists(st.lists(st.tuples(st.integers(0, 2 * 3 * Calibration.BINS - 1), st.booleans()), max_size=12),
                max_size=8))
def test_calibration_table_updated_per_column_equals_the_full_recomputation(steps):
    """log_c recomputes only the columns a record touched; any sequence of records must leave
    the same table as recomputing every cell (a wrong column index or depth order fails)."""
    cal = Calibration()
    cal.log_c()
    for step in steps:
        cal.record([cell for cell, _ in step], [ok for _, ok in step])
        assert cal.log_c() == pytest.approx(cal.full_log_c(), abs=1e-12)


class _UntimedSession(DraftSession):
    """A session whose draft time stays 0, so that a hiccup of this machine cannot tilt the rates."""

    def expand(self, tree, nodes):
        out = super().expand(tree, nodes)
        self.draft_time = 0.0
        return out

    def expand_top(self, tree, nodes, k):
        out = super().expand_top(tree, nodes, k)
        self.draft_time = 0.0
        return out


def _fallback_step(tree: DraftTree, session: DraftSession, curve: CostCurve) -> StepStats:
    """A verified step where every drafted node was rejected (only the bonus token)."""
    return StepStats(tree_size=len(tree), depth=tree.max_depth, accepted=0, emitted=1,
                     draft_forwards=session.draft_forwards, draft_time=session.draft_time, policy_time=0.0,
                     target_time=curve.time(len(tree)), verify_time=0.0, other_time=0.0,
                     widths=tree.width_per_depth(), accepted_ranks=[])


#: Scales of the CPU curve that make the n-gram lookup's layer (some microseconds of Python) a
#: dear draft (T(1) = 10 us) or a free one (T(1) = 100 s): a fixed verdict on any machine.
CURVE_SCALE = {"dear": 1e-5, "free": 100.0}


@pytest.mark.parametrize("drafting", sorted(CURVE_SCALE))
@pytest.mark.parametrize("policy,explores", [
    (("talon", {"budget": "auto", "mu": "auto"}), True), (("chain", {"gamma": "auto"}), True),
    (("eagle", {"budget": "auto"}), True),
    # OPT-Tree's own rule stops after one 1e-6 node, and one node at the prior 0.5 cannot pay
    # T(2) = 1.6 T(1): it never needs to try the guesses.
    (("opt-tree", {"budget": "auto"}), False)])
def test_ngram_fallback_guesses_are_learned_worthless(policy, explores, drafting):
    """With no n-gram match the drafter only offers its 1e-6 fallback; auto must end at plain steps."""
    target = TargetModel(tiny_model("llama", seed=0, vocab_size=64))
    drafter = make_plugin("drafters", "ngram", target)
    drafter.begin(torch.arange(10, 30))  # distinct tokens: nothing ever matches past the prompt
    pol = make_plugin("policies", policy)
    curve = CostCurve.synthetic(lambda n: CURVE_SCALE[drafting] * CPU_RATIOS[n], sizes=tuple(CPU_RATIOS))
    pol.sizer.curve = curve
    sizes, drafted = [], []
    for _ in range(40):
        session = _UntimedSession(drafter, 63, torch.device("cpu"), context_len=21)
        tree = pol.build(session, 64)
        sizes.append(len(tree))
        drafted.append(session.draft_forwards > 0)
        pol.observe(_fallback_step(tree, session, curve))
    assert (max(sizes[:3]) > 1) == explores, "the optimistic start must verify some guesses"
    assert sizes[-10:] == [1] * 10
    assert pol.sizer.cheap_drafts == (drafting == "free")
    if drafting == "dear":  # ... in the dry spell the drafter is only asked on one step in PROBE_EVERY
        assert 0 < drafted[-20:].count(True) <= 20 // PROBE_EVERY + 1
    else:  # ... while a free drafter is asked on every step: a match may turn up any time
        assert drafted[-20:] == [True] * 20


def test_matched_ngram_drafts_grow_the_tree_again():
    """After learning that fallbacks are worthless, confident matched drafts still get verified."""
    sizer = sizer_with(CPU, 0.9)
    tried, accepted = sizer.calibration.tried, sizer.calibration.accepted
    tried[..., 0], accepted[..., 0] = 100.0, 0.0  # the fallback bin: always rejected
    sizer.calibration.set_counts(tried, accepted)
    assert len(sizer.prune(chain_tree(8, 1e-6), _Session())) == 1
    assert len(sizer.prune(chain_tree(8, 1.0), _Session())) > 1


def test_build_cap_follows_the_sizes_that_pay():
    sizer = sizer_with(FLAT, 0.9, max_size=64)
    for _ in range(6):
        sizer.prune(chain_tree(sizer.cap, 0.95), _Session())
    assert sizer.cap == 64
    sizer.curve = STEEP
    for _ in range(6):
        sizer.prune(chain_tree(sizer.cap, 0.95), _Session())
    assert sizer.cap == 2


def test_layer_cost_is_timed_per_layer():
    sizer = AutoSizer(16)
    sizer.begin()
    for _ in range(3):
        time.sleep(0.01)
        sizer.layer_done()
    assert 0.009 < sizer.layer_cost < 0.1


def test_first_and_later_layers_are_priced_apart():
    """Growth adds a later layer, so its price is a later layer's (a frontier under a tree mask
    can cost more than the first layer); a tree d layers deep costs the first plus d - 1 later."""
    sizer = AutoSizer(16)
    for _ in range(3):
        sizer.begin()
        time.sleep(0.002)
        sizer.layer_done()  # the first layer
        time.sleep(0.02)
        sizer.layer_done(last=True)  # a second, dearer one
    assert sizer.layer_cost < 0.01 < sizer.next_layer_cost == sizer.deep_layer_cost
    assert sizer.draft_seconds(3) == pytest.approx(sizer.layer_cost + 2 * sizer.deep_layer_cost)
    fresh = AutoSizer(16)
    fresh.layer_cost = 0.004  # no later layer timed yet: the first's price stands in
    assert fresh.next_layer_cost == 0.004 and fresh.draft_seconds(2) == pytest.approx(0.008)


def test_a_build_that_stops_growing_prices_only_the_layers_it_drafted():
    """The time from the check that stops growth to the prune is not a layer: counted as one,
    every early stop halved the price of a layer."""
    sizer = AutoSizer(16)
    sizer.curve, sizer.rate = STEEP, 1e9  # no layer can pay: growth stops after the first
    tree = chain_tree(2, 0.5)
    for _ in range(10):
        sizer.begin()
        time.sleep(0.01)
        assert stop_growing(sizer, tree, torch.tensor([1]), _Session())
        sizer.prune(tree, _Session())
    assert sizer.layer_cost > 0.0095


@pytest.mark.parametrize("reindexed", [False, True])
@pytest.mark.parametrize("keep", [[0], [0, 1], [0, 2, 6], [0, 1, 3, 4], [0, 1, 2, 3, 4, 5, 6]])
def test_host_built_subtree_equals_select(keep, reindexed):
    """The pruner's fast path (indices and re-indexed parents known on the host) beside
    DraftTree.select, the checked reference, on a fresh tree (no origins yet) and on one
    selected before (origins compose)."""
    tree = DraftTree.root(3)
    tree = tree.add_nodes(torch.tensor([0, 0, 0]), torch.tensor([5, 6, 7]), torch.log(torch.tensor([0.5, 0.3, 0.2])),
                          torch.arange(3))
    tree = tree.add_nodes(torch.tensor([1, 1, 2]), torch.tensor([8, 9, 10]), tree.logp[[1, 1, 2]] - 1.0,
                          torch.tensor([0, 1, 0]))
    if reindexed:
        tree = tree.select(torch.tensor([0, 1, 2, 3, 4, 5, 6]))  # origins, as after an earlier select
        tree = tree.select(torch.arange(7))
    index = {old: new for new, old in enumerate(keep)}
    parents = [index[int(tree.parents[i])] if i else -1 for i in keep]
    fast, ref = _subtree(tree, keep, parents), tree.select(torch.tensor(keep))
    for name in ("tokens", "parents", "depths", "logp", "ranks"):
        assert torch.equal(getattr(fast, name), getattr(ref, name)), name
    assert torch.equal(fast.origins(), ref.origins())
    fast.check_valid(len(fast))


def _verified(tree: DraftTree, accepted: int, total: float, target: float) -> StepStats:
    return StepStats(tree_size=len(tree), depth=tree.max_depth, accepted=accepted, emitted=accepted + 1,
                     draft_forwards=tree.max_depth, draft_time=0.0, policy_time=0.0, target_time=target,
                     verify_time=0.0, other_time=total - target, widths=tree.width_per_depth(),
                     accepted_ranks=[0] * accepted)


def _rest_fit(sizes: list[int], fixed: float, per_node: float, steps: int = 400, in_policy: bool = False) -> AutoSizer:
    """A sizer that observed ``steps`` steps cycling through ``sizes``, each with a rest of
    ``fixed + per_node * (size - 1)`` seconds besides a 10 ms target forward, spent after the
    choice (verification, commit) or, with ``in_policy``, its per-node part in the policy (building)."""
    sizer = sizer_with(FLAT, 0.5)
    for i in range(steps):
        tree = chain_tree(sizes[i % len(sizes)], 0.9)
        sizer.prune(tree, _Session(), choose=False)
        grows = per_node * (len(tree) - 1)
        step = _verified(tree, accepted=0, total=0.01 + fixed + (0.0 if in_policy else grows), target=0.01)
        sizer.observe(replace(step, policy_time=grows) if in_policy else step)
    return sizer


def test_rest_of_a_step_is_fitted_as_a_fixed_part_plus_a_part_per_node():
    sizer = _rest_fit([2, 4, 6, 8, 9, 3], fixed=0.001, per_node=0.0002)
    assert sizer.node_overhead == pytest.approx(0.0002, rel=0.05)
    assert sizer.overhead == pytest.approx(0.001, rel=0.05)
    assert sizer.rest_seconds(8) == pytest.approx(0.001 + 7 * 0.0002, rel=0.05)


def test_building_time_is_not_priced_per_kept_node():
    # The policy's building cost is spent before the choice: larger builds keep larger trees,
    # but keeping fewer of the built nodes would not save it.
    sizer = _rest_fit([2, 4, 6, 8, 9, 3], fixed=0.001, per_node=0.0002, in_policy=True)
    assert sizer.node_overhead == pytest.approx(0.0, abs=1e-6)
    assert sizer.overhead == pytest.approx(0.001 + 0.0002 * (sum([1, 3, 5, 7, 8, 2]) / 6), rel=0.25)


def test_a_fixed_tree_size_fits_no_part_per_node():
    # One size says nothing about how the rest grows with the size: all of it is fixed.
    sizer = _rest_fit([6], fixed=0.001, per_node=0.0002)
    assert sizer.node_overhead == 0.0
    assert sizer.overhead == pytest.approx(0.001 + 5 * 0.0002)


def test_one_outlying_rest_does_not_tilt_the_fitted_part_per_node():
    sizer = _rest_fit([2, 8], fixed=0.001, per_node=0.0002)
    tree = chain_tree(8, 0.9)
    sizer.prune(tree, _Session(), choose=False)
    sizer.observe(_verified(tree, accepted=0, total=0.01 + 0.05, target=0.01))  # a 50 ms pause
    assert sizer.node_overhead < 0.0002 * 2


def test_a_per_node_rest_fitted_on_outliers_fades_over_plain_steps():
    """A slope of 0.1 s a node (garbage: a loaded machine's pauses) sends plain steps only, and
    plain steps can never refit it: it must fade, or the sizer stays at the root for good."""
    tree = chain_tree(8, 0.9)
    sizer = sizer_with(CostCurve.synthetic(lambda n: 0.01 * (1 + 0.02 * (n - 1))), 0.9)
    sizer.observe_timing(1, None, _verified(chain_tree(1, 1.0), 0, 0.011, 0.01))  # a rate: not the first step
    sizer.node_overhead = 0.1
    assert len(sizer.prune(tree, _Session())) == 1
    root = chain_tree(1, 1.0)
    for _ in range(60):
        sizer.prune(root, _Session(), choose=False)
        sizer.observe(_verified(root, accepted=0, total=0.0105, target=0.01))
    assert sizer.node_overhead < 1e-3 and len(sizer.prune(tree, _Session())) > 1


def test_rest_per_node_keeps_a_smaller_tree():
    tree = chain_tree(16, 0.9)
    sizer = sizer_with(CostCurve.synthetic(lambda n: 0.01 * (1 + 0.02 * (n - 1))), 0.6)
    plain = len(sizer.prune(tree, _Session()))
    sizer.node_overhead = 0.0005
    assert 1 < len(sizer.prune(tree, _Session())) < plain


def _guess_after_layer_one(sizer: AutoSizer, accepted: int, steps: int = 30, cell: int | None = None) -> None:
    """Steps that guess (0.9 x 0.9, priced with ``cell``) a second layer is worth drafting, then
    verify a 3-node chain with ``accepted`` drafted tokens accepted."""
    for _ in range(steps):
        sizer.begin()
        tree = chain_tree(3, 0.9)
        host = sizer.grown(tree)
        sizer.rate = 1e-3  # time is nearly free, so every guess grows, however slow this machine
        assert sizer.worth_growing(0.9, 0.9, 2, None, host.depths[1], cell)
        sizer.prune(tree, _Session(), choose=False)
        sizer.observe(_verified(tree, accepted=accepted, total=0.02, target=0.01))


def test_growth_guesses_that_fail_lower_the_growth_factor_and_stop_growth():
    """'A child as sure as its parent' is checked against the accepted depth: guesses that
    never pay bring the factor down until the same guess no longer grows the tree."""
    sizer = sizer_with(FLAT, 0.9)
    assert sizer.growth_factor() == 1.0
    _guess_after_layer_one(sizer, accepted=1)  # depth 2 never reached
    assert sizer.growth_factor() < 0.2
    # Price of a layer: 20 tokens/s x (0.01 s + the flat curve's zero slope) = 0.2 tokens; the
    # guess 0.81 would buy it at factor 1, not at the learned one.
    sizer.rate, sizer.layer_cost = 20.0, 0.01
    assert 0.81 >= sizer.rate * sizer.layer_cost
    assert not sizer.worth_growing(0.9, 0.9, 2, None, 1)


def test_growth_guesses_that_pay_keep_the_factor_near_one():
    sizer = sizer_with(FLAT, 0.9)
    _guess_after_layer_one(sizer, accepted=2)  # depth 2 reached
    assert sizer.growth_factor() > 1.0  # paid more often than the 0.81 guessed


def test_growth_factor_is_kept_per_cell():
    """Fallback guesses that never pay must not stop the growth of matched drafts."""
    sizer = sizer_with(FLAT, 0.9)
    fallback, matched = deeper(cell_of(math.log(1e-6), 0)), deeper(cell_of(0.0, 0))
    _guess_after_layer_one(sizer, accepted=1, cell=fallback)
    _guess_after_layer_one(sizer, accepted=2, cell=matched)
    assert sizer.growth_factor(fallback) < 0.2
    assert sizer.growth_factor(matched) > 1.0
    sizer.rate, sizer.layer_cost = 20.0, 0.01
    assert sizer.worth_growing(0.9, 0.9, 2, None, 1, matched)
    assert not sizer.worth_growing(0.9, 0.9, 2, None, 1, fallback)


def test_a_cell_without_evidence_follows_the_pooled_growth_factor():
    sizer = sizer_with(FLAT, 0.9)
    _guess_after_layer_one(sizer, accepted=1, cell=deeper(cell_of(math.log(0.5), 0)))
    untried = deeper(cell_of(math.log(0.95), 1))
    assert sizer.growth_factor(untried) == pytest.approx(sizer.growth_factor()) and sizer.growth_factor() < 0.2


def test_deep_nodes_are_calibrated_apart_from_shallow_ones():
    """Copied spans: a matched draft that survived two checks is accepted far more often than a
    first one; the depth class keeps that apart, and the chooser keeps a long chain for it."""
    sizer = sizer_with(CPU, 0.4)
    tried, accepted = sizer.calibration.tried, sizer.calibration.accepted
    accepted[:, 2:, :] = 0.95 * tried[:, 2:, :]  # depth 3 and deeper
    sizer.calibration.set_counts(tried, accepted)
    tree = chain_tree(12, 1.0)
    host = HostTree.of(tree, sizer.calibration)
    assert [round(math.exp(v), 2) for v in host.log_c[1:5]] == [0.4, 0.4, 0.95, 0.95]
    assert len(sizer.prune(tree, _Session())) == 12
    shallow = sizer_with(CPU, 0.4)  # the same chain at 0.4 everywhere does not pay
    assert len(shallow.prune(tree, _Session())) < 4


def test_a_run_accepted_by_the_last_step_calibrates_the_next_tree_as_deeper():
    """A copy that the last step accepted goes on: the next tree's nodes extend a run of
    accepted drafted tokens and are calibrated by the run's length, not by the tree depth."""
    sizer = sizer_with(CPU, 0.2)
    tried, accepted = sizer.calibration.tried, sizer.calibration.accepted
    accepted[:, 2:, :] = 0.95 * tried[:, 2:, :]  # runs of 3 and longer
    sizer.calibration.set_counts(tried, accepted)
    tree = chain_tree(8, 1.0)
    assert len(sizer.prune(tree, _Session())) < 3  # a fresh start: 0.2, then 0.2 again
    sizer.prune(chain_tree(3, 1.0), _Session(), choose=False)
    sizer.observe(_verified(chain_tree(3, 1.0), accepted=2, total=0.02, target=0.01))
    assert sizer.run == 2
    sizer.begin()
    host = sizer.grown(tree)
    assert [round(math.exp(v), 2) for v in host.log_c[1:4]] == [0.95, 0.95, 0.95]
    assert len(sizer.prune(tree, _Session())) == 8
    sizer.reset()  # a new sequence starts without a run
    assert sizer.run == 0 and math.exp(HostTree.of(tree, sizer.calibration).log_c[1]) == pytest.approx(0.2, abs=0.01)


def test_drafting_that_never_pays_for_itself_starts_a_dry_spell():
    """Dear draft layers: a sunk draft is still worth verifying, but in steady state a plain
    step is faster, so after WINDOW such steps most steps skip drafting."""
    sizer = sizer_with(CPU, 0.5)
    sizer.layer_cost = 0.05  # five plain steps per draft layer
    for _ in range(WINDOW):
        assert len(sizer.prune(chain_tree(4, 1.0), _Session())) > 1  # the draft is spent: verify it
    session = _Session()
    session.new_tree = lambda: DraftTree.root(0)
    skipped = []
    for _ in range(4 * PROBE_EVERY):
        skipped.append(sizer.skip(session) is not None)
        if not skipped[-1]:  # a probe drafts, and its tree is chosen as before
            sizer.prune(chain_tree(4, 1.0), _Session())
    assert skipped.count(False) <= 4 + 1 and skipped.count(True) >= 3 * PROBE_EVERY - 1


def test_a_free_drafter_ignores_the_growth_factor():
    """A copied span must be drafted in full even after growth guesses failed elsewhere."""
    sizer = sizer_with(STEEP, 0.9)  # a node costs 0.01 s: at 40 tokens/s its price is 0.4 tokens
    cell = deeper(cell_of(0.0, 0))
    _guess_after_layer_one(sizer, accepted=1, cell=cell)
    sizer.correction = 1.0  # the steps above taught it their own timings
    sizer.rate, sizer.layer_cost = 40.0, 0.01 * CHEAP_LAYER  # a dear layer, just
    assert sizer.growth_factor(cell) < 0.4 and not sizer.cheap_drafts
    assert not sizer.worth_growing(0.9, 0.9, 2, None, 1, cell)  # 0.81 x factor < 0.4
    sizer.layer_cost = 1e-6  # the same guess with a free layer: the factor no longer applies
    assert sizer.cheap_drafts and sizer.worth_growing(0.9, 0.9, 2, None, 1, cell)


def test_a_free_drafter_builds_to_the_largest_size():
    sizer = sizer_with(CPU, 0.5, max_size=40)
    sizer.kept.extend([1, 1, 1, 1])  # plain steps lately
    sizer.layer_cost = 0.5 * 0.01  # half a T(1): dear
    assert sizer.cap == 2
    sizer.layer_cost = 1e-6  # far under CHEAP_LAYER of T(1)
    assert sizer.cheap_drafts and sizer.cap == 40


def _root_steps(sizer: AutoSizer, accepted_rank: int | None, steps: int, width: int = 8) -> None:
    """``steps`` verified steps whose root had children of ranks 0..width-1, ``accepted_rank``
    accepted (None: none)."""
    for _ in range(steps):
        sizer.ranks.record(list(range(width)), accepted_rank)


@pytest.mark.parametrize("layer_cost", [0.5 * 0.01, 1e-6], ids=["dear", "free"])
@pytest.mark.parametrize("habit,first_width", [("top-1 only", 1), ("ranks 2-8 accepted", 9)])
def test_talon_auto_root_width_follows_the_acceptance_by_rank(layer_cost, habit, first_width):
    """The root keeps rank k while rank k's calibrated acceptance pays for its row, whatever a
    layer costs: a drafter whose lower ranks are never accepted (an n-gram lookup's fallback
    guesses) starts with one child; one whose ranks 2-8 take turns (Token Recycling's table,
    ~47% of first accepted tokens) keeps the root's Top-K."""
    from specframe.testing.synthetic import SyntheticDrafter, make_session

    policy = make_plugin("policies", ("talon", {"budget": "auto", "mu": 0.03, "top_k": 9}))
    sizer = policy.sizer
    sizer.curve, sizer.layer_cost, sizer.rate = CPU, layer_cost, 40.0
    sizer.kept.extend([8] * WINDOW)  # cap 16
    for step in range(400):
        accepted = 0 if habit == "top-1 only" or step % 2 else 1 + (step // 2) % 8
        sizer.ranks.record(list(range(9)), accepted)
    sizer.prune = lambda tree, session, choose=True: tree  # the tree as built
    tree = policy.build(make_session(SyntheticDrafter(vocab_size=32, mode="random", temperature=2.0, seed=1)), 64)
    assert tree.width_per_depth()[1] == first_width


def test_rank_acceptance_is_optimistic_then_learns_and_retries_an_unused_rank():
    sizer = AutoSizer(16)
    assert sizer.ranks.width(8, 0.1) == 8  # nothing seen: every rank is worth a try
    _root_steps(sizer, 0, 200)
    assert sizer.ranks.width(8, 0.1) == 1 and sizer.ranks.probability(RANKS) == 0.0
    for _ in range(3000):  # only rank 0 drafted: the others' evidence fades, and they are tried again
        sizer.ranks.record([0], 0)
    assert sizer.ranks.width(8, 0.1) == 8


def test_rank_acceptance_is_learned_from_the_verified_root_children():
    sizer = sizer_with(FLAT, 0.5)
    tree = DraftTree.root(5).add_nodes(torch.tensor([0, 0, 0]), torch.tensor([1, 2, 3]),
                                       torch.log(torch.tensor([0.5, 0.3, 0.1])), torch.tensor([0, 1, 2]))
    for _ in range(50):
        sizer.prune(tree, _Session(), choose=False)
        sizer.observe(replace(_verified(tree, 1, 0.02, 0.01), accepted_ranks=[2]))
    assert sizer.ranks.probability(2) > 0.9 > 0.1 > sizer.ranks.probability(1)


def test_mu_bandit_settles_on_the_best_gate():
    gen = torch.Generator().manual_seed(0)
    best = {0.01: 1.0, 0.03: 1.3, 0.1: 1.1, 0.3: 0.9, 1.0: 0.7}
    bandit = MuBandit()
    plays = []
    for _ in range(400):
        mu = bandit.choose()
        plays.append(mu)
        bandit.reward(best[mu] + 0.3 * float(torch.randn(1, generator=gen)))
    assert bandit.best == 0.03
    assert plays[-100:].count(0.03) > 50


@pytest.mark.parametrize("policy,option", [("talon", "budget"), ("talon", "mu"), ("eagle", "budget"),
                                           ("opt-tree", "budget"), ("chain", "gamma")])
def test_auto_is_an_option_value_and_other_strings_are_not(policy, option):
    assert make_plugin("policies", (policy, {option: "auto"}))
    with pytest.raises(OptionError, match=option):
        make_plugin("policies", (policy, {option: "big"}))


def test_auto_gamma_refuses_the_heuristic_schedule():
    with pytest.raises(OptionError, match="schedule"):
        make_plugin("policies", ("chain", {"gamma": "auto", "schedule": "heuristic"}))


def test_decoder_attaches_the_cached_curve(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECFRAME_CACHE", str(tmp_path))
    model = tiny_model("llama", seed=1, vocab_size=64)
    dec = specframe.SpecDecoder.build(target=model, drafter=("model", {"model": model}),
                                      policy=("talon", {"budget": "auto", "mu": "auto"}))
    curve = dec.policy.sizer.curve
    assert curve is not None and (tmp_path / "profiles" / f"{curve.key}.json").exists()
    out = dec.generate([3, 4, 5], max_new_tokens=12, eos_token_id=None)
    assert len(out.tokens) == 12


def test_auto_trees_are_really_drafted_and_accepted(tmp_path, monkeypatch):
    """Guard against vacuous lossless tests: on a tiny model (a flat-ish curve) with a close
    draft, auto keeps multi-node trees and they are accepted."""
    from specframe.testing.models import perturbed_copy

    monkeypatch.setenv("SPECFRAME_CACHE", str(tmp_path))
    target = tiny_model("llama", seed=0, vocab_size=64, dtype=torch.float64)
    draft = perturbed_copy(target, 0.05, seed=100)
    dec = specframe.SpecDecoder.build(target=target, drafter=("model", {"model": draft}),
                                      policy=("talon", {"budget": "auto", "mu": "auto"}))
    dec.policy.sizer.curve = FLAT  # a GPU-like curve
    # The sizer prices layers and steps by the seconds it measures: on a loaded machine drafting
    # looks dear against the fixed curve and the trees shrink. A ticking clock makes every
    # measured span a few ticks, whatever the load, so the sizes depend on the models alone.
    monkeypatch.setattr(time, "perf_counter", TickClock(1e-4))
    out = dec.generate(list(range(2, 12)), max_new_tokens=48, eos_token_id=None)
    monkeypatch.undo()
    assert max(s.tree_size for s in out.steps) > 4
    assert out.tau > 1.5, out.tau


@pytest.mark.parametrize("policy", [("talon", {"budget": "auto", "mu": "auto"}), ("chain", {"gamma": "auto"})])
def test_auto_fast_step_still_reads_the_device_once(policy, tmp_path, monkeypatch):
    """The chooser's reads are the policy's own (inside build); the engine's stay at one."""
    from specframe.testing.host_reads import count_step_reads

    monkeypatch.setenv("SPECFRAME_CACHE", str(tmp_path))
    target = tiny_model("llama", seed=3)
    dec = specframe.SpecDecoder.build(target=target, drafter=("model", {"model": target}), policy=policy,
                                      strict=False)
    reads = count_step_reads(dec, [5, 6, 7], max_new_tokens=24)
    assert reads["steps"] > 1 and reads["engine"] == reads["steps"]


@pytest.mark.parametrize("drafter", ["model", "ngram", "eagle3"])
def test_dry_spells_skip_drafting_and_stay_lossless(drafter, tmp_path, monkeypatch):
    """On a steep curve every step is plain, most without drafting: drafters must cope with
    steps they were never asked about (a model drafter's cache catches up on commit)."""
    from specframe.drafters.eagle_checkpoint import random_head
    from specframe.testing.models import perturbed_copy

    monkeypatch.setenv("SPECFRAME_CACHE", str(tmp_path))
    target = tiny_model("llama", seed=0, vocab_size=64, dtype=torch.float64)
    draft = perturbed_copy(target, 1.0, seed=100)  # a poor draft: nothing pays
    spec = {"model": ("model", {"model": draft}), "ngram": ("ngram", {}),
            "eagle3": ("eagle3", {"head": random_head(draft, "eagle3", seed=2, draft_vocab_size=40)})}[drafter]
    dec = specframe.SpecDecoder.build(target=target, drafter=spec, policy=("chain", {"gamma": "auto"}))
    dec.policy.sizer.curve = STEEP
    prompt = list(range(2, 12))
    ids = torch.tensor([prompt])
    ref = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=40,
                          min_new_tokens=40)[0, len(prompt):].tolist()
    for _ in range(2):
        out = dec.generate(prompt, max_new_tokens=40, eos_token_id=None)
        assert out.tokens == ref
    assert sum(s.draft_forwards == 0 for s in out.steps) >= len(out.steps) // 4
