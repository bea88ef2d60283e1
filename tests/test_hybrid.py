"""The ``hybrid`` drafter: the merged row against the rule written out, expand_top against the
selection over the dense merged rows (ties, duplicates across parts, sparse and dense parts;
equal and calibrated weights), what each part is handed, one draft forward per call, its
declarations, and the calibrated score: it demotes a part that keeps being wrong, promotes one
that keeps being right, maps re-indexed trees back, reads nothing from the device, stays
lossless."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import specframe
from specframe.drafters.hybrid import HybridDrafter
from specframe.interfaces import Drafter
from specframe.options import OptionError
from specframe.selection import topk_per_row
from specframe.testing.conformance import DrafterConformance
from specframe.testing.fixtures import tiny_target

VOCAB = 20


class _Target:
    vocab_size = VOCAB
    device = torch.device("cpu")


class _Fixed(Drafter):
    """A part whose row at a node is a fixed function of the node's token (some ``-inf``)."""

    name = "fixed"

    def __init__(self, seed: int, finite: int, ties: bool) -> None:
        super().__init__(None, _Target())
        gen = torch.Generator().manual_seed(seed)
        table = torch.log_softmax(torch.randn(VOCAB, VOCAB, generator=gen, dtype=torch.float64), -1)
        if ties:
            table = (table * 2).round() / 2  # equal values inside a row and across parts
        cut = torch.topk(table, finite, dim=-1).values[:, -1:]
        self.table = torch.where(table >= cut, table, -math.inf).float()
        self.calls: list[tuple[str, dict]] = []

    def expand(self, tree, nodes):
        return self.table[tree.tokens[nodes]]

    def begin(self, prompt_ids, **kwargs):
        self.calls.append(("begin", kwargs))

    def commit(self, tokens, path=None, tree=None, **kwargs):
        self.calls.append(("commit", kwargs))


def _hybrid(parts: list[Drafter], score: str = "max", **options: Any) -> HybridDrafter:
    return HybridDrafter.from_parts(parts, _Target(), score=score, **options)


def _weigh(hybrid: HybridDrafter, log_weight: list[float]) -> None:
    """Set the calibrated rule's log-weights as if learned (``commit`` is tested below)."""
    hybrid.calibration.log_weight = torch.tensor(log_weight, dtype=torch.float32)


def _chain() -> specframe.DraftTree:
    tree = specframe.DraftTree.root(0)
    for token in range(1, VOCAB):
        tree = tree.add_nodes(torch.tensor([token - 1]), torch.tensor([token]), tree.logp[-1:] - 1.0)
    return tree


def test_the_merged_row_is_the_max_of_the_parts_minus_log_parts():
    parts = [_Fixed(1, 5, False), _Fixed(2, 3, False), _Fixed(3, VOCAB, False)]
    tree, nodes = _chain(), torch.arange(VOCAB)
    got = _hybrid(parts).expand(tree, nodes)
    for node in range(VOCAB):
        for token in range(VOCAB):
            best = max(float(p.table[node, token]) for p in parts)
            assert math.isclose(float(got[node, token]), best - math.log(3), abs_tol=1e-6) or best == -math.inf
    assert bool((torch.logsumexp(got.double(), -1) <= 1e-6).all())  # still a sub-probability


def test_the_calibrated_row_is_the_max_of_the_parts_shifted_by_their_weights():
    parts = [_Fixed(1, 5, False), _Fixed(2, 3, False), _Fixed(3, VOCAB, False)]
    hybrid, tree, nodes = _hybrid(parts, "calibrated"), _chain(), torch.arange(VOCAB)
    factors = torch.tensor([0.2, 1.5, 0.7])
    _weigh(hybrid, (factors.log() - factors.sum().log()).tolist())
    got = hybrid.expand(tree, nodes)
    weights = (factors / factors.sum()).tolist()
    for node in range(VOCAB):
        for token in range(VOCAB):
            best = max(float(p.table[node, token].exp()) * w for p, w in zip(parts, weights))
            assert math.isclose(float(got[node, token].exp()), best, rel_tol=1e-5, abs_tol=1e-12)
    assert bool((torch.logsumexp(got.double(), -1) <= 1e-6).all())  # still a sub-probability


