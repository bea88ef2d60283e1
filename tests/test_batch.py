"""Batched decoding: every sequence equals its own greedy decoding, whatever its companions;
B = 1 (and any B without a batch budget) repeats generate()'s step statistics; allocators keep
the batch budget; one host read per step for the whole batch."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specframe.decode.batch import BatchDecoder, generate_batch
from specframe.decode.allocate import BatchAllocator, allocator_classes, make_allocator, water_fill
from specframe.decode.engine import SpecDecoder, make_plugin
from specframe.plugins import get_registry
from specframe.models.target import TargetModel
from specframe.testing.fixtures import VOCAB, default_drafter, fixed_policy_spec, tiny_target
from specframe.testing.harness import greedy_by_recomputation
from specframe.testing.host_reads import HostReadCounter, _counted
from specframe.testing.profiles import profile_examples

#: Half the profile's examples: each is a batch of up to six prompts decoded twice (batched and
#: alone) per policy or drafter, and the cross product below adds one fixed batch per pair.
EXAMPLES = max(3, profile_examples() // 2)
MAX_NEW = 10
POLICIES = get_registry().names("policies")
#: Every policy holds the batch property (a third party's at its declared defaults); the drafters are
#: the built-ins, which default_drafter knows how to build on the tiny target without a checkpoint.
DRAFTERS = get_registry().names("drafters", dist="specframe")


def decoder(drafter: str = "model", policy: str = "talon") -> SpecDecoder:
    """A fresh decoder on the tiny float64 target (own drafter state)."""
    target = TargetModel(tiny_target())
    return SpecDecoder(target, default_drafter(drafter, target), make_plugin("policies", fixed_policy_spec(policy)),
                       make_plugin("verifiers", "greedy"))


@lru_cache(maxsize=None)
def _greedy_tokens(model, prompt: tuple[int, ...], max_new: int) -> tuple[int, ...]:
    return tuple(greedy_by_recomputation(model, list(prompt), max_new, None))


def greedy_reference(model, prompt: list[int], max_new: int, eos: int | None) -> list[int]:
    """Plain greedy decoding by full recomputation (transformers' generate with ``min_new_tokens``
    would mask the config's EOS id, which a run without EOS may emit), computed once per prompt
    and length: many tests decode the same prompts (the cross product below, 100+ pairs, on one
    batch), and a run that stops at ``eos`` is the run without it cut after eos's first token."""
    tokens = list(_greedy_tokens(model, tuple(prompt), max_new))
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


prompt_lists = st.lists(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=9), min_size=1, max_size=6)


def solo(drafter: str, policy: str, prompt: list[int], eos: int | None):
    """The prompt decoded alone by a fresh decoder."""
    return decoder(drafter, policy).generate(prompt, max_new_tokens=MAX_NEW, eos_token_id=eos)


def step_record(out) -> list[tuple]:
    """What must not change between a batched and a solo decode: the shape of every step."""
    return [(s.tree_size, s.depth, s.accepted, s.emitted, s.draft_forwards, s.widths, s.accepted_ranks,
             s.budget_cut) for s in out.steps]


def check_batch(drafter: str, policy: str, prompts: list[list[int]], eos_pick: int, layout: str = "padded",
                max_live: int | None = None) -> None:
    """Every sequence equals its greedy decoding and repeats generate()'s step records (but for
    a drafter with persistent state whose row served an earlier prompt under ``max_live``)."""
    model = tiny_target()
    # EOS: a token the first prompt's greedy decoding emits, so some rows stop early.
    eos = greedy_reference(model, prompts[0], MAX_NEW, None)[eos_pick % MAX_NEW]
    dec = decoder(drafter, policy)
    batch = BatchDecoder(dec, layout=layout).generate(prompts, max_new_tokens=MAX_NEW, eos_token_id=eos,
                                                      max_live=max_live)
    assert len(batch.outputs) == len(prompts)
    reused = max_live is not None and getattr(dec.drafter, "persistent_state", False)
    for prompt, out in zip(prompts, batch.outputs):
        assert out.tokens == greedy_reference(model, prompt, MAX_NEW, eos), f"{drafter} x {policy}: {prompt}"
        alone = solo(drafter, policy, prompt, eos)
        if not reused:
            assert step_record(out) == step_record(alone), f"{drafter} x {policy}: steps differ from generate()"
            # Not in step_record, which b1_steps.json pins from before steps recorded it.
            assert [s.accepted_children for s in out.steps] == [s.accepted_children for s in alone.steps]
        assert out.stopped_at_eos == alone.stopped_at_eos


