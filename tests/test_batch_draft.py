"""Batched drafting (specframe.decode.lockstep): the rows' builds run in lockstep and a drafter with
``expand_batch`` (the model drafter, EAGLE heads) drafts a layer of every row in ONE forward.
Each sequence still equals its own greedy decoding alone, step for step; a failing row is named
and never hangs the batch; drafters without the capability are called row by row."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

from specframe.decode.batch import BatchDecoder, generate_batch
from specframe.decode.lockstep import DraftBuildError, DraftCall, answer_calls, batch_capable, build_trees
from specframe.decode.engine import SpecDecoder, make_plugin
from specframe.interfaces import DraftSession, TreePolicy
from specframe.options import BudgetOptions
from specframe.plugins import get_registry
from specframe.models.target import TargetModel
from specframe.testing.fixtures import default_drafter, fixed_policy_spec, tiny_target
from specframe.testing.harness import greedy_by_recomputation
from specframe.tree import DraftTree

MAX_NEW = 10
PROMPTS = [[5, 9, 2], [7], [11, 3, 3, 8, 1, 40], [2, 2]]
POLICIES = get_registry().names("policies")
BATCHING = ["model", "eagle", "eagle3"]


def decoder(drafter: str = "model", policy: str = "talon") -> SpecDecoder:
    """A fresh decoder on the tiny float64 target."""
    target = TargetModel(tiny_target())
    return SpecDecoder(target, default_drafter(drafter, target), make_plugin("policies", fixed_policy_spec(policy)),
                       make_plugin("verifiers", "greedy"))


def greedy(prompt: list[int], eos: int | None) -> list[int]:
    """Plain greedy decoding of the tiny target by full recomputation."""
    return greedy_by_recomputation(tiny_target(), prompt, MAX_NEW, eos)


def records(out) -> list[tuple]:
    """Every step's shape (what batched drafting must not change)."""
    return [(s.tree_size, s.depth, s.accepted, s.emitted, s.draft_forwards, s.widths, s.accepted_ranks)
            for s in out.steps]


def forward_counter(module: torch.nn.Module) -> list[int]:
    """A one-item list counting ``module``'s forward calls (a pre-hook; the signature stays)."""
    count = [0]
    module.register_forward_pre_hook(lambda m, args: count.__setitem__(0, count[0] + 1))
    return count


def draft_module(dec: SpecDecoder) -> torch.nn.Module:
    """The module one draft forward calls: the model drafter's LM or an EAGLE head (shared by
    every row: the rebuilt drafters reuse the decoder's model / head instance)."""
    drafter = dec.drafter
    return drafter.lm.model if drafter.name == "model" else drafter.head


# ---------------------------------------------------------------------- equality
@pytest.mark.parametrize("drafter,policy", [("model", p) for p in POLICIES]
                         + [(d, p) for d in ("eagle", "eagle3") for p in ("talon", "chain", "eagle", "static")])
def test_batched_drafting_equals_each_sequence_alone(drafter, policy):
    eos = greedy(PROMPTS[0], None)[3]  # some rows stop early
    dec = decoder(drafter, policy)
    calls = forward_counter(draft_module(dec))
    batch = generate_batch(dec, PROMPTS, max_new_tokens=MAX_NEW, eos_token_id=eos)
    forwards = calls[0]  # before the solo decodes below, which share the cached draft model
    for prompt, out in zip(PROMPTS, batch.outputs):
        assert out.tokens == greedy(prompt, eos), f"{drafter} x {policy}: {prompt}"
        assert records(out) == records(decoder(drafter, policy).generate(prompt, max_new_tokens=MAX_NEW,
                                                                          eos_token_id=eos))
    drafted = sum(s.draft_forwards for out in batch.outputs for s in out.steps)
    assert forwards < drafted, "the rows' draft calls were not batched"