def test_calibrated_before_any_verdict_is_the_max_rule_exactly():
    parts = [_Fixed(1, 5, True), _Fixed(2, 3, True)]
    tree, nodes = _chain(), torch.arange(VOCAB)
    plain, calibrated = _hybrid(parts, "max"), _hybrid(parts, "calibrated")
    assert torch.equal(calibrated.expand(tree, nodes), plain.expand(tree, nodes))
    for k in (1, 4):
        for g, w in zip(calibrated.expand_top(tree, nodes, k), plain.expand_top(tree, nodes, k)):
            assert torch.equal(g, w)


#: Log-weights for the calibrated rule: equal, on a 0.25 grid (exact ties across parts with
#: the half-integer tables), and arbitrary.
_LOG_WEIGHTS = st.one_of(st.none(), st.lists(st.sampled_from([-0.25, -0.5, -0.75, -1.0]), min_size=3, max_size=3),
                         st.lists(st.floats(-3.0, 0.0), min_size=3, max_size=3))


@given(seeds=st.lists(st.integers(0, 2**16), min_size=1, max_size=3), finite=st.integers(1, VOCAB),
       ties=st.booleans(), k=st.integers(1, VOCAB), nodes=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=6),
       score=st.sampled_from(["max", "calibrated"]), log_weight=_LOG_WEIGHTS)
def test_expand_top_equals_the_selection_over_the_merged_rows(seeds, finite, ties, k, nodes, score, log_weight):
    hybrid = _hybrid([_Fixed(s, max(1, finite - i), ties) for i, s in enumerate(seeds)], score)
    if score == "calibrated" and log_weight is not None:
        _weigh(hybrid, log_weight[: len(seeds)])
    tree, index = _chain(), torch.tensor(nodes)
    want = topk_per_row(hybrid.expand(tree, index), k)
    got = hybrid.expand_top(tree, index, k)
    for name, g, w in zip(("values", "ids", "ranks"), got, want):
        assert torch.equal(g, w), f"{name}: {g} vs {w}"


@pytest.mark.parametrize("score", ["max", "calibrated"])
@pytest.mark.parametrize("k", [1, 3])
def test_expand_top_of_rows_no_part_can_extend_is_the_selection_filler(k, score):
    """Tokens whose rows are dead in every part (an n-gram miss on a token the table never saw)
    get what the selection gives an all -inf row; k = 1 is the chain's own merge."""
    parts = [_Fixed(1, 4, True), _Fixed(2, 2, True)]
    for part in parts:
        part.table[[2, 5, 7]] = -math.inf
    parts[1].table[3] = -math.inf  # dead in one part only
    hybrid, tree, index = _hybrid(parts, score), _chain(), torch.tensor([2, 3, 5, 6, 7])
    _weigh(hybrid, [-2.0, -0.25])
    for g, w in zip(hybrid.expand_top(tree, index, k), topk_per_row(hybrid.expand(tree, index), k)):
        assert torch.equal(g, w)


def test_parts_get_only_the_target_outputs_they_declare():
    plain, learning = _Fixed(1, 3, False), _Fixed(2, 3, False)
    learning.needs_target_logits = True
    hybrid = _hybrid([plain, learning], "calibrated")
    logits = torch.zeros(1, VOCAB)
    hybrid.begin(torch.tensor([1, 2]), target_hidden=None, target_logits=logits)
    hybrid.commit(torch.tensor([3]), torch.tensor([0]), None, tree=_chain(), target_logits=logits)
    assert plain.calls == [("begin", {}), ("commit", {})]
    assert [name for name, _ in learning.calls] == ["begin", "commit"]
    assert all(kw == {"target_logits": logits} and kw["target_logits"] is logits for _, kw in learning.calls)