@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=EXAMPLES)
@given(prompts=prompt_lists, eos_pick=st.integers(0, MAX_NEW - 1))
def test_batch_equals_greedy_alone_for_every_policy(policy, prompts, eos_pick):
    check_batch("model", policy, prompts, eos_pick)


@pytest.mark.parametrize("drafter", [d for d in DRAFTERS if d != "model"])
@settings(max_examples=EXAMPLES)
@given(prompts=prompt_lists, eos_pick=st.integers(0, MAX_NEW - 1))
def test_batch_equals_greedy_alone_for_every_drafter(drafter, prompts, eos_pick):
    check_batch(drafter, "talon", prompts, eos_pick)


@settings(max_examples=EXAMPLES)
@given(policy=st.sampled_from(POLICIES), drafter=st.sampled_from(DRAFTERS),
       prompts=st.lists(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=9), min_size=1, max_size=4),
       eos_pick=st.integers(0, MAX_NEW - 1))
def test_the_one_step_on_any_batch_equals_each_prompt_alone(policy, drafter, prompts, eos_pick):
    """The engine's step over 1-4 live rows: each row's tokens are its greedy decoding and its
    steps (tree sizes, depths, accepted, draft forwards, ...) are those of generate() alone."""
    check_batch(drafter, policy, prompts, eos_pick)


#: Step shapes of one-sequence decoding, every built-in policy x drafter, as the engine decided
#: them before its step served batches too (scripts/record_b1_steps.py, at commit b6413b4; the
#: medusa drafter's pairs, which came later, by the engine of commit b1e7801; the suffix drafter's,
#: since it follows SuffixDecoding's reference, at commit a9c1b19; the sam drafter's, added to the
#: file by the same script's record() restricted to it, on the engine of branch i68-sam; the
#: lookahead drafter's, by the engine that added side rows, whose recording left every earlier
#: pair as it was; the layerskip drafter's, by ``record_b1_steps.py --only layerskip`` on branch
#: i69-skip, which adds its pairs and leaves every earlier one as it was).
B1_STEPS = json.loads((Path(__file__).parent / "data" / "b1_steps.json").read_text(encoding="utf-8"))


BUILTIN_PAIRS = [f"{p} x {d}" for p in get_registry().names("policies", dist="specframe")
                 for d in get_registry().names("drafters", dist="specframe")]


def test_the_recording_holds_exactly_the_builtin_pairs():
    """Every built-in pair is pinned, and nothing else: a pair of a plugin installed only where
    the file was written would fail on every other machine."""
    assert sorted(B1_STEPS["runs"]) == BUILTIN_PAIRS, "re-record: python scripts/record_b1_steps.py"


@pytest.mark.parametrize("pair", BUILTIN_PAIRS)
def test_one_sequence_takes_the_recorded_steps(pair):
    policy, drafter = pair.split(" x ")
    for prompt, want in zip(B1_STEPS["prompts"], B1_STEPS["runs"][pair]):
        dec = decoder(drafter, policy)  # the recording's options (scripts/record_b1_steps.py policy_spec)
        out = dec.generate(prompt, max_new_tokens=B1_STEPS["max_new_tokens"], eos_token_id=B1_STEPS["eos"])
        assert out.tokens == want["tokens"], (pair, prompt)
        assert [list(map(_listed, r)) for r in step_record(out)] == want["steps"], (pair, prompt)


def _listed(value):
    return list(value) if isinstance(value, (list, tuple)) else value


@pytest.mark.parametrize("drafter", DRAFTERS)
@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_with_every_drafter_equals_greedy_alone(policy, drafter):
    """The whole registered cross product on one ragged batch with early EOS (the Hypothesis
    tests above vary the batches along each axis)."""
    check_batch(drafter, policy, [[5, 9, 2], [7], [11, 3, 3, 8, 1, 40], [2, 2]], eos_pick=3)


@settings(max_examples=EXAMPLES)
@given(prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=9),
       first=prompt_lists, second=prompt_lists)