@pytest.mark.parametrize("drafter", BATCHING)
@pytest.mark.parametrize("policy", ["chain", "talon"])
def test_one_draft_forward_per_layer_for_the_whole_batch(drafter, policy):
    """Each step runs as many draft forwards as its deepest-drafting row asks for, not their sum."""
    dec = decoder(drafter, policy)
    calls = forward_counter(draft_module(dec))
    batch = generate_batch(dec, PROMPTS, max_new_tokens=MAX_NEW, eos_token_id=None)
    steps = max(len(o.steps) for o in batch.outputs)
    layers = sum(max(o.steps[k].draft_forwards for o in batch.outputs if len(o.steps) > k) for k in range(steps))
    assert calls[0] == layers


def drafters_begun(drafter: str, prompts: list[list[int]]) -> tuple[list, TargetModel]:
    """One fresh drafter per prompt on one target, each begun on its prompt (EAGLE heads get
    the target's prefill features, as the engine passes them)."""
    target = TargetModel(tiny_target())
    first = default_drafter(drafter, target)
    out = [first] + [make_plugin("drafters", (first.name, {f: getattr(first.options, f) for f in
                                                            vars(first.options)}), target) for _ in prompts[1:]]
    for d, prompt in zip(out, prompts):
        ids = torch.tensor(prompt)
        hidden = None
        if d.needs_target_hidden and len(prompt) > 1:
            with torch.inference_mode():
                hidden = tiny_target()(ids[None, :-1], output_hidden_states=True).hidden_states
        d.begin(ids, target_hidden=hidden)
    return out, target


@pytest.mark.parametrize("drafter", BATCHING)
def test_expand_batch_gives_each_row_its_own_log_probs_in_one_forward(drafter):
    """Layer by layer over ragged trees: one forward per call for the whole batch, and each
    row's rows equal (float64) what a fresh drafter of its own gives alone."""
    prompts = [[5, 9, 2, 14], [7, 3], [11, 3, 3, 8, 1, 40]]
    batched, _ = drafters_begun(drafter, prompts)
    alone, _ = drafters_begun(drafter, prompts)
    calls = forward_counter(draft_module(SpecDecoder(batched[0].target, batched[0], make_plugin("policies", "chain"),
                                                     make_plugin("verifiers", "greedy"))))
    trees = [DraftTree.root(p[-1]) for p in prompts]
    frontiers = [torch.tensor([0]) for _ in prompts]
    for layer in range(3):
        rows = batched if layer else batched[:2]  # the third row joins late: its catch-up is a second forward
        before = calls[0]
        answers = type(batched[0]).expand_batch([DraftCall(d, t, f, k=None) for d, t, f in zip(rows, trees, frontiers)])
        assert calls[0] == before + 1
        for b, answer in enumerate(answers):
            assert torch.allclose(answer, alone[b].expand(trees[b], frontiers[b]), atol=1e-10, equal_nan=True)
        if not layer:
            continue
        for b, answer in enumerate(answers):  # grow each tree by its rows' top 2 (ragged: row b takes b + 1)
            values, tokens = answer.topk(2, dim=-1)
            parents = frontiers[b].repeat_interleave(2)[: b + 1]
            n = len(parents)
            trees[b] = trees[b].add_nodes(parents, tokens.flatten()[:n], values.flatten()[:n])
            frontiers[b] = torch.arange(len(trees[b]) - n, len(trees[b]))


def test_expand_batch_answers_expand_top_as_the_drafter_does():
    rows, _ = drafters_begun("model", [[5, 9, 2], [7, 3]])
    alone, _ = drafters_begun("model", [[5, 9, 2], [7, 3]])
    trees = [DraftTree.root(2), DraftTree.root(3)]
    answers = type(rows[0]).expand_batch([DraftCall(rows[0], trees[0], torch.tensor([0]), k=3),
                                          DraftCall(rows[1], trees[1], torch.tensor([0]))])
    values, tokens, ranks = answers[0]
    ref = alone[0].expand_top(trees[0], torch.tensor([0]), 3)
    assert torch.equal(tokens, ref[1]) and torch.equal(ranks, ref[2]) and torch.allclose(values, ref[0])
    assert torch.allclose(answers[1], alone[1].expand(trees[1], torch.tensor([0])))


