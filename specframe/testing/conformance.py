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
  :class:`~specframe.target.TargetModel` over the suite's tiny float64 model).

Hypothesis sizing: every property runs ``$SPECFRAME_CONFORMANCE_EXAMPLES`` examples, default
the count of the ``$HYPOTHESIS_PROFILE`` profile (default 10, ci 30, thorough 200; see
:mod:`specframe.testing.profiles`); model-based properties run a third of that (at least 2).
The counts are fixed when this module is imported, so the user's own Hypothesis profile never
makes the suite slow.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any, ClassVar, Iterable, Iterator

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from specframe.engine import SpecDecoder, make_plugin
from specframe.interfaces import DraftSession, Drafter, TreePolicy, Verdict, Verifier
from specframe.target import TargetModel
from specframe.tree import DRAFTING_MODES, DraftTree

from . import fixtures as fx
from .profiles import profile_examples
from .strategies import draft_trees, prompts
from .synthetic import SyntheticDrafter, make_session, paths_of, synthetic_drafters

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


# ---------------------------------------------------------------------- helpers
def _greedy_reference(model: Any, prompt: list[int], max_new_tokens: int, eos: int | None) -> list[int]:
    """``model.generate(do_sample=False)``: the tokens every greedy combination must reproduce.

    Without EOS, ``min_new_tokens`` keeps transformers from stopping at the config's EOS id.
    """
    ids = torch.tensor([prompt])
    stop = dict(eos_token_id=eos, pad_token_id=eos) if eos is not None else dict(min_new_tokens=max_new_tokens)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                         max_new_tokens=max_new_tokens, **stop)
    return out[0, len(prompt):].tolist()


def _check_output(out: Any, expected: list[int], max_new: int, eos: int | None, label: str) -> None:
    """A generation equals greedy decoding and honours max_new_tokens / EOS exactly."""
    assert out.tokens == expected, f"{label}: speculative output differs from model.generate(do_sample=False)"
    assert len(out.tokens) <= max_new
    assert sum(s.emitted for s in out.steps) == len(out.tokens), f"{label}: step records miss tokens"
    if eos is not None:
        assert out.stopped_at_eos == (eos in out.tokens), f"{label}: EOS {eos} not honoured"


def check_against_drafter(tree: DraftTree, drafter: SyntheticDrafter, strict_ranks: bool = False) -> None:
    """Every drafted node is a real, finite child of its parent with the right score and rank."""
    paths = paths_of(tree, range(len(tree)))
    logp = tree.logp.double()
    for i in range(1, len(tree)):
        parent, token = int(tree.parents[i]), int(tree.tokens[i])
        row = drafter.row(paths[parent]).double()
        value = float(row[token])
        assert math.isfinite(value), f"node {i} (token {token}) has a -inf draft log-prob: an impossible node"
        assert abs(float(logp[i]) - (float(logp[parent]) + value)) <= 1e-4 * (1 + abs(float(logp[i]))), (
            f"node {i}: cumulative log-prob {float(logp[i])} != parent {float(logp[parent])} + {value}"
        )
        # Rank among the parent's candidates: higher log-prob first, lower token id on ties
        # (-1 is the tree's "unknown", e.g. for sampled children).
        rank = int((row > value).sum()) + int((row[:token] == value).sum())
        allowed = (rank,) if strict_ranks else (rank, -1)
        assert int(tree.ranks[i]) in allowed, f"node {i}: rank {int(tree.ranks[i])}, expected {rank}"


def check_draft_records(tree: DraftTree, vocab_size: int) -> None:
    """A tree of sampled children says how they were drawn and carries the distributions."""
    assert tree.drafting in DRAFTING_MODES, f"tree.drafting {tree.drafting!r} is not one of {DRAFTING_MODES}"
    if tree.drafting == "deterministic":
        return
    q = tree.draft_probs
    assert q is not None, f"tree.drafting is {tree.drafting!r} but tree.draft_probs is None"
    assert tuple(q.shape) == (len(tree), vocab_size), f"draft_probs shape {tuple(q.shape)}"
    expanded = torch.unique(tree.parents[1:])
    sums = q[expanded].double().sum(dim=-1)
    assert torch.allclose(sums, torch.ones_like(sums), atol=1e-6), "a draft_probs row of an expanded node does not sum to 1"
    assert bool((q[tree.parents[1:], tree.tokens[1:]] > 0).all()), "a sampled child has draft probability 0"