def test_declarations_are_the_union_and_the_weakest_replay():
    target = specframe.TargetModel(tiny_target())
    hybrid = specframe.decode.engine.make_plugin("drafters", ("hybrid", {"drafters": ["ngram", ["recycle", {"k": 4}]]}),
                                          target)
    assert hybrid.needs_target_logits and not hybrid.needs_target_hidden and hybrid.persistent_state
    assert hybrid.replay == "unsupported" and hybrid.parts[1].options.k == 4
    ngram_only = specframe.decode.engine.make_plugin("drafters", ("hybrid", {"drafters": ["ngram"]}), target)
    assert ngram_only.replay == "exact" and not ngram_only.needs_target_logits


@pytest.mark.parametrize("bad", [[], ["ngram", 3], [["ngram"]], ["no-such-drafter"], [["ngram", {"max_ngram": 0}]]])
def test_bad_parts_name_the_option(bad):
    with pytest.raises((OptionError, KeyError, LookupError, ValueError)) as err:
        specframe.SpecDecoder.build(target=tiny_target(), drafter=("hybrid", {"drafters": bad}))
    assert "drafter" in str(err.value)


def test_a_step_counts_one_draft_forward_per_call_for_all_parts():
    model = tiny_target()
    prompt = [4, 9, 12, 30, 2, 17, 9, 12]
    runs: dict[Any, list[int]] = {}
    for drafter in ("ngram", ("hybrid", {"drafters": ["ngram", "recycle"]})):
        dec = specframe.SpecDecoder.build(target=specframe.TargetModel(model), drafter=drafter,
                                          policy=("chain", {"gamma": 3}))
        out = dec.generate(prompt, max_new_tokens=12, eos_token_id=None)
        runs[str(drafter)] = [s.draft_forwards for s in out.steps]
    assert all(f <= 3 for fs in runs.values() for f in fs)
    assert max(runs[str(("hybrid", {"drafters": ["ngram", "recycle"]}))]) == 3


@pytest.mark.parametrize("score", ["max", "calibrated"])
@pytest.mark.parametrize("policy", [("talon", {"budget": "auto", "mu": "auto"}), ("chain", {"gamma": "auto"}),
                                    ("eagle", {"budget": 12, "top_k": 3, "depth": 4}),
                                    ("sampled-tree", {"budget": 12})])
def test_policies_run_lossless_on_merged_rows(policy, score):
    """Auto-sized policies, EAGLE's re-indexed tree (``select``) and a policy that samples
    from dense rows, greedy-verified; the calibrated hybrid learns along the way."""
    from specframe.testing.harness import greedy_reference

    model = tiny_target()
    dec = specframe.SpecDecoder.build(target=specframe.TargetModel(model), drafter=("hybrid", {"score": score}),
                                      policy=policy, strict=True)
    for prompt in ([4, 9, 12, 30, 2, 17, 9, 12, 30, 2], [5, 5, 5]):
        out = dec.generate(prompt, max_new_tokens=24, eos_token_id=None, seed=0)
        assert out.tokens == greedy_reference(model, prompt, 24, None)
    uniform = torch.full((2,), -math.log(2))
    assert torch.equal(dec.drafter.calibration.log_weight, uniform) == (score == "max")


# ---------------------------------------------------------------------- the calibrated score
class _Guess(Drafter):
    """A context-free part: every row holds one candidate, ``token`` at probability ``prob``."""

    def __init__(self, name: str, token: int, prob: float) -> None:
        super().__init__(None, _Target())
        self.name, self.token, self.prob = name, token, prob

    def expand(self, tree, nodes):
        out = torch.full((len(nodes), VOCAB), -math.inf)
        out[:, self.token] = math.log(self.prob)
        return out