def test_a_sequence_does_not_depend_on_its_companions(prompt, first, second):
    dec = decoder()
    a = generate_batch(dec, [*first, prompt], max_new_tokens=MAX_NEW, eos_token_id=None).outputs[-1]
    b = generate_batch(dec, [prompt, *second], max_new_tokens=MAX_NEW, eos_token_id=None).outputs[0]
    assert a.tokens == b.tokens
    assert step_record(a) == step_record(b)


@pytest.mark.parametrize("allocator", ["equal", "shared", "acceptance"])
@pytest.mark.parametrize("drafter", ["model", "eagle3", "hybrid"])
@settings(max_examples=EXAMPLES)
@given(prompts=prompt_lists, budget_per_row=st.integers(1, 5))
def test_batch_budget_is_never_exceeded(allocator, drafter, prompts, budget_per_row):
    """Trimmed trees (select) too: each drafter maps the verified path back to what it drafted."""
    model = tiny_target()
    total = budget_per_row * len(prompts)
    batch = generate_batch(decoder(drafter), prompts, max_new_tokens=MAX_NEW, eos_token_id=None,
                                     allocator=(allocator, {"budget": total}))
    steps = max(len(o.steps) for o in batch.outputs)
    for k in range(steps):
        live = [o.steps[k].tree_size for o in batch.outputs if len(o.steps) > k]
        # Rows leave, so the budget binds with B rows at most; never more than the total.
        assert sum(live) <= total, f"step {k}: trees {live} over the batch budget {total}"
    for prompt, out in zip(prompts, batch.outputs):
        assert out.tokens == greedy_reference(model, prompt, MAX_NEW, None)


def test_b1_repeats_generate_exactly():
    prompt = [3, 17, 40, 2, 9]
    alone = decoder().generate(prompt, max_new_tokens=24, eos_token_id=None)
    batch = generate_batch(decoder(), [prompt], max_new_tokens=24, eos_token_id=None)
    assert batch.outputs[0].tokens == alone.tokens
    assert step_record(batch.outputs[0]) == step_record(alone)


def test_one_host_read_per_step_for_the_whole_batch():
    dec = decoder("ngram", "talon")
    dec.strict = False  # strict mode reads every tree in full on purpose
    prompts = [[1, 2, 3, 1, 2], [5, 6], [7, 8, 9, 10, 7, 8, 9]]
    batch = BatchDecoder(dec)
    batch.generate(prompts, max_new_tokens=2, eos_token_id=None)  # every row's drafter and policy built
    engine, plugins = HostReadCounter(), HostReadCounter()
    for b in range(len(prompts)):
        drafter, policy = batch._slot(b)
        # The plugins' own reads are theirs (tests/test_host_reads.py pins them): not counted here.
        policy.build = _counted(policy.build, plugins, engine)
        drafter.commit = _counted(drafter.commit, plugins, engine)
    dec._step = _counted(dec._step, engine)  # the one step (batched here)
    out = batch.generate(prompts, max_new_tokens=MAX_NEW, eos_token_id=None)
    assert engine.total == len(out.step_times), engine.counts
    assert plugins.total > 0  # the patch is in place: the drafter does read (its n-gram lookups)


def test_water_fill_splits_evenly_under_caps():
    assert water_fill([8, 8, 8], 12) == [4, 4, 4]
    assert water_fill([2, 8, 8], 12) == [2, 5, 5]
    assert water_fill([1, 1], 9) == [1, 1]
    assert water_fill([5, 5, 5], 4) == [2, 1, 1]


def test_unknown_allocator_lists_the_registered_ones():
    with pytest.raises(ValueError, match="available allocators: acceptance, equal, goodput, schedule, shared, threshold"):
        make_allocator("nope")


def test_third_party_allocator_registers_through_the_hook():
    from specframe.plugins import hookimpl

    class FirstTakesAll(BatchAllocator):
        """Row 0 gets everything it can; the others just their roots."""

        name = "first-takes-all"

        def budgets(self, caps, history, total):
            return [min(caps[0], total - len(caps) + 1)] + [1] * (len(caps) - 1)

    class Plugin:
        @hookimpl
        def register_batch_allocators(self, register):
            register(FirstTakesAll)

    plugin = Plugin()
    get_registry().register(plugin, dist="third-party")
    try:
        out = generate_batch(decoder(), [[1, 2, 3], [4, 5]], max_new_tokens=6, eos_token_id=None,
                                       allocator=("first-takes-all", {"budget": 5}))
        assert all(s.tree_size == 1 for s in out.outputs[1].steps[: len(out.outputs[0].steps)])
        assert out.outputs[1].tokens == greedy_reference(tiny_target(), [4, 5], 6, None)
    finally:
        get_registry().pm.unregister(plugin)