# ---------------------------------------------------------------------- failures
class Boom(TreePolicy):
    """Talon, except that it raises in its second draft call (a policy bug in one row)."""

    name = "boom"
    Options = BudgetOptions

    def __init__(self, options: Any = None) -> None:
        super().__init__(options or BudgetOptions(budget=6))

    def build(self, session: DraftSession, budget: int) -> DraftTree:
        tree = session.new_tree()
        values, tokens, ranks = session.expand_top(tree, [0], 2)
        tree = tree.add_nodes(torch.zeros(2, dtype=torch.long), tokens[0], values[0])
        session.expand(tree, [1, 2])
        raise ZeroDivisionError("the policy's bug")


def run_with_timeout(fn, seconds: float = 60.0) -> BaseException | None:
    """``fn()`` in a thread; fails the test if it has not returned after ``seconds``; its error."""
    caught: list[BaseException] = []

    def target():
        try:
            fn()
        except BaseException as err:  # noqa: BLE001 - handed to the test
            caught.append(err)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "the batch hung"
    return caught[0] if caught else None


def boom_decoder(bad_row: int) -> BatchDecoder:
    """A batch whose row ``bad_row`` runs :class:`Boom`, the others talon."""
    dec = decoder("model", "talon")
    made = iter(range(1, 10))
    policy = lambda d: Boom() if next(made) == bad_row else make_plugin("policies", ("talon", {"budget": 6}))  # noqa: E731
    return BatchDecoder(dec, policy_factory=policy)


def test_a_failing_policy_names_its_row_and_does_not_hang():
    for attempt in range(2):
        err = run_with_timeout(lambda: boom_decoder(2).generate(PROMPTS[:3], max_new_tokens=MAX_NEW,
                                                                eos_token_id=None))
        assert isinstance(err, DraftBuildError), err
        assert "row 2: policy 'boom' raised ZeroDivisionError" in str(err)
        assert isinstance(err.__cause__, ZeroDivisionError)
        if not attempt:
            threads = threading.active_count()
    # The other rows' builds unwound and their threads went back to the pool: none is lost.
    assert threading.active_count() == threads


def test_a_failing_batched_drafter_call_names_the_rows(monkeypatch):
    from specframe.drafters.model import ModelDrafter

    def broken(cls, calls):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(ModelDrafter, "expand_batch", classmethod(broken))
    err = run_with_timeout(lambda: generate_batch(decoder(), PROMPTS[:2], max_new_tokens=4, eos_token_id=None))
    assert isinstance(err, DraftBuildError), err
    assert "row 0 ('model'), row 1 ('model') raised RuntimeError: out of memory" in str(err)


# ---------------------------------------------------------------------- fallback
def test_a_drafter_without_the_capability_is_called_row_by_row(monkeypatch):
    """The fallback: no lockstep (no build thread), one draft forward per call, same outputs."""
    from specframe.drafters.model import ModelDrafter

    import specframe.decode.lockstep

    monkeypatch.setattr(ModelDrafter, "expand_batch", None)
    monkeypatch.setattr(specframe.decode.lockstep, "build_lockstep", lambda *a: pytest.fail("built in lockstep"))
    dec = decoder()
    assert not batch_capable(dec.drafter)
    calls = forward_counter(draft_module(dec))
    batch = generate_batch(dec, PROMPTS, max_new_tokens=MAX_NEW, eos_token_id=None)
    assert calls[0] == sum(s.draft_forwards for out in batch.outputs for s in out.steps)
    for prompt, out in zip(PROMPTS, batch.outputs):
        assert out.tokens == greedy(prompt, None)