def _step(hybrid: HybridDrafter, right: int) -> list[int]:
    """One verified step of a two-child tree from the merged root row: returns the children's
    tokens best first, then commits with the child carrying ``right`` accepted."""
    tree = specframe.DraftTree.root(0)
    values, ids, ranks = hybrid.expand_top(tree, torch.tensor([0]), 2)
    tree = tree.add_nodes(torch.zeros(2, dtype=torch.long), ids[0], values[0], ranks[0])
    order = ids[0].tolist()
    path = torch.tensor([0, 1 + order.index(right)])
    hybrid.commit(torch.tensor([right, 0]), path, tree=tree)
    return order


def test_calibrated_demotes_a_part_that_keeps_being_wrong():
    """The liar's confident guess (0.9) outranks the truth (0.4) under ``max`` forever; the
    calibrated rule puts the truth first within a few steps, and ``begin`` starts over."""
    runs = {}
    for score in ("max", "calibrated"):
        hybrid = _hybrid([_Guess("liar", 3, 0.9), _Guess("truth", 5, 0.4)], score)
        hybrid.begin(torch.tensor([1, 2]))
        runs[score] = [_step(hybrid, right=5)[0] for _ in range(8)]
    assert runs["max"] == [3] * 8
    assert runs["calibrated"][0] == 3 and runs["calibrated"][-4:] == [5] * 4, runs["calibrated"]
    weight = hybrid.calibration.log_weight.exp()
    assert weight[1] > 0.75 > 0.25 > weight[0]
    hybrid.begin(torch.tensor([1, 2]))
    assert _step(hybrid, right=5)[0] == 3  # a new sequence: equal weights again


def test_calibrated_promotes_a_part_that_keeps_being_right():
    """A part demoted by its misses climbs back once it is the one accepted; the weight of
    the part being right rises at every step."""
    hybrid = _hybrid([_Guess("copy", 3, 0.9), _Guess("table", 5, 0.4)], "calibrated")
    hybrid.begin(torch.tensor([1, 2]))
    for _ in range(8):
        _step(hybrid, right=5)
    assert _step(hybrid, right=3)[0] == 5  # demoted: the table's candidate is first
    weights = [float(hybrid.calibration.log_weight[0])]
    firsts = []
    for _ in range(12):
        firsts.append(_step(hybrid, right=3)[0])
        weights.append(float(hybrid.calibration.log_weight[0]))
    assert all(b > a for a, b in zip(weights, weights[1:])), weights
    assert firsts[-1] == 3 and weights[-1] > math.log(0.5)


def test_a_part_that_never_wins_learns_nothing_and_fallbacks_weigh_nothing():
    """Only the part whose shifted score set the merged score answers for a node; a win at
    probability 1e-6 moves no factor (the least-squares weights of q)."""
    hybrid = _hybrid([_Guess("sure", 3, 0.9), _Guess("fallback", 5, 1e-6)], "calibrated")
    hybrid.begin(torch.tensor([1, 2]))
    for _ in range(4):
        _step(hybrid, right=5)  # the fallback is right, the sure part wrong
    cal = hybrid.calibration
    assert float(cal.hit[1]) < 1e-5 and float(cal.sq[1]) < 1e-10 and float(cal.sq[0]) > 1.0
    assert float(cal.hit[0]) == 0.0


def test_calibration_maps_a_reindexed_tree_back_through_its_origins():
    """A policy may return ``select()`` of the tree the drafter expanded (EAGLE, OPT-Tree):
    the verdicts of the sub-tree are those of its nodes' origins in the full tree."""
    parts = [_Fixed(1, 3, False), _Fixed(2, 3, False)]
    full = specframe.DraftTree.root(0)
    hybrid = _hybrid(parts, "calibrated")
    values, ids, ranks = hybrid.expand_top(full, torch.tensor([0]), 3)
    full = full.add_nodes(torch.zeros(3, dtype=torch.long), ids[0], values[0], ranks[0])
    values, ids, ranks = hybrid.expand_top(full, torch.tensor([1, 2, 3]), 2)
    full = full.add_nodes(torch.tensor([1, 2, 3]).repeat_interleave(2), ids.flatten(), values.flatten(),
                          ranks.flatten())
    keep = torch.tensor([0, 2, 3, 6, 7])  # nodes 2 and 3 and node 2's children (6, 7)
    sub = full.select(keep)
    assert not torch.equal(hybrid.calibration.ids[1], hybrid.calibration.ids[2])  # rows differ by node
    got = hybrid.calibration._verdicts(sub, torch.tensor([0, 1, 3]))
    want = hybrid.calibration._verdicts(full, torch.tensor([0, 2, 6]))
    for g, w in zip(got, want):
        assert torch.equal(g, w[keep])
    assert bool(got[0][1:].any(dim=-1).all())  # every verified node was won by some part


