"""Conformance of drafters: :class:`DrafterConformance`."""

from __future__ import annotations

import copy
import math
from typing import Any, ClassVar

import torch
from hypothesis import example, given
from hypothesis import strategies as st

from specframe.clock import TickClock
from specframe.decode.engine import SpecDecoder, make_plugin
from specframe.interfaces import DraftSession, Drafter
from specframe.selection import topk_per_row
from specframe.models.target import TargetModel
from specframe.tree import DraftTree
from specframe.testing import fixtures as fx
from specframe.testing.conformance.base import MODEL, VOCAB, Conformance, declared_point, split_spec
from specframe.testing.harness import (
    begin_generation, check_output, commit_step, greedy_reference, grow_tree, learns_from_verdicts,
)
from specframe.testing.reference import greedy_walk
from specframe.testing.strategies import prompts


#: Layer widths of the honesty trees: the root always branches and a second layer is expanded,
#: so siblings exist when the drafter runs (a chain cannot show a leak between branches).
_BRANCHING_WIDTHS = st.builds(lambda first, rest: [first, *rest], st.integers(2, 3),
                              st.lists(st.integers(1, 3), min_size=1, max_size=2))


#: Earlier generations that fill a ``persistent_state`` drafter before its properties run.
SEASONING_PROMPTS = ([5, 9, 12, 5, 9, 12, 5], [30, 2, 17, 30, 2, 4, 9])


class DrafterConformance(Conformance):
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
        return fx.default_drafter(split_spec(self.plugin, type(self)), target)

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
