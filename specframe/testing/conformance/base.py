"""The conformance suite: the property tests every tree policy, drafter and verifier must pass.

Subclass one class per plugin, name the subclass ``Test...`` and set the plugin under test::

    from specframe.testing.conformance import TreePolicyConformance

    class TestWideTree(TreePolicyConformance):
        plugin = ("widetree", {"width": 4})      # or just "widetree"

pytest then runs every property below against it. The same classes check specframe's own
plugins (``tests/test_conformance_builtins.py``) and back ``specframe conformance --dist NAME``.

Class attributes and hooks:

* ``plugin``: the registered name, or ``(name, options)``.
* ``expected_failures = {"test_name": "reason"}``: known deviations. Each listed test runs as
  ``xfail(strict=True)`` with the reason, so it is reported, and an unexpected pass fails.
  Naming a test that does not exist is an error (a typo never hides a failure).
* ``make_policy(self)``, ``make_drafter(self, target)``, ``make_verifier(self, spec)``: override
  when the plugin needs construction arguments (``target`` is a
  :class:`~specframe.models.target.TargetModel` over the suite's tiny float64 model).

Hypothesis sizing: every property runs ``$SPECFRAME_CONFORMANCE_EXAMPLES`` examples, default
the count of the ``$HYPOTHESIS_PROFILE`` profile (default 10, ci 30, thorough 200; see
:mod:`specframe.testing.profiles`); model-based properties run a third of that (at least 2).
The counts are fixed when this module is imported, so the user's own Hypothesis profile never
makes the suite slow.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import re
from typing import Any, ClassVar, Iterable, Iterator

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from specframe.clock import TickClock
from specframe.decode.engine import SpecDecoder, make_plugin
from specframe.interfaces import DraftSession, Drafter, StepStats, TreePolicy, Verifier
from specframe.options import takes_options
from specframe.plugins import get_registry
from specframe.search_space import search_space
from specframe.selection import topk_per_row
from specframe.sizing import AutoSizedPolicy
from specframe.decode.read import read_step
from specframe.models.target import TargetModel
from specframe.tree import DRAFTING_MODES, DraftTree

from specframe.testing import fixtures as fx
from specframe.testing.distribution import TreeSampler, chi_square_pvalue, emitted_distribution, hf_warped_probs
from specframe.testing.harness import (
    begin_generation, check_against_drafter, check_draft_records, check_output, commit_step, greedy_reference,
    grow_tree, learns_from_verdicts, needs_target_logits, sparse_drafter,
)
from specframe.testing.reference import decide, greedy_walk, read_verdict
from specframe.testing.profiles import profile_examples
from specframe.testing.strategies import draft_trees, prompts, search_points
from specframe.testing.synthetic import SyntheticDrafter, make_session, synthetic_drafters

__all__ = [
    "DrafterConformance", "TreePolicyConformance", "VerifierConformance", "conformance_classes",
    "emitted_distribution", "chi_square_pvalue", "suite_examples",
]


# ---------------------------------------------------------------------- sizing
def suite_examples() -> int:
    """Examples per property: ``$SPECFRAME_CONFORMANCE_EXAMPLES``, else the profile's count."""
    raw = os.environ.get("SPECFRAME_CONFORMANCE_EXAMPLES", "").strip()
    return max(1, int(raw)) if raw else profile_examples()