def _sparse_drafter(vocab: int, finite: int, seed: int) -> SyntheticDrafter:
    """Rows with only ``finite`` finite entries (the rest -inf), like n-gram or reduced-vocab drafters."""
    base = SyntheticDrafter(vocab, temperature=0.5, seed=seed, dtype=torch.float64)

    def row(path: tuple[int, ...]) -> torch.Tensor:
        logits = base.row(path)
        keep = torch.topk(logits, min(finite, vocab)).indices
        out = torch.full_like(logits, -math.inf)
        out[keep] = logits[keep]
        return out

    return SyntheticDrafter(vocab, row, seed=seed)


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
        """Build one tree; the session carries a seeded generator so sampling policies reproduce."""
        policy = self.make_policy()
        session = make_session(drafter, root_token=root, generator=torch.Generator().manual_seed(1234))
        return policy.build(session, budget), session, policy

    @FAST
    @given(drafter=synthetic_drafters(max_vocab=256), budget=st.integers(2, 64), root=st.integers(0, 1))
    def test_valid_tree_within_budget(self, drafter, budget, root):
        """check_valid, size <= min(budget, policy.budget), right root, nodes match the drafter."""
        budget = min(budget, self.max_budget)
        tree, session, policy = self.build(drafter, budget, root)
        limit = min(budget, policy.budget)
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
        tree.check_valid(min(budget, policy.budget))
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
        drafter = _sparse_drafter(vocab, finite, seed)
        tree, _, policy = self.build(drafter, budget)
        tree.check_valid(min(budget, policy.budget))
        check_against_drafter(tree, drafter, self.strict_ranks)

    @MODEL
    @given(prompt=prompts(VOCAB, 1, 24), max_new=st.integers(1, 32), eos=st.integers(0, VOCAB - 1),
           fast=st.booleans())
    def test_greedy_output_equals_generate(self, prompt, max_new, eos, fast):
        """Lossless: with the ``model`` drafter and greedy verification, output ==
        ``model.generate(do_sample=False)`` token for token (float64), stopping exactly at EOS
        and max_new_tokens, on the reference and the pre-allocated (``fast``) engine paths."""
        target = fx.tiny_target()
        dec = SpecDecoder.build(target=target, drafter=("model", {"model": fx.close_draft(target)}),
                                policy=self.make_policy(), verifier="greedy", fast=fast)
        out = dec.generate(prompt, max_new_tokens=max_new, eos_token_id=eos, seed=0)
        _check_output(out, _greedy_reference(target, prompt, max_new, eos), max_new, eos, f"fast={fast}")

    def test_close_draft_is_accepted(self):
        """Guards the lossless property against vacuity: with a close draft model, drafted
        tokens are really accepted (tau > 1) and the output still equals greedy decoding."""
        target = fx.tiny_target()
        dec = SpecDecoder.build(target=target, drafter=("model", {"model": fx.close_draft(target)}),
                                policy=self.make_policy(), verifier="greedy")
        prompt = [5, 17, 9, 33, 2, 40]
        out = dec.generate(prompt, max_new_tokens=16, eos_token_id=None, seed=0)
        assert out.tokens == _greedy_reference(target, prompt, 16, None)
        assert out.tau > 1.0, f"the close draft was never accepted (tau={out.tau:.2f})"


# ====================================================================== drafters
def _begin(drafter: Drafter, target: TargetModel, committed: list[int]) -> None:
    """Start a generation as the engine does (prefill the target when the drafter needs features)."""
    prompt = torch.tensor(committed, dtype=torch.long)
    needs_hidden = bool(getattr(drafter, "needs_target_hidden", False))
    target.reset()
    hidden = None
    if len(committed) > 1:  # the root enters the target's cache with the first tree
        prefill = target.causal_forward(prompt[:-1].to(target.device), needs_hidden)
        hidden = prefill.hidden_states if needs_hidden else None
    drafter.begin(prompt, target_hidden=hidden)


def _greedy_walk(tree: DraftTree, logits: torch.Tensor) -> tuple[list[int], int]:
    """Literal greedy verification: accepted node path (root first) and the bonus token."""
    argmax = logits.argmax(dim=-1).tolist()
    tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
    path = [0]
    while True:
        nxt = [i for i in range(len(tokens)) if parents[i] == path[-1] and tokens[i] == argmax[path[-1]]]
        if not nxt:
            return path, argmax[path[-1]]
        path.append(nxt[0])


