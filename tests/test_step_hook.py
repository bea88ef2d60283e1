"""The policy budget contract, the engine's ``on_step`` hook and node identity across select().

* Budget: a policy builds at most the ``budget`` it is given; the engine alone bounds it by the
  policy's ``max_budget`` (from :class:`specframe.BudgetOptions`, or an override) and the room
  left in the context.
* ``generate(on_step=...)`` hands every verified step's tree, accepted path and stats over.
* ``DraftTree.select`` keeps ``origins()``, so the model drafter keeps the right cache entries
  of a re-indexed tree without matching tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

import specframe
from specframe.decode.engine import EngineError, make_plugin
from specframe.interfaces import DraftSession
from specframe.options import OptionError
from specframe.testing.models import tiny_model


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", seed=0, max_positions=64, dtype=torch.float64)


# ---------------------------------------------------------------------- budget contract
@dataclass
class _RecordingOptions(specframe.BudgetOptions):
    budget: int = 12
    extra: int = 0  # nodes over the given budget (a broken policy)

    def __post_init__(self) -> None:
        super().__post_init__()


class _RecordingPolicy(specframe.TreePolicy):
    """A greedy chain that fills exactly the budget it is given (plus ``extra``)."""

    name = "recording"
    Options = _RecordingOptions

    def __init__(self, options):
        super().__init__(options)
        self.given: list[int] = []

    def build(self, session, budget):
        self.given.append(budget)
        tree, node = session.new_tree(), 0
        while len(tree) < budget + self.options.extra:
            logp = session.expand(tree, [node])[0]
            tok = int(logp.argmax())
            tree = tree.add_nodes(torch.tensor([node]), torch.tensor([tok]), tree.logp[node:node + 1] + logp[tok])
            node = len(tree) - 1
        return tree


def _decoder(target, policy, drafter=None):
    return specframe.SpecDecoder.build(target=target, drafter=drafter or ("model", {"model": target}),
                                       policy=policy)


def test_engine_alone_bounds_the_budget_by_the_room_left(target):
    policy = _RecordingPolicy(_RecordingOptions(budget=12))
    assert policy.max_budget == 12
    prompt = list(range(2, 46))  # 44 tokens: the first tree has 64 - 43 = 21 positions, later fewer
    out = _decoder(target, policy).generate(prompt, max_new_tokens=16, eos_token_id=None)
    assert policy.given[0] == 12
    committed = len(prompt)
    for step, given in zip(out.steps, policy.given):
        room = target.config.max_position_embeddings - (committed - 1)
        assert given == min(12, room)
        assert step.budget_cut == 12 - given
        committed += step.emitted


def test_a_tree_over_the_given_budget_is_an_engine_error(target):
    policy = _RecordingPolicy(_RecordingOptions(budget=4, extra=1))
    with pytest.raises(EngineError, match="policy 'recording'.*tree has 5 nodes, over the budget of 4"):
        _decoder(target, policy).generate([3, 4, 5], max_new_tokens=4)


def test_policy_without_a_budget_route_is_told_how_to_declare_one():
    @dataclass
    class Bare:
        width: int = 3

    class NoBudget(specframe.TreePolicy):
        name = "no-budget"
        Options = Bare

        def build(self, session, budget):
            return session.new_tree()

    with pytest.raises(TypeError, match="policy 'no-budget'.*do not inherit specframe.BudgetOptions.*"
                                        "override the max_budget property"):
        _ = NoBudget(Bare()).max_budget

    class Fixed(NoBudget):
        @property
        def max_budget(self) -> int:
            return 7

    assert Fixed(Bare()).max_budget == 7


@pytest.mark.parametrize("spec, expected", [
    ("talon", 60), (("talon", {"budget": "auto", "max_budget": 40}), 40), (("talon", {"budget": 20, "mu": "auto"}), 20),
    (("eagle", {"budget": 30}), 30), (("opt-tree", {"budget": "auto"}), 64), (("sequoia", {"budget": 16}), 16),
    (("sampled-tree", {"budget": 9}), 9),
    (("chain", {"gamma": 4}), 5), (("chain", {"gamma": 4, "schedule": "heuristic", "max_gamma": 9}), 10),
    (("chain", {"gamma": "auto", "max_gamma": 7}), 8),
    ("static", 26), (("static", {"choices": [[0], [1], [0, 0]]}), 4),
])
def test_every_builtin_declares_its_largest_tree(spec, expected):
    assert make_plugin("policies", spec).max_budget == expected


@pytest.mark.parametrize("spec, option", [
    (("talon", {"budget": 1}), "budget"), (("talon", {"max_budget": 1}), "max_budget"),
    (("sampled-tree", {"budget": 1}), "budget"), (("sequoia", {"budget": 0}), "budget"),
    (("eagle", {"budget": "big"}), "budget"),
])
def test_budget_errors_name_the_option(spec, option):
    with pytest.raises(OptionError, match=f"option '{option}'"):
        make_plugin("policies", spec)


def test_budget_options_check_the_budget_once():
    with pytest.raises(OptionError, match="option 'budget' must be an int >= 2 \\(the root counts\\), got 1"):
        _RecordingOptions(budget=1)


@pytest.mark.parametrize("spec", ["talon", "eagle", "opt-tree", "sampled-tree", "sequoia", "static"])
def test_policies_build_within_the_budget_they_are_given(target, spec):
    """No policy re-applies its own maximum: given less, it builds at most that."""
    from specframe.testing.synthetic import SyntheticDrafter, make_session

    policy = make_plugin("policies", spec)
    for budget in (2, 5, 11):
        session = make_session(SyntheticDrafter(32, seed=budget), root_token=1,
                               generator=torch.Generator().manual_seed(0))
        tree = policy.build(session, budget)
        tree.check_valid(budget)


# ---------------------------------------------------------------------- on_step
@pytest.mark.parametrize("policy", ["talon", "eagle", "chain"])
def test_on_step_sees_every_step_with_the_engines_path(target, policy):
    dec = _decoder(target, policy)
    prompt = [5, 6, 7, 8]
    plain = dec.generate(prompt, max_new_tokens=20, eos_token_id=None)
    views: list = []
    out = dec.generate(prompt, max_new_tokens=20, eos_token_id=None, on_step=views.append)
    assert out.tokens == plain.tokens
    assert len(views) == len(out.steps)
    pos = 0
    for view, step in zip(views, out.steps):
        assert view.stats is step
        assert len(view.tree) == step.tree_size
        path = view.path
        assert path[0] == 0 and len(path) == step.accepted + 1
        assert path == view.tree.path_to(path[-1])  # a root path of the verified tree
        drafted = view.tree.tokens[path[1:]].tolist()
        emitted = out.tokens[pos:pos + step.emitted]
        assert drafted[:len(emitted)] == emitted[:len(drafted)]
        assert view.tree.ranks[path[1:]].tolist() == step.accepted_ranks
        pos += step.emitted


def test_spec_runner_records_trees_through_the_hook(target):
    from specframe.experiments.records import _pick_trees
    from specframe.experiments.runners import SpecRunner

    dec = _decoder(target, "talon")
    build = dec.policy.build
    runner = SpecRunner(dec)
    assert dec.policy.build == build  # no patching of the plugin
    out = runner.generate([5, 6, 7], max_new_tokens=12, eos=set())
    assert len(out.trees) == len(out.steps)
    picked = _pick_trees(out.trees, 2)
    assert 1 <= len(picked) <= 2
    for t in picked:
        step = out.steps[t["step"]]
        assert set(t) == {"step", "tokens", "parents", "depths", "ranks", "logp", "accepted"}  # no tokenizer, no budget
        assert len(t["logp"]) == step.tree_size and t["logp"][0] == 0.0  # the root's path is empty
        assert len(t["tokens"]) == step.tree_size and len(t["accepted"]) == step.accepted + 1
        assert all(isinstance(i, int) for i in t["accepted"])


# ---------------------------------------------------------------------- node identity in drafters
def test_model_drafter_maps_a_selected_path_back_through_origins(target):
    """A pool is expanded, then re-indexed by select() so that indices shift; the drafter must
    keep the cache entries of the accepted nodes, as a fresh drafter's rows show."""
    from specframe.models.target import TargetModel

    tgt = TargetModel(target)
    drafter = make_plugin("drafters", ("model", {"model": target}), tgt)
    prompt = [5, 9, 12, 30]
    drafter.begin(torch.tensor(prompt))
    session = DraftSession(drafter, prompt[-1], tgt.device)
    pool = session.new_tree()
    logp = session.expand(pool, [0])[0]
    top = torch.topk(logp, 3).indices
    pool = pool.add_nodes(torch.zeros(3, dtype=torch.long), top, logp[top])  # nodes 1, 2, 3
    rows = session.expand(pool, [1, 2, 3])
    kids = torch.stack([torch.topk(r, 2).indices for r in rows])  # 2 children each: nodes 4..9
    pool = pool.add_nodes(torch.arange(1, 4).repeat_interleave(2), kids.flatten(), torch.zeros(6))
    session.expand(pool, [9])  # node 9 (child of node 3) is forwarded too
    # Keep node 3 and its subtree only: 3 -> 1, 8 -> 2, 9 -> 3 in the selected tree.
    tree = pool.select(torch.tensor([0, 3, 8, 9]))
    assert tree.origins().tolist() == [0, 3, 8, 9]
    path = torch.tensor([0, 1, 3])  # root -> (pool 3) -> (pool 9)
    bonus = 17
    accepted = tree.tokens[path[1:]].tolist()
    drafter.commit(torch.tensor(accepted + [bonus]), path, tree=tree)
    committed = prompt + accepted + [bonus]
    fresh = make_plugin("drafters", ("model", {"model": target}), tgt)
    fresh.begin(torch.tensor(committed))
    got = drafter.expand(DraftTree_root(bonus), torch.tensor([0]))
    assert drafter.cached == len(prompt) - 1 + len(path)  # the three forwarded path nodes were kept
    want = fresh.expand(DraftTree_root(bonus), torch.tensor([0]))
    assert torch.allclose(got, want, atol=1e-9, rtol=0)


def DraftTree_root(token: int):
    return specframe.DraftTree.root(token)