# differing_executors: the same test function runs on many subclasses by design.
_HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.differing_executors]
#: Settings of the cheap (model-free) properties.
FAST = settings(max_examples=suite_examples(), deadline=None, suppress_health_check=_HEALTH)
#: Settings of the properties that run transformers models.
MODEL = settings(max_examples=max(2, suite_examples() // 3), deadline=None, suppress_health_check=_HEALTH)

VOCAB = fx.VOCAB


# ---------------------------------------------------------------------- base class
def _split(spec: Any, owner: type, attr: str = "plugin") -> Any:
    """Check a plugin spec (name or (name, options)) and return it; the error says what to set."""
    if isinstance(spec, str) or (
        isinstance(spec, (tuple, list)) and len(spec) == 2 and isinstance(spec[0], str) and isinstance(spec[1], dict)
    ):
        return spec
    raise TypeError(
        f"{owner.__name__}.{attr} must be a registered name or (name, {{options}}), got {spec!r}; "
        f"set e.g. `{attr} = \"my-plugin\"` on the class"
    )


_NOUN = {"policies": "policy", "drafters": "drafter", "verifiers": "verifier"}


def declared_point(kind: str, spec: Any, owner: type, data: Any) -> tuple[str, dict, dict]:
    """``(name, options, point)``: a point drawn (Hypothesis ``data``) from the search space the
    plugin ``spec`` declares on its options (:mod:`specframe.search_space`), laid over the
    spec's own options; each drawn value must lie in its dimension. A plugin that declares no
    tunable option skips the property, saying so."""
    spec = _split(spec, owner)
    name, options = (spec, {}) if isinstance(spec, str) else (spec[0], dict(spec[1]))
    space = search_space(getattr(get_registry().get(kind, name), "Options", None))
    if not space:
        pytest.skip(f"{_NOUN[kind]} {name!r} declares no search space (no tunable option)")
    point = data.draw(search_points(get_registry().get(kind, name).Options, options), label="point")
    outside = {k: v for k, v in point.items() if not space[k].contains(v)}
    assert not outside, f"drawn values {outside} lie outside their declared dimensions"
    return name, {**options, **point}, point


class _Conformance:
    """Shared machinery: the plugin under test and declared deviations."""

    #: The plugin under test: a registered name or ``(name, options)``.
    plugin: ClassVar[Any] = None
    #: Known deviations ``{test_name: reason}``, run as strict xfails (never silently skipped).
    expected_failures: ClassVar[dict[str, str]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        declared = dict(cls.expected_failures)
        tests = sorted(name for name in dir(cls) if name.startswith("test_"))
        unknown = sorted(set(declared) - set(tests))
        if unknown:
            raise TypeError(
                f"{cls.__name__}.expected_failures names unknown test(s) {unknown}; "
                f"the suite's tests are: {', '.join(tests)}"
            )
        empty = sorted(name for name, reason in declared.items() if not isinstance(reason, str) or not reason.strip())
        if empty:
            raise TypeError(f"{cls.__name__}.expected_failures: give a reason for {empty}")

    #: torch intra-op threads during each test (None leaves torch's setting alone). The suite's
    #: models are tiny, so more threads only add synchronisation overhead (5x slower on a
    #: loaded 2-core machine).
    threads: ClassVar[int | None] = 1

    @pytest.fixture(autouse=True)
    def _torch_threads(self) -> Iterator[None]:
        """Run each test with ``threads`` torch threads, restoring the setting afterwards."""
        before = torch.get_num_threads()
        if self.threads is not None:
            torch.set_num_threads(self.threads)
        try:
            yield
        finally:
            torch.set_num_threads(before)

    @pytest.fixture(autouse=True)
    def _declared_deviation(self, request: pytest.FixtureRequest) -> None:
        """Turn a declared deviation into ``xfail(strict=True)``: reported, and an unexpected pass fails."""
        reason = self.expected_failures.get(getattr(request.node, "originalname", request.node.name))
        if reason:
            request.applymarker(pytest.mark.xfail(reason=f"declared deviation: {reason}", strict=True))


# ====================================================================== tree policies
class TreePolicyConformance(_Conformance):
    """Properties every tree policy must have (``plugin`` names a registered policy).

    Model-free properties drive the policy with random :class:`SyntheticDrafter` s (V up to
    256, budgets 2..64), including exact ties, children of probability 1 (they tie their
    parent's cumulative score), one-hot rows and rows with few finite entries; the end-to-end
    properties run it in the engine on a tiny float64 Llama with a close draft model.
    """

    #: Require every node's true rank (True for policies that choose children by rank);
    #: False also accepts -1 ("unknown", e.g. sampled children).
    strict_ranks: ClassVar[bool] = False
    #: Largest budget the model-free properties ask for.
    max_budget: ClassVar[int] = 64

    def make_policy(self) -> TreePolicy:
        """A fresh instance of the policy under test."""
        return make_plugin("policies", _split(self.plugin, type(self)))

    def build(self, drafter: Drafter, budget: int, root: int = 0) -> tuple[DraftTree, DraftSession, TreePolicy]:
        """Build one tree under ``min(budget, policy.max_budget)``, as the engine passes it; the
        session carries a seeded generator so sampling policies reproduce."""
        policy = self.make_policy()
        session = make_session(drafter, root_token=root, generator=torch.Generator().manual_seed(1234))
        return policy.build(session, min(budget, policy.max_budget)), session, policy

    @FAST
    @given(drafter=synthetic_drafters(max_vocab=256), budget=st.integers(2, 64), root=st.integers(0, 1))
    def test_valid_tree_within_budget(self, drafter, budget, root):
        """check_valid, size <= min(budget, policy.max_budget), right root, nodes match the drafter."""
        budget = min(budget, self.max_budget)
        tree, session, policy = self.build(drafter, budget, root)
        limit = min(budget, policy.max_budget)
        assert len(tree) <= limit, f"tree has {len(tree)} nodes, over the budget of {limit} (root included)"
        tree.check_valid(limit)
        assert int(tree.tokens[0]) == root, "node 0 must carry the session's root token"
        assert bool(torch.isfinite(tree.logp).all()), "a node has a non-finite draft log-prob"
        check_against_drafter(tree, drafter, self.strict_ranks)
        check_draft_records(tree, drafter.vocab_size)
        # A depth-d node needs d expanded ancestors, each expansion a counted draft forward.
        assert session.draft_forwards >= tree.max_depth, "nodes were drafted without a counted draft forward"
        assert len(drafter.calls) == session.draft_forwards, "the policy called the drafter behind the session's back"

    @FAST
    @given(vocab=st.integers(2, 64), levels=st.integers(1, 2), seed=st.integers(0, 2**31 - 1),
           budget=st.integers(2, 64))
    def test_ancestor_closed_when_children_tie_parents(self, vocab, levels, seed, budget):
        """Every row has a child of probability exactly 1 (it ties its parent) and the other
        candidates tie among themselves: a re-rank without a tie rule breaks closure here."""
        budget = min(budget, self.max_budget)
        drafter = SyntheticDrafter(vocab, mode="ties", levels=levels, spike_rate=1.0, seed=seed)
        tree, _, policy = self.build(drafter, budget)
        tree.check_valid(min(budget, policy.max_budget))
        check_against_drafter(tree, drafter, self.strict_ranks)
        assert bool((tree.logp[1:] <= tree.logp[tree.parents[1:]]).all()), "a child scores above its parent"

    @FAST
    @given(drafter=synthetic_drafters(max_vocab=256), budget=st.integers(2, 64))
    def test_deterministic_for_identical_drafter_outputs(self, drafter, budget):
        """Identical drafter outputs (and the same session generator) give the identical tree."""
        budget = min(budget, self.max_budget)
        first, s1, _ = self.build(drafter.clone(), budget)
        second, s2, _ = self.build(drafter.clone(), budget)
        for field in ("tokens", "parents", "depths", "logp", "ranks"):
            assert torch.equal(getattr(first, field), getattr(second, field)), f"tree.{field} differs between builds"
        assert s1.draft_forwards == s2.draft_forwards

    @FAST
    @given(vocab=st.integers(2, 256), seed=st.integers(0, 2**31 - 1), budget=st.integers(2, 64))
    def test_one_hot_drafter_yields_the_argmax_chain(self, vocab, seed, budget):
        """A drafter that is certain (one finite candidate per row) gives a chain of its argmaxes."""
        budget = min(budget, self.max_budget)
        drafter = SyntheticDrafter(vocab, mode="one_hot", seed=seed)
        tree, _, _ = self.build(drafter, budget)
        assert len(tree) >= 2, "a policy with budget >= 2 drafted nothing from a certain drafter"
        assert tree.width_per_depth() == [1] * (tree.max_depth + 1), f"not a chain: {tree.describe()}"
        check_against_drafter(tree, drafter, self.strict_ranks)  # each token is its parent's one finite child
        assert float(tree.logp.abs().max()) == 0.0

    @FAST
    @given(vocab=st.integers(2, 256), finite=st.integers(1, 4), seed=st.integers(0, 2**31 - 1),
           budget=st.integers(2, 64))
    def test_never_drafts_impossible_tokens(self, vocab, finite, seed, budget):
        """Rows with 1-4 finite entries (n-gram tables, reduced draft vocabularies): no node may
        carry a -inf draft log-prob, however wide the policy wants to grow."""
        budget = min(budget, self.max_budget)
        drafter = sparse_drafter(vocab, finite, seed)
        tree, _, policy = self.build(drafter, budget)
        tree.check_valid(min(budget, policy.max_budget))
        check_against_drafter(tree, drafter, self.strict_ranks)

    @FAST
    @given(drafter=synthetic_drafters(max_vocab=64), steps=st.integers(4, 24), seed=st.integers(0, 2**31 - 1))
    def test_auto_sized_trees_stay_closed_and_within_max_budget(self, drafter, steps, seed):
        """Only for a policy auto-sized through :class:`~specframe.sizing.AutoSizedPolicy` (e.g.
        ``budget="auto"``): over a run of steps whose verdicts and timings vary, every tree the
        sizer keeps is valid, prefix-closed and within ``max_budget``, and the sizer's build cap
        stays within it too."""
        policy = self.make_policy()
        if not isinstance(policy, AutoSizedPolicy):
            pytest.skip("not an AutoSizedPolicy: it cannot size its trees with budget = \"auto\"")
        if not policy.auto_size:
            pytest.skip(f"an AutoSizedPolicy with a fixed size under these options ({_options_text(policy)}): "
                        "run it with budget = \"auto\" (specframe conformance --options '{\"budget\": \"auto\"}')")
        rng = torch.Generator().manual_seed(seed)
        for step in range(steps):
            session = make_session(drafter, generator=torch.Generator().manual_seed(step))
            tree = policy.build(session, policy.max_budget)
            tree.check_valid(policy.max_budget)  # ancestor-closed (prefix-closed), within max_budget
            assert bool(torch.isfinite(tree.logp).all()), "a node has a non-finite draft log-prob"
            assert 2 <= policy.sizer.cap <= policy.max_budget, f"build cap {policy.sizer.cap} out of range"
            policy.observe(_verified_at_random(tree, rng))

    @MODEL
    @given(prompt=prompts(VOCAB, 1, 24), max_new=st.integers(1, 32), eos=st.integers(0, VOCAB - 1),
           preallocate=st.booleans())
    def test_greedy_output_equals_generate(self, prompt, max_new, eos, preallocate):
        """Lossless: with the ``model`` drafter and greedy verification, output ==
        ``model.generate(do_sample=False)`` token for token (float64), stopping exactly at EOS
        and max_new_tokens, with a growing and a pre-allocated KV cache (strict engine: every
        tree is checked in full before the target runs)."""
        target = fx.tiny_target()
        dec = SpecDecoder.build(target=TargetModel(target, preallocate=preallocate),
                                drafter=("model", {"model": fx.close_draft(target)}),
                                policy=self.make_policy(), verifier="greedy", strict=True)
        out = dec.generate(prompt, max_new_tokens=max_new, eos_token_id=eos, seed=0)
        check_output(out, greedy_reference(target, prompt, max_new, eos), max_new, eos, f"preallocate={preallocate}")

    def test_close_draft_is_accepted(self):
        """Guards the lossless property against vacuity: with a close draft model, drafted
        tokens are really accepted (tau > 1) and the output still equals greedy decoding."""
        target = fx.tiny_target()
        dec = SpecDecoder.build(target=target, drafter=("model", {"model": fx.close_draft(target)}),
                                policy=self.make_policy(), verifier="greedy", strict=True)
        prompt = [5, 17, 9, 33, 2, 40]
        out = dec.generate(prompt, max_new_tokens=16, eos_token_id=None, seed=0)
        assert out.tokens == greedy_reference(target, prompt, 16, None)
        assert out.tau > 1.0, f"the close draft was never accepted (tau={out.tau:.2f})"

    @MODEL
    @given(prompt=prompts(VOCAB, 1, 24), max_new=st.integers(1, 32), eos=st.integers(0, VOCAB - 1), data=st.data())
    def test_declared_space_decodes_losslessly(self, prompt, max_new, eos, data):
        """Every point of the policy's declared search space (``specframe tune`` searches it)
        builds valid options and, with a close ``model`` draft and greedy verification, decodes
        exactly as ``model.generate(do_sample=False)`` (float64)."""
        name, options, point = declared_point("policies", self.plugin, type(self), data)
        target = fx.tiny_target()
        dec = SpecDecoder.build(target=target, drafter=("model", {"model": fx.close_draft(target)}),
                                policy=(name, options), verifier="greedy", strict=True)
        out = dec.generate(prompt, max_new_tokens=max_new, eos_token_id=eos, seed=0)
        check_output(out, greedy_reference(target, prompt, max_new, eos), max_new, eos, f"point {point}")



def _verified_at_random(tree: DraftTree, rng: torch.Generator) -> StepStats:
    """A verified step for ``tree``: a random root path accepted (by ranks), timings that grow
    with the tree, as the engine reports them to ``observe``."""
    path, node = [], 0
    while True:
        kids = (tree.parents == node).nonzero().flatten().tolist()
        if not kids or float(torch.rand((), generator=rng)) < 0.3:
            break
        node = kids[int(torch.randint(len(kids), (), generator=rng))]
        path.append(int(tree.ranks[node]))
    size = len(tree)
    return StepStats(tree_size=size, depth=tree.max_depth, accepted=len(path), emitted=len(path) + 1,
                     draft_forwards=tree.max_depth, draft_time=1e-4 * tree.max_depth, policy_time=1e-4,
                     target_time=1e-3 * (1 + 0.1 * size), verify_time=1e-5 * size, other_time=1e-5 * size,
                     widths=tree.width_per_depth(), accepted_ranks=path)


# ====================================================================== drafters
#: Layer widths of the honesty trees: the root always branches and a second layer is expanded,
#: so siblings exist when the drafter runs (a chain cannot show a leak between branches).
_BRANCHING_WIDTHS = st.builds(lambda first, rest: [first, *rest], st.integers(2, 3),
                              st.lists(st.integers(1, 3), min_size=1, max_size=2))


#: Earlier generations that fill a ``persistent_state`` drafter before its properties run.
SEASONING_PROMPTS = ([5, 9, 12, 5, 9, 12, 5], [30, 2, 17, 30, 2, 4, 9])


class DrafterConformance(_Conformance):
    """Properties every drafter must have (``plugin`` names a registered drafter).

    The target is a tiny random float64 Llama (vocab 64). Override ``make_drafter(target)`` when
    the drafter needs construction arguments; the default builds ``plugin`` with its options
    (built-in ``model`` / ``eagle`` / ``eagle3`` get a close draft / random heads).
    """

    #: Policies the end-to-end lossless property drives the drafter with.
    policies: ClassVar[tuple[Any, ...]] = ("chain", "talon")
    #: Tolerance of the tree-attention honesty property (rows are log-probs).
    honesty_atol: ClassVar[float] = 1e-6

    def make_drafter(self, target: TargetModel) -> Drafter:
        """A fresh drafter under test on ``target``."""
        return fx.default_drafter(_split(self.plugin, type(self)), target)

    def _target(self) -> TargetModel:
        return TargetModel(fx.tiny_target())

    def _drafter(self, target: TargetModel) -> Drafter:
        """:meth:`make_drafter`, reading a :class:`~specframe.clock.TickClock` if it reads a
        clock (``uses_clock``): every property compares instances fed the same calls, and
        wall-clock decisions would differ between them by the machine's timing alone."""
        drafter = self.make_drafter(target)
        if getattr(drafter, "uses_clock", False):
            drafter.set_clock(TickClock())
        return drafter

    def make_seasoned_drafter(self, target: TargetModel) -> Drafter:
        """:meth:`make_drafter`, and for a drafter that keeps state across requests
        (``persistent_state``) two earlier generations run through the engine first, so the
        properties that use it hold for a drafter whose state is filled, not only a fresh one."""
        drafter = self._drafter(target)
        if getattr(drafter, "persistent_state", False):
            dec = SpecDecoder(target, drafter, make_plugin("policies", ("chain", {"gamma": 3})),
                              make_plugin("verifiers", "greedy"), strict=True)
            for prompt in SEASONING_PROMPTS:
                dec.generate(torch.tensor(prompt), max_new_tokens=8, eos_token_id=None)
        return drafter

    def test_expand_rows_are_log_distributions(self):
        """``expand`` gives ``[len(nodes), V_target]`` log-probs: no NaN or +inf, at least one
        finite entry per row, total probability at most 1 (after earlier generations, for a
        drafter with ``persistent_state``)."""
        target = self._target()
        drafter = self.make_seasoned_drafter(target)
        assert drafter.vocab_size == target.vocab_size, f"vocab_size {drafter.vocab_size} != target's {target.vocab_size}"
        for committed in ([7], [4, 9, 12, 30, 2, 17, 9, 12]):
            begin_generation(drafter, target, committed)
            tree, rows = grow_tree(DraftSession(drafter, committed[-1], target.device), [3, 2])
            assert rows, "expand returned nothing"
            logp = torch.stack(list(rows.values())).double()
            assert logp.shape == (len(rows), target.vocab_size), f"expand rows have shape {tuple(logp.shape)}"
            assert not bool(torch.isnan(logp).any()), "expand returned NaN"
            assert not bool((logp == math.inf).any()), "expand returned +inf"
            assert bool(torch.isfinite(logp).any(dim=-1).all()), "a row has no finite entry: nothing can be drafted"
            assert bool((torch.logsumexp(logp, dim=-1) <= 1e-5).all()), "a row's probabilities sum above 1"

    def test_expand_top_equals_the_selection_over_its_rows(self):
        """``expand_top(tree, nodes, k)`` returns exactly ``topk_per_row(expand(tree, nodes), k)``
        (the default does; an override that skips the dense rows must agree, ties included).
        Two drafters grow the same tree in lock-step, one through each call (fresh, or after the
        same earlier generations for a drafter with ``persistent_state``)."""
        target = self._target()
        for committed in ([7], [4, 9, 12, 30, 2, 17, 9, 12, 30]):
            dense, sparse = self.make_seasoned_drafter(target), self.make_seasoned_drafter(target)
            begin_generation(dense, target, committed)
            begin_generation(sparse, target, committed)
            tree, frontier = DraftTree.root(committed[-1], device=target.device), [0]
            for k in (3, 2, 1):
                if not frontier:  # every row was a dead end: nothing left to expand
                    break
                # Long, as DraftSession passes nodes (an empty list would otherwise become float).
                nodes = torch.tensor(frontier, dtype=torch.long, device=target.device)
                want = topk_per_row(dense.expand(tree, nodes), k)
                got = sparse.expand_top(tree, nodes, k)
                for name, g, w in zip(("values", "token ids", "ranks"), got, want):
                    assert g.shape == w.shape and torch.equal(g.cpu(), w.cpu()), (
                        f"expand_top(k={k}) {name} differ from topk_per_row over expand's rows: {g} vs {w}")
                keep = torch.isfinite(want[0]).flatten()
                parents = nodes.repeat_interleave(want[0].shape[1])[keep]
                start = len(tree)
                tree = tree.add_nodes(parents, want[1].flatten()[keep],
                                      tree.logp[parents] + want[0].flatten()[keep].to(tree.logp.dtype))
                frontier = list(range(start, len(tree)))

    def _chain_row(self, target: TargetModel, committed: list[int], path: list[int],
                   snapshot: Drafter | None = None) -> torch.Tensor:
        """Reference: a fresh drafter (or a copy of ``snapshot``, the drafter under test as the
        step began) expands ``path`` as a chain, one node per expand."""
        if snapshot is None:
            drafter = self._drafter(target)
            begin_generation(drafter, target, committed)
        else:
            drafter = copy.deepcopy(snapshot)
        session = DraftSession(drafter, committed[-1], target.device)
        tree, node = session.new_tree(), 0
        for token in path:
            session.expand(tree, [node])
            tree = tree.add_nodes(torch.tensor([node]), torch.tensor([token]), tree.logp[node:node + 1])
            node = len(tree) - 1
        return session.expand(tree, [node])[0]

    @MODEL
    @given(prompt=prompts(VOCAB, 1, 16), widths=_BRANCHING_WIDTHS, steps=st.integers(1, 3))
    @example(prompt=[4, 9, 12, 30, 2, 17], widths=[3, 2, 2], steps=2)
    def test_tree_attention_is_honest(self, prompt, widths, steps):
        """Tree attention: the row ``expand`` gives a tree node equals the row a fresh drafter
        gives when that node's path is expanded as a chain, one node at a time. Checked over
        several engine-like steps (greedy verification, ``commit`` called as the engine calls
        it), so what a drafter keeps between steps is checked too. A drafter that declares
        ``needs_target_logits`` or ``learns_from_verdicts`` learns from the target at every
        verified node, rejected ones included, which no fresh drafter can know: its reference
        is a copy of itself as the step began; so is that of a drafter with ``persistent_state``,
        checked after earlier generations have filled its state."""
        model = fx.tiny_target()
        target, reference = TargetModel(model), TargetModel(model)
        drafter = self.make_seasoned_drafter(target)
        own_reference = learns_from_verdicts(drafter) or getattr(drafter, "persistent_state", False)
        committed = list(prompt)
        begin_generation(drafter, target, committed)
        for step in range(steps):
            snapshot = copy.deepcopy(drafter) if own_reference else None
            tree, rows = grow_tree(DraftSession(drafter, committed[-1], target.device), widths)
            for node, row in rows.items():
                path = [int(tree.tokens[i]) for i in tree.path_to(node)[1:]]
                want = self._chain_row(reference, committed, path, snapshot)
                got = row.double().cpu()
                want = want.double().cpu()
                same_support = torch.equal(torch.isfinite(got), torch.isfinite(want))
                close = torch.allclose(torch.where(torch.isfinite(got), got, 0.0),
                                       torch.where(torch.isfinite(want), want, 0.0), atol=self.honesty_atol, rtol=0)
                assert same_support and close, (
                    f"step {step}, path {path}: the tree row differs from expanding the path as a chain "
                    f"(max |diff| {float((got - want).nan_to_num().abs().max()):.3g})"
                )
            out = target.tree_forward(tree.tokens, tree.positions(len(committed)), tree.ancestor_mask(),
                                      output_hidden_states=getattr(drafter, "needs_target_hidden", False))
            path, bonus = greedy_walk(tree, out.logits[0])
            emitted = tree.tokens[path[1:]].tolist() + [bonus]
            target.keep(len(committed) - 1, torch.tensor(path, dtype=torch.long))
            commit_step(drafter, emitted, torch.tensor(path, dtype=torch.long), tree, out)
            committed += emitted

    @MODEL
    @given(prompt=prompts(VOCAB, 1, 24), max_new=st.integers(1, 32), eos=st.integers(0, VOCAB - 1),
           data=st.data())
    def test_greedy_output_equals_generate(self, prompt, max_new, eos, data):
        """Lossless: with greedy verification, output == ``model.generate(do_sample=False)``
        (float64) under each of ``policies``, stopping exactly at EOS and max_new_tokens."""
        policy = data.draw(st.sampled_from(self.policies), label="policy")
        target = self._target()
        dec = SpecDecoder.build(target=target, drafter=self._drafter(target), policy=policy, verifier="greedy",
                                strict=True)
        out = dec.generate(prompt, max_new_tokens=max_new, eos_token_id=eos, seed=0)
        check_output(out, greedy_reference(target.model, prompt, max_new, eos), max_new, eos, f"policy {policy}")

    @MODEL
    @given(prompt=prompts(VOCAB, 1, 24), max_new=st.integers(1, 32), eos=st.integers(0, VOCAB - 1), data=st.data())
    def test_declared_space_decodes_losslessly(self, prompt, max_new, eos, data):
        """Every point of the drafter's declared search space (``specframe tune`` searches it)
        builds a valid drafter that, under each of ``policies`` with greedy verification,
        decodes exactly as ``model.generate(do_sample=False)`` (float64)."""
        name, options, point = declared_point("drafters", self.plugin, type(self), data)
        policy = data.draw(st.sampled_from(self.policies), label="policy")
        target = self._target()
        drafter = make_plugin("drafters", (name, options), target)
        if getattr(drafter, "uses_clock", False):
            drafter.set_clock(TickClock())
        dec = SpecDecoder.build(target=target, drafter=drafter, policy=policy, verifier="greedy", strict=True)
        out = dec.generate(prompt, max_new_tokens=max_new, eos_token_id=eos, seed=0)
        check_output(out, greedy_reference(target.model, prompt, max_new, eos), max_new, eos,
                     f"policy {policy}, point {point}")

    def test_begin_forgets_earlier_generations(self):
        """Generating A, then B, then A again on one decoder repeats A exactly (tokens and tree
        sizes), and B equals B on a fresh decoder: ``begin`` drops all earlier state.

        A drafter that declares ``persistent_state`` keeps state across generations on purpose
        (a hot-start table): its trees after ``begin`` may differ, so what is checked is the
        declaration instead: a fresh instance reproduces a fresh run exactly (tokens and tree
        sizes; the state lives in the instance, not in the process), and every generation on
        the reused decoder stays lossless (its tokens equal the fresh runs')."""
        a, b = [5, 17, 9, 33, 2, 40], [11, 3, 3, 28]

        def decoder() -> SpecDecoder:
            target = self._target()
            return SpecDecoder.build(target=target, drafter=self._drafter(target), policy=self.policies[0],
                                     strict=True)

        def run(dec: SpecDecoder, prompt: list[int]) -> tuple[list[int], list[int]]:
            out = dec.generate(prompt, max_new_tokens=16, eos_token_id=None, seed=0)
            return out.tokens, [s.tree_size for s in out.steps]

        dec = decoder()
        first_a, second_b, again_a = run(dec, a), run(dec, b), run(dec, a)
        fresh_b = run(decoder(), b)
        if getattr(dec.drafter, "persistent_state", False):
            assert run(decoder(), a) == first_a, (
                "persistent_state: a fresh drafter instance does not reproduce a fresh run (state is "
                "shared between instances, or the drafter is not deterministic)")
            assert again_a[0] == first_a[0] and second_b[0] == fresh_b[0], (
                "persistent_state: a generation on a reused drafter emitted other tokens than a fresh one")
            return
        assert again_a == first_a, "a second generation of the same prompt differs: state leaked"
        assert second_b == fresh_b, "a generation after another differs from a fresh one"


# ====================================================================== verifiers
def verified_mode(verifier: Verifier, tree: DraftTree, gen: torch.Generator, vocab: int = 16) -> DraftTree:
    """``tree`` as it is, or, when ``verifier`` does not verify its drafting mode
    (``Verifier.drafting_modes``), the same tree declared as drawn without replacement (or the
    verifier's first mode) from a random full-support draft over ``vocab`` tokens, so every
    verifier meets the same shapes of tree."""
    modes = getattr(verifier, "drafting_modes", DRAFTING_MODES)
    if tree.drafting in modes:
        return tree
    mode = "without_replacement" if "without_replacement" in modes else modes[0]
    q = torch.softmax(torch.randn(len(tree), vocab, generator=gen, dtype=torch.float64), dim=-1)
    return dataclasses.replace(tree, drafting=mode, draft_probs=q)



#: Shapes of the fixed trees of the distribution property: parent of each node (node 0 = root).
_DIST_SHAPE = [-1, 0, 0, 0, 1, 1, 4]   # root -> 3 children; first child -> 2; its first -> 1
_DIST_CHAIN = [-1, 0, 1, 2]            # i.i.d. drafting: one child per node (no duplicate siblings)
_DIST_VOCAB = 8
#: The verifier properties only a lossless verifier is held to, with what it must reproduce.
LOSSLESS_ONLY: dict[str, str] = {
    "test_emitted_distribution_matches_the_target": "the target's sampling distribution",
    "test_greedy_output_equals_generate": "model.generate(do_sample=False) token for token",
}


class VerifierConformance(_Conformance):
    """Properties every verifier must have (``plugin`` names a registered verifier).

    Every verifier, lossless or not, must return a root path of the tree and a bonus token of
    the vocabulary, in the engine's form, reproducibly from a generator state, and in the
    engine emit per step the accepted path's tokens plus one bonus token, within the policy's
    budget, ``max_new_tokens`` and EOS (:meth:`test_verdict_is_a_root_path`,
    :meth:`test_engine_reads_the_decision`,
    :meth:`test_generation_emits_root_paths_within_budget`).

    A verifier that declares ``lossless = True`` (the default) is also held to a reference
    (:meth:`reference_probs`): a ``sampling`` verifier must emit tokens distributed as
    transformers' ``generate(do_sample=True)`` with the verifier's ``temperature`` / ``top_k`` /
    ``top_p`` options; any other verifier must emit exactly the greedy (argmax) tokens. A lossy
    verifier (``lossless = False``: ``typical``, ``margin``) trades that guarantee for longer
    accepted paths by design, so the equality and distribution properties skip it, saying why;
    its quality cost is measured elsewhere, not by this suite.
    """

    #: The configuration in which the verifier must reproduce greedy decoding end to end
    #: (default: ``plugin`` itself when it is not a sampling verifier). A sampling verifier
    #: sets e.g. ``("sampling", {"top_k": 1})``, or declares the test an expected failure.
    greedy_plugin: ClassVar[Any] = None
    #: Verifications drawn per case of the distribution property.
    samples: ClassVar[int] = 2000
    #: Significance level of the distribution property (see its docstring).
    alpha: ClassVar[float] = 1e-4
    #: The policy of the end-to-end properties (default ``talon``: deterministic trees). A
    #: verifier that verifies only sampled trees sets e.g. ``("chain", {"sample": True})``.
    engine_policy: ClassVar[Any] = "talon"

    def make_verifier(self, spec: Any = None) -> Verifier:
        """A fresh verifier from ``spec`` (default: ``plugin``)."""
        return make_plugin("verifiers", _split(self.plugin if spec is None else spec, type(self)))

    @pytest.fixture(autouse=True)
    def _lossless_only(self, request: pytest.FixtureRequest) -> None:
        """Skip a property of :data:`LOSSLESS_ONLY`, saying why, for a verifier that declares
        ``lossless = False`` (before Hypothesis runs, so no example is reported as failing)."""
        reference = LOSSLESS_ONLY.get(getattr(request.node, "originalname", request.node.name))
        verifier = self.make_verifier() if reference else None
        if verifier is not None and not getattr(verifier, "lossless", True):
            pytest.skip(f"verifier {verifier.name!r} declares lossless = False: it is not meant to reproduce "
                        f"{reference}; test_verdict_is_a_root_path and test_generation_emits_root_paths_within_budget "
                        "check its invariants (root path plus one bonus token, within the budget) instead")

    def reference_probs(self, verifier: Verifier, logits: torch.Tensor) -> torch.Tensor:
        """``[n, V]`` distribution the verifier must emit from at each node (float64).

        Override for a sampling verifier whose warping is not transformers' temperature/top-k/top-p.
        """
        if getattr(verifier, "sampling", False):
            opts = verifier.options
            return hf_warped_probs(logits, float(getattr(opts, "temperature", 1.0)),
                                    int(getattr(opts, "top_k", 0)), float(getattr(opts, "top_p", 1.0)))
        return torch.nn.functional.one_hot(logits.argmax(dim=-1), logits.shape[-1]).double()

    @FAST
    @given(tree=draft_trees(max_nodes=24, vocab_size=16), seed=st.integers(0, 2**31 - 1))
    def test_verdict_is_a_root_path(self, tree, seed):
        """The verdict is a path from the root down the tree with one node per depth up to the
        last accepted node's (so ``depth(last) + 1`` tokens are emitted: the path's and the
        bonus), and the bonus is a token of the vocabulary. A lossless verifier also: every
        emitted token is possible under the reference distribution; on a deterministic tree the
        bonus token is never a child of the last accepted node (it would have been accepted).
        A lossy one (``lossless = False``) may accept tokens the reference would not and draw
        its bonus from the whole target, so those two checks are not asked of it."""
        verifier = self.make_verifier()
        gen = torch.Generator().manual_seed(seed)
        logits = torch.randn(len(tree), 16, generator=gen, dtype=torch.float64) * 2
        tree = verified_mode(verifier, tree, gen)
        verdict = decide(verifier, tree, logits, gen)  # also checks verify's (last, bonus) form
        path = verdict.accepted_path.tolist()
        assert path and path[0] == 0, f"accepted path {path} does not start at the root"
        parents = tree.parents.tolist()
        assert all(parents[b] == a for a, b in zip(path, path[1:])), f"accepted path {path} is not a root path"
        bonus = int(verdict.bonus_token)
        assert 0 <= bonus < 16, f"bonus token {bonus} outside the vocabulary"
        depth = int(tree.depths[path[-1]])
        assert len(path) == depth + 1, f"path {path} has {len(path)} nodes, its last is at depth {depth}"
        if not getattr(verifier, "lossless", True):
            return
        probs = self.reference_probs(verifier, logits)
        tokens = tree.tokens.tolist()
        for a, b in zip(path, path[1:]):
            assert probs[a, tokens[b]] > 0, f"accepted token {tokens[b]} is impossible under the target at node {a}"
        assert probs[path[-1], bonus] > 0, f"bonus token {bonus} is impossible under the target"
        siblings = {tokens[i] for i in range(1, len(tree)) if parents[i] == path[-1]}
        assert bonus not in siblings, f"bonus token {bonus} is a drafted child of the last accepted node"

    @FAST
    @given(tree=draft_trees(max_nodes=24, vocab_size=16), seed=st.integers(0, 2**31 - 1))
    def test_engine_reads_the_decision(self, tree, seed):
        """The engine's one packed read of ``verify``'s ``(last, bonus)`` gives the accepted
        path, tokens, ranks and widths that plain host indexing gives (``read_verdict``), and the
        same generator state gives the same decision (a seeded run is reproducible)."""
        verifier = self.make_verifier()
        logits = torch.randn(len(tree), 16, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 2
        tree = verified_mode(verifier, tree, torch.Generator().manual_seed(seed + 2))
        last, bonus = verifier.verify(tree, logits, torch.Generator().manual_seed(seed + 1))
        again = decide(verifier, tree, logits, torch.Generator().manual_seed(seed + 1))
        assert (int(last), int(bonus)) == (int(again.accepted_path[-1]), again.bonus_token), (
            "verify took two different decisions from the same generator state")
        packed, plain = read_step(tree, last, bonus, torch.tensor(True)), read_verdict(tree, again)
        fields = ("tokens", "ranks", "widths", "contiguous")
        assert packed.path.tolist() == plain.path.tolist() and all(
            getattr(packed, f) == getattr(plain, f) for f in fields), (
            f"the engine's packed read {packed} differs from the host reference {plain}")

    def _cases(self, modes: Iterable[str] = DRAFTING_MODES) -> Iterable[tuple[str, torch.Tensor, Any]]:
        """Distribution cases: (drafting mode, target logits, tree or tree sampler), for the
        drafting modes in ``modes`` (the random draws are the same whichever are asked)."""
        gen = torch.Generator().manual_seed(2026)
        v = _DIST_VOCAB
        for mode in DRAFTING_MODES:
            shape = _DIST_CHAIN if mode == "iid" else _DIST_SHAPE
            logits = torch.randn(len(shape), v, generator=gen, dtype=torch.float64) * 1.5
            # A draft that disagrees with the target often, so rejections and residuals matter.
            q = torch.softmax(torch.randn(len(shape), v, generator=gen, dtype=torch.float64) * 1.5, dim=-1)
            if mode in modes:
                yield mode, logits, TreeSampler(shape, q, mode)

    @pytest.mark.statistical
    def test_emitted_distribution_matches_the_target(self):
        """Lossless in distribution, checked on fixed target logits (V = 8) for trees of each
        drafting mode: ``deterministic`` (fixed tree, children = the draft's top ranks),
        ``without_replacement`` and ``iid`` (children re-drawn from a fixed draft q for every
        verification; i.i.d. trees are chains, as siblings must differ).

        Reference (:meth:`reference_probs`, exact, enumerated): for the fixed deterministic tree,
        the whole emitted sequence of one verification is distributed as sampling the target
        token by token until the walk leaves the tree (:func:`emitted_distribution`); for the
        sampled trees the first emitted token is distributed as the target at the root.

        Threshold: ``samples`` (2000) seeded verifications per case; the case fails when an
        outcome of probability 0 occurs, or when Pearson's chi-square test (cells expected < 5
        times pooled) gives a p-value below ``alpha`` = 1e-4. The total-variation distance is
        reported in the message. Seeds are fixed, so the outcome is reproducible.
        Skipped for a lossy verifier (``lossless = False``).
        """
        verifier = self.make_verifier()
        failures = []
        for mode, logits, sampler in self._cases(getattr(verifier, "drafting_modes", DRAFTING_MODES)):
            probs = self.reference_probs(verifier, logits)
            gen_tree, gen_verify = torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)
            counts: dict[tuple[int, ...], int] = {}
            if mode == "deterministic":
                tree = sampler.draw(None)
                want = emitted_distribution(tree, probs)
            else:
                want = {(t,): float(p) for t, p in enumerate(probs[0].tolist()) if p > 0}
            for _ in range(self.samples):
                if mode != "deterministic":
                    tree = sampler.draw(gen_tree)
                verdict = decide(verifier, tree, logits, gen_verify)
                path = verdict.accepted_path.tolist()
                emitted = tuple(tree.tokens[path[1:]].tolist()) + (int(verdict.bonus_token),)
                key = emitted if mode == "deterministic" else emitted[:1]
                counts[key] = counts.get(key, 0) + 1
            impossible = sorted(k for k in counts if k not in want)
            p_value, df = chi_square_pvalue(counts, want)
            tv = 0.5 * sum(abs(counts.get(k, 0) / self.samples - want.get(k, 0.0)) for k in set(counts) | set(want))
            if impossible or p_value < self.alpha:
                failures.append(f"{mode}: chi-square p={p_value:.2e} (df={df}), TV={tv:.3f}, "
                                f"impossible outcomes {impossible[:5]}")
        assert not failures, "emitted tokens are not distributed as the target: " + "; ".join(failures)

    @MODEL
    @given(prompt=prompts(VOCAB, 1, 24), max_new=st.integers(1, 32), eos=st.integers(0, VOCAB - 1))
    # A long answer without EOS always runs: the close draft agrees with the target so often
    # that a verifier ignoring the target can pass a few short random examples.
    @example(prompt=[5, 17, 9, 33, 2, 40], max_new=32, eos=0)
    def test_greedy_output_equals_generate(self, prompt, max_new, eos):
        """Lossless end to end: in its greedy configuration (``greedy_plugin``, default the
        plugin itself for non-sampling verifiers), the engine with a close ``model`` draft and
        the ``engine_policy`` (``talon``) reproduces ``model.generate(do_sample=False)`` (float64).
        Skipped for a lossy verifier (``lossless = False``)."""
        spec = self.greedy_plugin
        if spec is None:
            verifier = self.make_verifier()
            if getattr(verifier, "sampling", False):
                pytest.fail(f"{type(self).__name__}: a sampling verifier must set greedy_plugin (its configuration "
                            "that decodes greedily) or declare this test in expected_failures")
        else:
            verifier = self.make_verifier(spec)
        target = fx.tiny_target()
        dec = SpecDecoder.build(target=target, drafter=("model", {"model": fx.close_draft(target)}),
                                policy=self.engine_policy, verifier=verifier, strict=True)
        out = dec.generate(prompt, max_new_tokens=max_new, eos_token_id=eos, seed=0)
        check_output(out, greedy_reference(target, prompt, max_new, eos), max_new, eos, "greedy configuration")

    @MODEL
    @given(prompt=prompts(VOCAB, 1, 24), max_new=st.integers(1, 32), eos=st.integers(0, VOCAB - 1))
    @example(prompt=[5, 17, 9, 33, 2, 40], max_new=32, eos=0)
    def test_generation_emits_root_paths_within_budget(self, prompt, max_new, eos):
        """Every verifier, lossy ones included, in the engine (strict; a close ``model`` draft,
        ``engine_policy``, the verifier's own configuration, seed 0): each step's tree is within
        the policy's budget, the accepted nodes form a root path of it, and the step emits that
        path's drafted tokens and then one bonus token, all of the vocabulary (the last step cut
        at ``max_new_tokens`` or EOS); the run emits exactly ``max_new_tokens`` unless it stops
        at its first EOS."""
        target = fx.tiny_target()
        dec = SpecDecoder.build(target=target, drafter=("model", {"model": fx.close_draft(target)}),
                                policy=self.engine_policy, verifier=self.make_verifier(), strict=True)
        views: list = []
        out = dec.generate(prompt, max_new_tokens=max_new, eos_token_id=eos, seed=0, on_step=views.append)
        check_root_path_steps(out, views, dec.policy.max_budget, VOCAB, max_new, eos)


    @MODEL
    @given(prompt=prompts(VOCAB, 1, 24), max_new=st.integers(1, 32), eos=st.integers(0, VOCAB - 1), data=st.data())
    def test_declared_space_decodes(self, prompt, max_new, eos, data):
        """Every point of the verifier's declared search space (``specframe tune`` searches it)
        builds a valid verifier that decodes in the engine: exactly as greedy decoding when it is
        lossless and not sampling, else within the invariants of
        :meth:`test_generation_emits_root_paths_within_budget` (a lossy rule trades that)."""
        name, options, point = declared_point("verifiers", self.plugin, type(self), data)
        verifier = make_plugin("verifiers", (name, options))
        target = fx.tiny_target()
        dec = SpecDecoder.build(target=target, drafter=("model", {"model": fx.close_draft(target)}),
                                policy=self.engine_policy, verifier=verifier, strict=True)
        views: list = []
        out = dec.generate(prompt, max_new_tokens=max_new, eos_token_id=eos, seed=0, on_step=views.append)
        if getattr(verifier, "lossless", True) and not getattr(verifier, "sampling", False):
            check_output(out, greedy_reference(target, prompt, max_new, eos), max_new, eos, f"point {point}")
        check_root_path_steps(out, views, dec.policy.max_budget, VOCAB, max_new, eos)


def check_root_path_steps(out: Any, views: list, budget: int, vocab: int, max_new: int, eos: int | None) -> None:
    """The invariants of a generation that hold whether or not its verifier is lossless:
    ``views`` (``generate(on_step=...)``'s :class:`~specframe.decode.engine.StepView` s) show trees
    within ``budget`` whose accepted nodes form a root path, and ``out.tokens`` is, step by
    step, each path's drafted tokens plus one bonus token, the last step cut at ``max_new``
    tokens or the first EOS."""
    tokens = list(out.tokens)
    assert all(0 <= t < vocab for t in tokens), f"a token outside the vocabulary: {tokens}"
    assert len(out.steps) == len(views), "on_step saw another number of steps than the output records"
    if eos is not None and eos in tokens:
        assert tokens.index(eos) == len(tokens) - 1 and out.stopped_at_eos, f"the run went on after EOS {eos}"
    else:
        assert len(tokens) == max_new and not out.stopped_at_eos, (
            f"{len(tokens)} tokens without EOS, max_new_tokens={max_new}")
    start = 0
    for i, (view, stats) in enumerate(zip(views, out.steps)):
        tree, path = view.tree, view.path_nodes.tolist()
        assert len(tree) == stats.tree_size <= budget, f"step {i}: tree of {len(tree)} nodes, budget {budget}"
        parents = tree.parents.tolist()
        assert path[0] == 0 and all(parents[b] == a for a, b in zip(path, path[1:])), (
            f"step {i}: accepted nodes {path} are not a root path of the tree")
        assert stats.accepted == len(path) - 1, f"step {i}: {stats.accepted} accepted, path {path}"
        last_step = i == len(views) - 1
        emitted = tokens[start:start + stats.emitted]
        drafted = tree.tokens[path[1:]].tolist()
        if last_step:
            assert 1 <= stats.emitted <= len(path), f"step {i}: emitted {stats.emitted} of a path of {len(path)}"
        else:
            assert stats.emitted == len(path), f"step {i}: emitted {stats.emitted}, path {path} plus one bonus"
        assert emitted[:len(drafted)] == drafted[:len(emitted)], (
            f"step {i}: emitted {emitted}, the accepted path carries {drafted} before the bonus token")
        start += stats.emitted
    assert start == len(tokens), "the steps' emitted counts do not add up to the output"


# ====================================================================== generated classes
_BASES = {"policies": TreePolicyConformance, "drafters": DrafterConformance, "verifiers": VerifierConformance}
_PREFIX = {"policies": "Policy", "drafters": "Drafter", "verifiers": "Verifier"}


def conformance_classes(dist: str | None = None, module: str | None = None,
                        kinds: Iterable[str] = ("policies", "drafters", "verifiers"),
                        options: dict | None = None) -> dict[str, type]:
    """One ``Test<Kind>_<name>`` conformance class per registered plugin (of ``dist`` if given).

    ``specframe conformance`` and specframe's own tests use this: put the result in a test
    module's namespace (``globals().update(conformance_classes("my-dist", __name__))``).
    specframe's built-ins get their settings from :data:`fixtures.BUILTIN_SETTINGS`.
    ``options``: plugin options (e.g. ``{"budget": "auto"}``) for every plugin whose options
    take all of these keys (:func:`specframe.options.takes_options`), over its own settings; the others keep theirs.
    """
    from specframe.plugins import SINGULAR, get_registry, normalise_dist

    registry = get_registry()
    classes: dict[str, type] = {}
    for kind in kinds:
        for info in registry.infos(kind):
            if dist is not None and normalise_dist(info.dist) != normalise_dist(dist):
                continue
            attrs: dict[str, Any] = {"plugin": info.name, "__module__": module or __name__,
                                     "__doc__": f"Conformance of {SINGULAR[kind]} "
                                                f"{info.name!r} from {info.dist}."}
            if normalise_dist(info.dist) == "specframe":
                attrs.update(fx.BUILTIN_SETTINGS.get((kind, info.name), {}))
            if options and takes_options(info.cls.Options, options):
                own = attrs["plugin"][1] if isinstance(attrs["plugin"], tuple) else {}
                attrs["plugin"] = (info.name, {**own, **options})
            name = f"Test{_PREFIX[kind]}_{re.sub(r'[^0-9A-Za-z_]', '_', info.name)}"
            classes[name] = type(name, (_BASES[kind],), attrs)
    return classes


def _options_text(plugin: Any) -> str:
    """``budget=60, mu=0.03``: a plugin's option values, for messages."""
    import dataclasses

    opts = getattr(plugin, "options", None)
    if opts is None or not dataclasses.is_dataclass(opts):
        return "default options"
    return ", ".join(f"{f.name}={getattr(opts, f.name)!r}" for f in dataclasses.fields(opts))