def test_mixed_calls_batch_the_capable_drafters_and_call_the_others_alone():
    rows, target = drafters_begun("model", [[5, 9, 2], [7, 3]])
    ngram = default_drafter("ngram", target)
    ngram.begin(torch.tensor([4, 4, 4]))
    calls = forward_counter(rows[0].lm.model)
    trees = [DraftTree.root(2), DraftTree.root(3), DraftTree.root(4)]
    answers, shares = answer_calls([DraftCall(rows[0], trees[0], torch.tensor([0])),
                                    DraftCall(ngram, trees[2], torch.tensor([0]), k=2),
                                    DraftCall(rows[1], trees[1], torch.tensor([0]))])
    assert calls[0] == 1
    assert answers[0].shape == answers[2].shape == (1, rows[0].vocab_size)
    assert torch.equal(answers[1][1], ngram.expand_top(trees[2], torch.tensor([0]), 2)[1])
    assert shares[0] == shares[2] > 0  # the batched call's time, split between its rows


def test_a_lone_row_builds_without_threads(monkeypatch):
    """B = 1 builds as generate() does: a plain DraftSession, no lockstep."""
    import specframe.decode.lockstep

    monkeypatch.setattr(specframe.decode.lockstep, "build_lockstep", lambda *a: pytest.fail("built in lockstep"))
    dec = decoder()
    seen = []

    def session(b, cls):
        seen.append(cls)
        return cls(dec.drafter, 3, dec.target.device, context_len=2)

    dec.drafter.begin(torch.tensor([5, 3]))
    trees, sessions, times = build_trees([dec.policy], [dec.drafter], session, [6])
    assert seen == [DraftSession] and len(trees[0]) >= 1 and sessions[0].draft_forwards >= 1
    assert times[0] >= 0


def test_rows_of_a_path_loaded_draft_model_share_its_weights(tmp_path):
    """A draft model given as a path loads once: every row's drafter shares it, so the rows
    can answer one batched call (before, each row loaded its own copy and drafted alone)."""
    from specframe.decode.batch import rebuild_drafter
    from specframe.testing.fixtures import close_draft

    target = TargetModel(tiny_target())
    close_draft(target.model).save_pretrained(tmp_path / "draft")
    drafter = make_plugin("drafters", ("model", {"model": str(tmp_path / "draft")}), target)
    dec = SpecDecoder(target, drafter, make_plugin("policies", ("talon", {"budget": 6})), make_plugin("verifiers", "greedy"))
    assert rebuild_drafter(dec).lm.model is drafter.lm.model
    batcher = BatchDecoder(dec)
    out = batcher.generate(PROMPTS, max_new_tokens=MAX_NEW, eos_token_id=None)
    assert all(batcher._slot(b)[0].lm.model is drafter.lm.model for b in range(len(PROMPTS)))
    assert [o.tokens for o in out.outputs] == [greedy(p, None) for p in PROMPTS]


@pytest.mark.parametrize("name", ["eagle", "eagle3"])
def test_rows_of_an_eagle_drafter_share_its_head(name):
    from specframe.decode.batch import rebuild_drafter

    dec = decoder(name)
    assert rebuild_drafter(dec).head is dec.drafter.head


def test_batch_drafts_false_drafts_row_by_row_with_the_same_outputs(monkeypatch):
    """BatchDecoder(batch_drafts=False): a capable drafter's rows build one after another (the
    comparison arm of the batch sweep), and every sequence is unchanged."""
    import specframe.decode.lockstep

    lockstep = BatchDecoder(decoder()).generate(PROMPTS, max_new_tokens=MAX_NEW, eos_token_id=None)
    monkeypatch.setattr(specframe.decode.lockstep, "build_lockstep", lambda *a: pytest.fail("built in lockstep"))
    alone = BatchDecoder(decoder(), batch_drafts=False).generate(PROMPTS, max_new_tokens=MAX_NEW, eos_token_id=None)
    assert [o.tokens for o in alone.outputs] == [o.tokens for o in lockstep.outputs]
    assert [records(o) for o in alone.outputs] == [records(o) for o in lockstep.outputs]
