"""Conformance of tree policies: :class:`TreePolicyConformance`."""

from __future__ import annotations

from typing import ClassVar

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from specframe.decode.engine import SpecDecoder, make_plugin
from specframe.interfaces import DraftSession, Drafter, StepStats, TreePolicy
from specframe.sizing import AutoSizedPolicy
from specframe.models.target import TargetModel
from specframe.tree import DraftTree
from specframe.testing import fixtures as fx
from specframe.testing.conformance.base import (
    FAST, MODEL, VOCAB, Conformance, declared_point, options_text, split_spec,
)
from specframe.testing.harness import (
    check_against_drafter, check_draft_records, check_output, greedy_reference, sparse_drafter,
)
from specframe.testing.strategies import prompts
from specframe.testing.synthetic import SyntheticDrafter, make_session, synthetic_drafters


class TreePolicyConformance(Conformance):
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
        return make_plugin("policies", split_spec(self.plugin, type(self)))

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
            pytest.skip(f"an AutoSizedPolicy with a fixed size under these options ({options_text(policy)}): "
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