def test_budget_below_the_live_rows_is_refused():
    with pytest.raises(ValueError, match="batch budget 1 is below the 2 live sequences"):
        generate_batch(decoder(), [[1, 2], [3]], max_new_tokens=4, eos_token_id=None,
                                 allocator=("equal", {"budget": 1}))


@pytest.mark.parametrize("layout", ["flat", "padded"])
@pytest.mark.parametrize("drafter,rows", [("ngram", 1), ("recycle", 5), (("recycle", {"prompt_rows": False}), 1)])
def test_the_batched_prefill_computes_prompt_logits_only_for_a_drafter_that_reads_them(monkeypatch, drafter, rows,
                                                                                      layout):
    """Each root enters with its first tree, so nobody reads the prefill's logits but a
    drafter that learns from the prompt: the others' prefill runs its lm_head on one column."""
    from specframe.decode.kv_flat import FlatKV
    from specframe.decode.kv_padded import BatchKV

    seen: list[int] = []
    cls = FlatKV if layout == "flat" else BatchKV
    prefill = cls.prefill
    monkeypatch.setattr(cls, "prefill", lambda self, *a, **kw: seen.append(
        (out := prefill(self, *a, **kw)).logits.shape[1]) or out)
    target = TargetModel(tiny_target())
    dec = SpecDecoder(target, default_drafter(drafter, target), make_plugin("policies", ("talon", {"budget": 4})),
                      make_plugin("verifiers", "greedy"))
    prompts = [[4, 9, 12, 30, 2, 17], [5, 6, 7]]
    out = BatchDecoder(dec, layout=layout).generate(prompts, max_new_tokens=6, eos_token_id=None)
    assert seen == [rows]
    for prompt, result in zip(prompts, out.outputs):
        assert result.tokens == greedy_reference(tiny_target(), prompt, 6, None)


@pytest.mark.parametrize("hidden,logits", [(False, False), (True, True)])
def test_the_per_row_prefill_equals_the_padded_one(hidden, logits):
    """The CPU's prompt-at-a-time prefill fills the batch cache (and the outputs) as the one
    right-padded forward does, one-token prompts included."""
    from specframe.decode.kv_padded import BatchKV

    target = TargetModel(tiny_target())
    prefixes = [torch.tensor([1, 2, 3, 4, 5]), torch.tensor([], dtype=torch.long), torch.tensor([6, 7])]
    rows, padded = BatchKV(target), BatchKV(target)
    a = rows.prefill(prefixes, hidden=hidden, logits=logits, per_row=True)
    b = padded.prefill(prefixes, hidden=hidden, logits=logits, per_row=False)
    assert rows.lengths == padded.lengths == [5, 0, 2] and rows.width == padded.width == 5
    for la, lb in zip(rows.cache.layers, padded.cache.layers):
        for name in ("keys", "values"):
            for r, n in enumerate(rows.lengths):  # columns past a row's prefix are stale either way
                assert torch.allclose(getattr(la, name)[r, :, :n], getattr(lb, name)[r, :, :n], atol=1e-12)
    if logits:
        for r, n in enumerate(rows.lengths):
            assert torch.allclose(a.logits[r, :n], b.logits[r, :n], atol=1e-12)
    if hidden:
        for ha, hb in zip(a.hidden_states, b.hidden_states):
            for r, n in enumerate(rows.lengths):
                assert torch.allclose(ha[r, :n], hb[r, :n], atol=1e-12)


def test_padded_rows_do_not_leak_into_a_sequence():
    """Stale columns (a shorter prompt's padding) are masked: garbage there changes nothing."""
    from specframe.decode.kv_padded import BatchKV

    target = TargetModel(tiny_target())
    kv = BatchKV(target)
    kv.prefill([torch.tensor([1, 2, 3, 4, 5]), torch.tensor([6])])
    with torch.inference_mode():
        for layer in kv.cache.layers:
            layer.keys[1, :, 1:] = 1e6
            layer.values[1, :, 1:] = -1e6
    from specframe.tree import DraftTree

    trees = [DraftTree.root(9), DraftTree.root(7)]
    logits = kv.tree_forward(trees).logits
    with torch.inference_mode():
        ref = tiny_target()(torch.tensor([[6, 7]])).logits[0, -1]
    assert torch.allclose(logits[1, 0], ref, atol=1e-9)


