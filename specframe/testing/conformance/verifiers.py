"""Conformance of verifiers: :class:`VerifierConformance`, and the checks its properties share."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Iterable

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from specframe.decode.engine import SpecDecoder, make_plugin
from specframe.interfaces import Verifier
from specframe.decode.read import read_step
from specframe.tree import DRAFTING_MODES, DraftTree
from specframe.testing import fixtures as fx
from specframe.testing.conformance.base import FAST, MODEL, VOCAB, Conformance, declared_point, split_spec
from specframe.testing.distribution import TreeSampler, chi_square_pvalue, emitted_distribution, hf_warped_probs
from specframe.testing.harness import check_output, greedy_reference
from specframe.testing.reference import decide, read_verdict
from specframe.testing.strategies import draft_trees, prompts


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


class VerifierConformance(Conformance):
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
        return make_plugin("verifiers", split_spec(self.plugin if spec is None else spec, type(self)))

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
        fields = ("tokens", "ranks", "widths", "contiguous", "children")
        assert packed.path.tolist() == plain.path.tolist() and all(
            getattr(packed, f) == getattr(plain, f) for f in fields), (
            f"the engine's packed read {packed} differs from the host reference {plain}")

    @FAST
    @given(rows=st.integers(1, 5), seed=st.integers(0, 2**31 - 1), coarse=st.booleans())
    def test_root_tokens_match_verify(self, rows, seed, coarse):
        """Where the verifier answers switched-off rows in one call (``root_tokens`` returns a
        tensor), row r's token is the bonus :meth:`~specframe.Verifier.verify` gives root r alone
        from the same generator state (coarse logits tie, so the tie rule is compared too)."""
        verifier = self.make_verifier()
        logits = torch.randn(rows, 16, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 2
        logits = logits.round() if coarse else logits
        batched = verifier.root_tokens(logits, [torch.Generator().manual_seed(seed + 1 + r) for r in range(rows)])
        if batched is None:  # the default: the engine verifies each root alone
            return
        assert tuple(batched.shape) == (rows,) and not batched.is_floating_point(), (
            f"root_tokens returned {batched!r}, not one integer token per row")
        for r in range(rows):
            root = DraftTree.root(3)
            last, bonus = verifier.verify(root, logits[r : r + 1], torch.Generator().manual_seed(seed + 1 + r))
            assert int(batched[r]) == int(bonus), (
                f"root_tokens gave row {r} token {int(batched[r])}, verify on its root alone {int(bonus)}")

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