def _grow(session: DraftSession, widths: list[int]) -> tuple[DraftTree, dict[int, torch.Tensor]]:
    """A tree of one expanded layer per entry of ``widths`` (top-w finite children per node)."""
    tree, frontier, rows = session.new_tree(), [0], {}
    for width in widths:
        logp = session.expand(tree, frontier)
        rows.update({node: logp[j] for j, node in enumerate(frontier)})
        top = torch.topk(logp.double(), min(width, logp.shape[-1]), dim=-1)
        keep = torch.isfinite(top.values)
        if not bool(keep.any()):
            break
        flat = keep.flatten()
        parents = torch.tensor(frontier).repeat_interleave(top.values.shape[1])[flat]
        start = len(tree)
        logp_nodes = tree.logp[parents].double() + top.values.flatten()[flat]
        tree = tree.add_nodes(parents, top.indices.flatten()[flat], logp_nodes)
        frontier = list(range(start, len(tree)))
    return tree, rows


#: Layer widths of the honesty trees: the root always branches and a second layer is expanded,
#: so siblings exist when the drafter runs (a chain cannot show a leak between branches).
_BRANCHING_WIDTHS = st.builds(lambda first, rest: [first, *rest], st.integers(2, 3),
                              st.lists(st.integers(1, 3), min_size=1, max_size=2))


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

    def test_expand_rows_are_log_distributions(self):
        """``expand`` gives ``[len(nodes), V_target]`` log-probs: no NaN or +inf, at least one
        finite entry per row, total probability at most 1."""
        target = self._target()
        drafter = self.make_drafter(target)
        assert drafter.vocab_size == target.vocab_size, f"vocab_size {drafter.vocab_size} != target's {target.vocab_size}"
        for committed in ([7], [4, 9, 12, 30, 2, 17, 9, 12]):
            _begin(drafter, target, committed)
            tree, rows = _grow(DraftSession(drafter, committed[-1], target.device), [3, 2])
            assert rows, "expand returned nothing"
            logp = torch.stack(list(rows.values())).double()
            assert logp.shape == (len(rows), target.vocab_size), f"expand rows have shape {tuple(logp.shape)}"
            assert not bool(torch.isnan(logp).any()), "expand returned NaN"
            assert not bool((logp == math.inf).any()), "expand returned +inf"
            assert bool(torch.isfinite(logp).any(dim=-1).all()), "a row has no finite entry: nothing can be drafted"
            assert bool((torch.logsumexp(logp, dim=-1) <= 1e-5).all()), "a row's probabilities sum above 1"

    def _chain_row(self, target: TargetModel, committed: list[int], path: list[int]) -> torch.Tensor:
        """Reference: a fresh drafter expands ``path`` as a chain, one node per expand."""
        drafter = self.make_drafter(target)
        _begin(drafter, target, committed)
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
        several engine-like steps (greedy verification, ``commit``), so what a drafter keeps
        between steps is checked too."""
        model = fx.tiny_target()
        target, reference = TargetModel(model), TargetModel(model)
        drafter = self.make_drafter(target)
        committed = list(prompt)
        _begin(drafter, target, committed)
        for step in range(steps):
            tree, rows = _grow(DraftSession(drafter, committed[-1], target.device), widths)
            for node, row in rows.items():
                path = [int(tree.tokens[i]) for i in tree.path_to(node)[1:]]
                want = self._chain_row(reference, committed, path)
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
            path, bonus = _greedy_walk(tree, out.logits[0])
            emitted = tree.tokens[path[1:]].tolist() + [bonus]
            target.keep(len(committed) - 1, torch.tensor(path))
            hidden = out.hidden_states if getattr(drafter, "needs_target_hidden", False) else None
            drafter.commit(torch.tensor(emitted), torch.tensor(path), hidden)
            committed += emitted

    @MODEL
    @given(prompt=prompts(VOCAB, 1, 24), max_new=st.integers(1, 32), eos=st.integers(0, VOCAB - 1),
           data=st.data())
    def test_greedy_output_equals_generate(self, prompt, max_new, eos, data):
        """Lossless: with greedy verification, output == ``model.generate(do_sample=False)``
        (float64) under each of ``policies``, stopping exactly at EOS and max_new_tokens."""
        policy = data.draw(st.sampled_from(self.policies), label="policy")
        target = self._target()
        dec = SpecDecoder.build(target=target, drafter=self.make_drafter(target), policy=policy, verifier="greedy")
        out = dec.generate(prompt, max_new_tokens=max_new, eos_token_id=eos, seed=0)
        _check_output(out, _greedy_reference(target.model, prompt, max_new, eos), max_new, eos, f"policy {policy}")

    def test_begin_forgets_earlier_generations(self):
        """Generating A, then B, then A again on one decoder repeats A exactly (tokens and tree
        sizes), and B equals B on a fresh decoder: ``begin`` drops all earlier state."""
        a, b = [5, 17, 9, 33, 2, 40], [11, 3, 3, 28]

        def decoder() -> SpecDecoder:
            target = self._target()
            return SpecDecoder.build(target=target, drafter=self.make_drafter(target), policy=self.policies[0])

        def run(dec: SpecDecoder, prompt: list[int]) -> tuple[list[int], list[int]]:
            out = dec.generate(prompt, max_new_tokens=16, eos_token_id=None, seed=0)
            return out.tokens, [s.tree_size for s in out.steps]

        dec = decoder()
        first_a, second_b, again_a = run(dec, a), run(dec, b), run(dec, a)
        assert again_a == first_a, "a second generation of the same prompt differs: state leaked"
        assert second_b == run(decoder(), b), "a generation after another differs from a fresh one"


# ====================================================================== verifiers
def emitted_distribution(tree: DraftTree, probs: torch.Tensor) -> dict[tuple[int, ...], float]:
    """Exact distribution of the tokens one verification of a FIXED tree emits, if lossless.

    Sampling token by token from ``probs`` (row u = the target distribution after node u),
    starting at the root: a token equal to a child of the current node moves there and the walk
    goes on; any other token ends the step as the bonus. Outcome = the emitted tokens.
    """
    children: dict[int, dict[int, int]] = {}
    for i, (p, tok) in enumerate(zip(tree.parents.tolist(), tree.tokens.tolist())):
        if p >= 0:
            children.setdefault(p, {})[tok] = i
    rows = probs.double().tolist()
    out: dict[tuple[int, ...], float] = {}
    stack = [(0, (), 1.0)]
    while stack:
        node, prefix, mass = stack.pop()
        for token, p in enumerate(rows[node]):
            if p <= 0:
                continue
            child = children.get(node, {}).get(token)
            if child is None:
                out[prefix + (token,)] = out.get(prefix + (token,), 0.0) + mass * p
            else:
                stack.append((child, prefix + (token,), mass * p))
    return out


def chi_square_pvalue(counts: dict[Any, int], probs: dict[Any, float], min_expected: float = 5.0) -> tuple[float, int]:
    """Pearson goodness-of-fit p-value of ``counts`` against ``probs`` and its degrees of freedom.

    Outcomes expected fewer than ``min_expected`` times are pooled into one cell (the usual
    validity rule). Outcomes of probability 0 must be checked separately (any count fails).
    """
    total = sum(counts.values())
    cells, pooled_obs, pooled_exp = [], 0.0, 0.0
    for outcome, p in probs.items():
        exp = p * total
        if exp < min_expected:
            pooled_obs, pooled_exp = pooled_obs + counts.get(outcome, 0), pooled_exp + exp
        else:
            cells.append((counts.get(outcome, 0), exp))
    if pooled_exp > 0:
        cells.append((pooled_obs, pooled_exp))
    if len(cells) < 2:
        return 1.0, 0
    stat = sum((o - e) ** 2 / e for o, e in cells)
    df = len(cells) - 1
    # Survival function of chi2(df) = regularised upper incomplete gamma Q(df/2, stat/2).
    p_value = float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                            torch.tensor(stat / 2, dtype=torch.float64)))
    return p_value, df


#: Shapes of the fixed trees of the distribution property: parent of each node (node 0 = root).
_DIST_SHAPE = [-1, 0, 0, 0, 1, 1, 4]   # root -> 3 children; first child -> 2; its first -> 1
_DIST_CHAIN = [-1, 0, 1, 2]            # i.i.d. drafting: one child per node (no duplicate siblings)
_DIST_VOCAB = 8


def _hf_warped_probs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """transformers' sampling distribution (TemperatureLogitsWarper, TopK, TopP, softmax)."""
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper,
    )

    scores = logits.clone()
    if temperature != 1.0:
        scores = TemperatureLogitsWarper(temperature)(None, scores)
    if top_k:
        scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p < 1.0:
        scores = TopPLogitsWarper(top_p)(None, scores)
    return torch.softmax(scores.double(), dim=-1)