def sampling_decoder(policy: str = "sampled-tree") -> SpecDecoder:
    """A fresh decoder with the sampling verifier (temperature 1) on the tiny target."""
    target = TargetModel(tiny_target())
    return SpecDecoder(target, default_drafter("model", target), make_plugin("policies", (policy, {"budget": 6})),
                       make_plugin("verifiers", ("sampling", {"temperature": 1.0})))


@pytest.mark.parametrize("policy", ["talon", "sampled-tree"])
@settings(max_examples=EXAMPLES)
@given(prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=9), seed=st.integers(0, 2**31),
       companions=prompt_lists)
def test_a_seeded_sampled_sequence_depends_only_on_its_seed(policy, prompt, seed, companions):
    alone = sampling_decoder(policy).generate(prompt, max_new_tokens=MAX_NEW, eos_token_id=None, seed=seed)
    seeds = [seed + 1 + i for i in range(len(companions))]
    batch = generate_batch(sampling_decoder(policy), [*companions, prompt], max_new_tokens=MAX_NEW,
                           eos_token_id=None, seeds=[*seeds, seed])
    assert batch.outputs[-1].tokens == alone.tokens
    assert step_record(batch.outputs[-1]) == step_record(alone)


def test_seeds_must_match_the_prompts():
    with pytest.raises(ValueError, match="seeds has 1 entries for 2 prompts"):
        generate_batch(sampling_decoder(), [[1], [2]], max_new_tokens=2, eos_token_id=None, seeds=[0])


@st.composite
def allocation_cases(draw):
    """Caps, histories and a batch budget of 1-6 live sequences."""
    from specframe.interfaces import StepStats

    rows = draw(st.integers(1, 6))
    caps = draw(st.lists(st.integers(1, 12), min_size=rows, max_size=rows))
    history = [[StepStats(tree_size=4, depth=2, accepted=a, emitted=a + 1, draft_forwards=2, draft_time=0.0,
                          policy_time=0.0, target_time=0.0, verify_time=0.0, other_time=0.0, widths=[1],
                          accepted_ranks=[0] * a) for a in draw(st.lists(st.integers(0, 5), max_size=6))]
               for _ in range(rows)]
    total = draw(st.integers(rows, sum(caps) + 4))
    return caps, history, total


@pytest.mark.parametrize("name", sorted(allocator_classes()))
@settings(max_examples=4 * EXAMPLES)
@given(case=allocation_cases(), data=st.data())
def test_every_registered_allocator_keeps_the_rules(name, case, data):
    from specframe.decode.allocate import check_allocation
    from specframe.testing.strategies import draft_trees

    caps, history, total = case
    allocator = make_allocator((name, {"budget": total}))
    check_allocation(allocator, caps, history, total,
                     lambda b, budget: data.draw(draft_trees(max_nodes=budget), label=f"tree {b}"))


def test_acceptance_allocator_favours_the_sequence_that_accepts_more():
    from specframe.interfaces import StepStats

    def steps(accepted):
        return [StepStats(4, 2, accepted, accepted + 1, 2, 0.0, 0.0, 0.0, 0.0, 0.0, [1], [0] * accepted)] * 3

    shares = make_allocator(("acceptance", {"budget": 12})).budgets([12, 12], [steps(5), steps(0)], 12)
    assert shares[0] > shares[1] and sum(shares) == 12


def test_check_allocation_names_an_allocator_over_the_batch_budget():
    from specframe.decode.allocate import check_allocation
    from specframe.tree import DraftTree

    class Greedy(BatchAllocator):
        name = "greedy-rows"

        def budgets(self, caps, history, total):
            return list(caps)  # everyone takes its cap: over the total, and no trim

    def chain(b, budget):
        tree = DraftTree.root(b)
        for _ in range(budget - 1):
            tree = tree.add_nodes(torch.tensor([len(tree) - 1]), torch.tensor([1]), torch.tensor([-1.0]))
        return tree

    with pytest.raises(AssertionError, match="'greedy-rows': 8 nodes kept, over the batch budget 5"):
        check_allocation(Greedy(None), [4, 4], [[], []], 5, chain)