def test_calibrated_hybrid_adds_no_host_read():
    """The records and the learning stay on the device: drafting and committing read exactly
    what the max rule reads (the parts' own reads), in the engine and around fake parts."""
    from specframe.testing.host_reads import HostReadCounter, count_step_reads

    reads: dict[str, Any] = {}
    for score in ("max", "calibrated"):
        dec = specframe.SpecDecoder.build(target=specframe.TargetModel(tiny_target()),
                                          drafter=("hybrid", {"score": score}), policy="talon", strict=False)
        counts = count_step_reads(dec, [5, 6, 7, 5, 6], max_new_tokens=24)
        hybrid, tree = _hybrid([_Fixed(1, 4, False), _Fixed(2, 3, False)], score), _chain()
        with HostReadCounter() as counter:
            for k in (1, 3):
                hybrid.expand_top(tree, torch.tensor([0, 4, 7]), k)
            hybrid.expand(tree, torch.tensor([2, 3]))
            hybrid.commit(torch.tensor([1, 2]), torch.tensor([0, 1]), tree=tree)
        reads[score] = (counts["commit"], counts["engine"] - counts["steps"], counter.total)
    assert reads["calibrated"] == reads["max"] and reads["max"][1] == 0


def test_calibrated_declares_that_it_learns_from_every_verified_node():
    """With two parts that read no logits, the calibrated hybrid declares
    ``learns_from_verdicts`` (so the conformance suite's honesty reference is a copy of it) and
    asks for no logits at all."""
    target = specframe.TargetModel(tiny_target())
    pair = ["ngram", ["ngram", {"max_ngram": 1}]]
    calibrated = specframe.decode.engine.make_plugin("drafters", ("hybrid", {"drafters": pair, "score": "calibrated"}),
                                              target)
    plain = specframe.decode.engine.make_plugin("drafters", ("hybrid", {"drafters": pair, "score": "max"}), target)
    single = specframe.decode.engine.make_plugin("drafters", ("hybrid", {"drafters": ["ngram"]}), target)
    assert calibrated.learns_from_verdicts and not calibrated.needs_target_logits
    assert not calibrated.needs_prompt_logits
    assert not plain.learns_from_verdicts and not single.learns_from_verdicts and not single.calibrated


@pytest.mark.parametrize("values, option", [({"score": "mean"}, "score"), ({"score": 1}, "score"),
                                            ({"calibration_prior": 0}, "calibration_prior"),
                                            ({"calibration_prior": math.inf}, "calibration_prior"),
                                            ({"calibration_decay": 0}, "calibration_decay"),
                                            ({"calibration_decay": 1.5}, "calibration_decay")])
def test_bad_score_options_name_the_option(values, option):
    with pytest.raises(OptionError) as err:
        specframe.SpecDecoder.build(target=tiny_target(), drafter=("hybrid", values))
    assert repr(option) in str(err.value)
    if values.get("score") == "mean":
        assert "'calibrated'" in str(err.value) and "'max'" in str(err.value)


class TestDrafter_hybrid_calibrated_ngram_pair(DrafterConformance):
    """The calibrated rule on two parts that declare nothing: learning from rejected nodes is
    declared, so tree-attention honesty is checked against a copy of the drafter."""

    plugin = ("hybrid", {"drafters": ["ngram", ["ngram", {"max_ngram": 1}]]})