class VerifierConformance(_Conformance):
    """Properties every verifier must have (``plugin`` names a registered verifier).

    The reference a verifier is held to (:meth:`reference_probs`): a ``sampling`` verifier must
    emit tokens distributed as transformers' ``generate(do_sample=True)`` with the verifier's
    ``temperature`` / ``top_k`` / ``top_p`` options; any other verifier must emit exactly the
    greedy (argmax) tokens.
    """

    #: The configuration in which the verifier must reproduce greedy decoding end to end
    #: (default: ``plugin`` itself when it is not a sampling verifier). A sampling verifier
    #: sets e.g. ``("sampling", {"top_k": 1})``, or declares the test an expected failure.
    greedy_plugin: ClassVar[Any] = None
    #: Verifications drawn per case of the distribution property.
    samples: ClassVar[int] = 2000
    #: Significance level of the distribution property (see its docstring).
    alpha: ClassVar[float] = 1e-4

    def make_verifier(self, spec: Any = None) -> Verifier:
        """A fresh verifier from ``spec`` (default: ``plugin``)."""
        return make_plugin("verifiers", _split(self.plugin if spec is None else spec, type(self)))

    def reference_probs(self, verifier: Verifier, logits: torch.Tensor) -> torch.Tensor:
        """``[n, V]`` distribution the verifier must emit from at each node (float64).

        Override for a sampling verifier whose warping is not transformers' temperature/top-k/top-p.
        """
        if getattr(verifier, "sampling", False):
            opts = verifier.options
            return _hf_warped_probs(logits, float(getattr(opts, "temperature", 1.0)),
                                    int(getattr(opts, "top_k", 0)), float(getattr(opts, "top_p", 1.0)))
        return torch.nn.functional.one_hot(logits.argmax(dim=-1), logits.shape[-1]).double()

    @FAST
    @given(tree=draft_trees(max_nodes=24, vocab_size=16), seed=st.integers(0, 2**31 - 1))
    def test_verdict_is_a_root_path(self, tree, seed):
        """The verdict is a path from the root down the tree; every emitted token is possible
        under the reference distribution; on a deterministic tree the bonus token is never a
        child of the last accepted node (it would have been accepted)."""
        verifier = self.make_verifier()
        gen = torch.Generator().manual_seed(seed)
        logits = torch.randn(len(tree), 16, generator=gen, dtype=torch.float64) * 2
        verdict = verifier.verify(tree, logits, gen)
        assert isinstance(verdict, Verdict), f"verify returned {type(verdict).__name__}, not a Verdict"
        path = torch.as_tensor(verdict.accepted_path).tolist()
        assert path and path[0] == 0, f"accepted path {path} does not start at the root"
        parents = tree.parents.tolist()
        assert all(parents[b] == a for a, b in zip(path, path[1:])), f"accepted path {path} is not a root path"
        bonus = int(verdict.bonus_token)
        assert 0 <= bonus < 16, f"bonus token {bonus} outside the vocabulary"
        probs = self.reference_probs(verifier, logits)
        tokens = tree.tokens.tolist()
        for a, b in zip(path, path[1:]):
            assert probs[a, tokens[b]] > 0, f"accepted token {tokens[b]} is impossible under the target at node {a}"
        assert probs[path[-1], bonus] > 0, f"bonus token {bonus} is impossible under the target"
        siblings = {tokens[i] for i in range(1, len(tree)) if parents[i] == path[-1]}
        assert bonus not in siblings, f"bonus token {bonus} is a drafted child of the last accepted node"

    def _cases(self) -> Iterable[tuple[str, torch.Tensor, Any]]:
        """Distribution cases: (drafting mode, target logits, tree or tree sampler)."""
        gen = torch.Generator().manual_seed(2026)
        v = _DIST_VOCAB
        for mode in DRAFTING_MODES:
            shape = _DIST_CHAIN if mode == "iid" else _DIST_SHAPE
            logits = torch.randn(len(shape), v, generator=gen, dtype=torch.float64) * 1.5
            # A draft that disagrees with the target often, so rejections and residuals matter.
            q = torch.softmax(torch.randn(len(shape), v, generator=gen, dtype=torch.float64) * 1.5, dim=-1)
            yield mode, logits, _TreeSampler(shape, q, mode)

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
        """
        verifier = self.make_verifier()
        failures = []
        for mode, logits, sampler in self._cases():
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
                verdict = verifier.verify(tree, logits, gen_verify)
                path = torch.as_tensor(verdict.accepted_path).tolist()
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
    def test_greedy_output_equals_generate(self, prompt, max_new, eos):
        """Lossless end to end: in its greedy configuration (``greedy_plugin``, default the
        plugin itself for non-sampling verifiers), the engine with a close ``model`` draft and
        the ``talon`` policy reproduces ``model.generate(do_sample=False)`` (float64)."""
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
                                policy="talon", verifier=verifier)
        out = dec.generate(prompt, max_new_tokens=max_new, eos_token_id=eos, seed=0)
        _check_output(out, _greedy_reference(target, prompt, max_new, eos), max_new, eos, "greedy configuration")


class _TreeSampler:
    """Trees of a fixed shape whose children are drafted from fixed rows ``q`` in one mode."""

    def __init__(self, parents: list[int], q: torch.Tensor, mode: str) -> None:
        self.parents, self.q, self.mode = parents, q, mode

    def draw(self, gen: torch.Generator | None) -> DraftTree:
        """One tree: top ranks of q (deterministic), or children drawn with ``gen``."""
        n, parents = len(self.parents), self.parents
        tokens = [0] * n
        kids: dict[int, list[int]] = {}
        for i in range(1, n):
            kids.setdefault(parents[i], []).append(i)
        for node, children in kids.items():
            row = self.q[node]
            if self.mode == "deterministic":
                picked = torch.sort(row, descending=True, stable=True).indices[: len(children)].tolist()
            elif self.mode == "iid":
                picked = torch.multinomial(row, len(children), replacement=True, generator=gen).tolist()
            else:
                picked = torch.multinomial(row, len(children), replacement=False, generator=gen).tolist()
            for child, token in zip(children, picked):
                tokens[child] = token
        depths = [0] * n
        for i in range(1, n):
            depths[i] = depths[parents[i]] + 1
        logp = [0.0] * n
        for i in range(1, n):
            logp[i] = logp[parents[i]] + math.log(float(self.q[parents[i], tokens[i]]))
        expanded = torch.zeros(n, dtype=torch.bool)
        expanded[torch.tensor(parents[1:])] = True
        tree = DraftTree(tokens=torch.tensor(tokens), parents=torch.tensor(parents), depths=torch.tensor(depths),
                         logp=torch.tensor(logp, dtype=torch.float32), ranks=torch.full((n,), -1))
        if self.mode == "deterministic":
            return tree
        tree.draft_probs = torch.where(expanded[:, None], self.q, 0.0)
        tree.drafting = self.mode  # type: ignore[assignment]
        return tree


# ====================================================================== generated classes
_BASES = {"policies": TreePolicyConformance, "drafters": DrafterConformance, "verifiers": VerifierConformance}
_PREFIX = {"policies": "Policy", "drafters": "Drafter", "verifiers": "Verifier"}


def _normalise(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


def conformance_classes(dist: str | None = None, module: str | None = None,
                        kinds: Iterable[str] = ("policies", "drafters", "verifiers")) -> dict[str, type]:
    """One ``Test<Kind>_<name>`` conformance class per registered plugin (of ``dist`` if given).

    ``specframe conformance`` and specframe's own tests use this: put the result in a test
    module's namespace (``globals().update(conformance_classes("my-dist", __name__))``).
    specframe's built-ins get their settings from :data:`fixtures.BUILTIN_SETTINGS`.
    """
    from specframe.plugins import get_registry

    registry = get_registry()
    classes: dict[str, type] = {}
    for kind in kinds:
        for info in registry.infos(kind):
            if dist is not None and _normalise(info.dist) != _normalise(dist):
                continue
            attrs: dict[str, Any] = {"plugin": info.name, "__module__": module or __name__,
                                     "__doc__": f"Conformance of {kind[:-1] if kind != 'policies' else 'policy'} "
                                                f"{info.name!r} from {info.dist}."}
            if _normalise(info.dist) == "specframe":
                attrs.update(fx.BUILTIN_SETTINGS.get((kind, info.name), {}))
            name = f"Test{_PREFIX[kind]}_{re.sub(r'[^0-9A-Za-z_]', '_', info.name)}"
            classes[name] = type(name, (_BASES[kind],), attrs)
    return classes