def test_batched_autoregressive_is_plain_greedy_per_row():
    """Left padding and the mask leave each row greedy; without EOS the config's EOS id (1 here)
    is an ordinary token, as for the speculative arms."""
    from specframe.experiments.batch_baselines import autoregressive_batch

    model = tiny_target()
    prompts = [[5, 1, 62, 6, 27, 0, 1, 24], [3], [9, 9, 4]]
    rows = autoregressive_batch(model, prompts, MAX_NEW, set())
    assert rows == [greedy_reference(model, p, MAX_NEW, None) for p in prompts]
    assert 1 in rows[0]  # the case that tells the two apart
    stopped = autoregressive_batch(model, prompts, MAX_NEW, {1})
    assert stopped == [greedy_reference(model, p, MAX_NEW, 1) for p in prompts]


# ---------------------------------------------------------------- continuous batching (max_live)
@pytest.mark.parametrize("drafter", DRAFTERS)
@settings(max_examples=EXAMPLES)
@given(prompts=prompt_lists, max_live=st.integers(1, 4), eos_pick=st.integers(0, MAX_NEW - 1))
def test_continuous_batching_equals_greedy_alone(drafter, prompts, max_live, eos_pick):
    """Prompts join as rows leave: each still equals its greedy decoding, and (for a drafter
    without persistent state) repeats generate()'s step records, whatever joined beside it."""
    check_batch(drafter, "talon", prompts, eos_pick, "padded", max_live)


def test_continuous_batching_never_runs_more_than_max_live_rows():
    """Every step verifies at most max_live trees, and a prompt joins only when a row left."""
    prompts = [[5, 9, 2], [7], [11, 3, 3, 8, 1, 40], [2, 2], [1, 2, 3], [4, 4, 4, 4]]
    batcher = BatchDecoder(decoder("ngram"))
    live_per_step = []
    step = batcher.decoder._step  # the engine's one step serves the batch

    def counted(kv, rows, *args):
        live_per_step.append(len(rows))
        assert len(kv.lengths) == len(rows)  # the cache has exactly the live rows
        return step(kv, rows, *args)

    batcher.decoder._step = counted
    out = batcher.generate(prompts, max_new_tokens=6, eos_token_id=None, max_live=2)
    assert max(live_per_step) == 2 and live_per_step[0] == 2
    assert sum(len(o.steps) for o in out.outputs) == sum(live_per_step)
    assert out.joined[:2] == [0.0, 0.0] and all(j > 0 for j in out.joined[2:])
    assert all(lat > 0 for lat in out.latencies)


def test_a_joining_prompt_longer_than_the_batch_widens_the_cache():
    """A newcomer longer than every live prefix, and a one-token one, beside a row mid-decode."""
    model = tiny_target()
    prompts = [[3], [9, 9], [1, 5, 2, 7, 3, 8, 6, 4, 2, 11, 13, 17], [6]]
    out = generate_batch(decoder("model"), prompts, max_new_tokens=MAX_NEW, eos_token_id=None, max_live=2)
    for prompt, o in zip(prompts, out.outputs):
        assert o.tokens == greedy_reference(model, prompt, MAX_NEW, None)


def test_max_live_must_be_positive():
    with pytest.raises(ValueError, match="max_live"):
        generate_batch(decoder("ngram"), [[1, 2]], max_new_tokens=2, max_live=0)


@pytest.mark.parametrize("max_live", [1, 2, 5])
def test_batched_autoregressive_with_refill_is_plain_greedy_per_row(max_live):
    from specframe.experiments.batch_baselines import autoregressive_refill

    model = tiny_target()
    prompts = [[5, 1, 62, 6, 27, 0, 1, 24], [3], [9, 9, 4], [2], [7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7]]
    eos = greedy_reference(model, prompts[0], MAX_NEW, None)[2]
    for stop in (set(), {eos}):
        rows = autoregressive_refill(TargetModel(model), prompts, MAX_NEW, stop, max_live)
        assert rows == [greedy_reference(model, p, MAX_NEW, eos if stop else None) for p in prompts]


# ---------------------------------------------------------------- batch cache layouts
@pytest.mark.parametrize("layout", ["flat", "padded"])
@settings(max_examples=EXAMPLES)
@given(prompts=prompt_lists, max_live=st.one_of(st.none(), st.integers(1, 4)), eos_pick=st.integers(0, MAX_NEW - 1))
def test_both_layouts_equal_greedy_alone(layout, prompts, max_live, eos_pick):
    """The flat layout (trees concatenated, caches side by side) and the padded one
    (``[B, n_max]``) both give each sequence its greedy decoding and generate()'s records."""
    check_batch("model", "talon", prompts, eos_pick, layout, max_live)


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_the_flat_layout_equals_greedy_alone_for_every_drafter(drafter):
    """Hidden states and logits reach each row's drafter from its own span of the flat forward."""
    check_batch(drafter, "talon", [[5, 9, 2], [7], [11, 3, 3, 8, 1, 40], [2, 2]], 3, "flat", 2)


@pytest.mark.parametrize("layout", ["flat", "padded"])
def test_the_flat_layout_computes_only_real_nodes(layout):
    """Rows of each step's forward: the trees' nodes (flat) or live rows x the longest tree (padded)."""
    prompts = [[1, 2, 3, 1, 2, 3, 1, 2], [5, 6], [7, 8, 9, 10, 7, 8, 9]]
    batcher = BatchDecoder(decoder("model", "talon"), ("shared", {"budget": 9}), layout=layout)  # uneven trees
    batch = batcher.generate(prompts, max_new_tokens=MAX_NEW, eos_token_id=None)
    for k, rows in enumerate(batch.step_rows):
        sizes = [o.steps[k].tree_size for o in batch.outputs if len(o.steps) > k]
        assert rows == (sum(sizes) if layout == "flat" else len(sizes) * max(sizes)), (k, sizes)
    assert any(len(set(o.steps[k].tree_size for o in batch.outputs if len(o.steps) > k)) > 1
               for k in range(len(batch.step_rows)))  # the case that tells the two apart


def test_a_sequence_that_outgrows_its_flat_segment_widens_every_segment():
    """Segments reserve max_new_tokens + 1 columns past the longest prompt; a smaller reserve
    makes a sequence outgrow its segment mid-batch, and every segment is re-laid wider."""
    from specframe.decode.kv_flat import FlatKV
    from specframe.tree import DraftTree

    model = tiny_target()
    prompts = [[5, 9, 2], [11, 3, 3, 8, 1, 40], [7]]
    kv = FlatKV(TargetModel(model), reserve=1)
    kv.prefill([torch.tensor(p[:-1]) for p in prompts])
    seqs, roots = [list(p) for p in prompts], [p[-1] for p in prompts]
    for _ in range(6):
        start = kv.width
        rows = kv.rows_of(kv.tree_forward([DraftTree.root(r) for r in roots]).logits)
        roots = [int(r[0].argmax()) for r in rows]
        for seq, tok in zip(seqs, roots):
            seq.append(tok)
        kv.keep([torch.zeros(1, dtype=torch.long)] * len(prompts), start)
    assert kv.capacity > max(len(p) for p in prompts)  # it did widen
    for prompt, seq in zip(prompts, seqs):
        assert seq[len(prompt):] == greedy_reference(model, prompt, 6, None)


def test_an_unknown_layout_lists_the_valid_ones():
    with pytest.raises(ValueError, match="batch layout 'ragged' is not one of padded, flat"):
        BatchDecoder(decoder("ngram"), layout="ragged")


def test_generate_batch_passes_arrivals_and_score_on():
    """The public call forwards ``arrivals`` (open loop) and ``score`` (each output's nll) to
    BatchDecoder.generate: dropping them would run closed-loop and unscored without a word."""
    out = generate_batch(decoder("ngram"), [[1, 2], [3]], max_new_tokens=3, eos_token_id=None,
                         score=True, arrivals=[0.0, 0.05])
    assert all(o.nll is not None for o in out.outputs)
    assert out.joined[1] >= 0.05
    with pytest.raises(ValueError, match="arrivals has 1 entries for 2 prompts"):
        generate_batch(decoder("ngram"), [[1, 2], [3]], max_new_tokens=2, eos_token_id=None, arrivals=[0.0])
