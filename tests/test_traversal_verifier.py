"""The ``traversal`` verifier (Traversal Verification, arXiv 2505.12398): the vectorised decision
takes the literal Algorithm 3's decisions on the same random numbers, is exactly lossless by
enumeration, is optimal on chains, accepts more than ``sampling`` on sampled trees, refuses
the drafting mode its proof does not cover, and runs in the engine.

The distribution tests at the end are marked ``statistical`` and follow
tests/test_sampling_distribution.py's conventions: fixed seeds, Pearson chi-square with cells
expected < 5 times pooled, a case passes when p >= ALPHA = 1e-3 and no sample lands in a
zero-probability cell, and the same statistic must reject deliberately broken variants.
"""

from __future__ import annotations

import dataclasses
import itertools
from functools import lru_cache

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import specframe
from specframe.decode.engine import make_plugin
from specframe.models.synthetic import perturbed_copy
from specframe.testing.distribution import chi_square_pvalue, hf_warped_probs
from specframe.testing.fixtures import tiny_target
from specframe.testing.host_reads import HostReadCounter
from specframe.testing.reference import Verdict, decide
from specframe.testing.strategies import draft_trees
from specframe.testing.traversal_reference import TraversalReferenceVerifier, traversal_reference
from specframe.tree import DRAFTING_MODES, DraftTree
from specframe.verifiers.sampling import MissingDraftProbsError, inverse_cdf, sample_accept_batch, target_probs
from specframe.verifiers.traversal import post_order, traversal_accept_batch, traversal_rates

SAMPLED_MODES = ("iid", "without_replacement")
F64 = torch.float64


def make_tree(parents: list[int], tokens: list[int] | None = None, draft_probs: torch.Tensor | None = None,
              drafting: str = "without_replacement") -> DraftTree:
    """A DraftTree of the given shape (tokens default to 0, as the tables below index paths)."""
    n = len(parents)
    depths = [0] * n
    for i in range(1, n):
        depths[i] = depths[parents[i]] + 1
    tree = DraftTree(tokens=torch.tensor(tokens or [0] * n), parents=torch.tensor(parents),
                     depths=torch.tensor(depths), logp=torch.zeros(n), ranks=torch.full((n,), -1))
    return dataclasses.replace(tree, draft_probs=draft_probs, drafting=drafting)


def verdict_of(tree: DraftTree, probs: torch.Tensor, uniforms: torch.Tensor) -> Verdict:
    """The vectorised decision for one draw, read back as a host verdict."""
    last, bonus = traversal_accept_batch(tree, probs, uniforms.reshape(1, -1))
    return Verdict.from_leaf(tree, last[0], bonus[0])


def end_probabilities(tree: DraftTree, rates: torch.Tensor) -> torch.Tensor:
    """``[S, n]`` exact P(the step ends at node a): a's rate times the chance that every node
    before it in post-order was rejected (each node's test is an independent uniform)."""
    order = torch.argsort(post_order(tree))
    r = rates[:, order]
    survive = torch.cumprod(torch.cat([torch.ones_like(r[:, :1]), 1 - r[:, :-1]], dim=1), dim=1)
    out = torch.empty_like(rates)
    out[:, order] = r * survive
    return out


# ---------------------------------------------------------------------------- the paper's example
def test_paper_example_figure_2():
    """Section 3.2: M_b = [.3, .4, .3], M_s = [.6, .3, .1] over [a, b, c] at every node; the
    tree X1..X5 = a, c, b, c, a (Figure 1) is traversed X3 -> X4 -> X1 -> X5 -> X2; the chain
    X1 X3 is accepted with min(min(.5, 1) * .4 / .3, 1) = 2/3; after X3 is rejected,
    p'(X1) = .05 / (.05 + .5) = 1/11 and X4 = c gets min(1/11 * 1 / (1/7), 1) = 7/11; after X4,
    p'(X1) = 0. Then X2 = c is certain (1), as token-level RRSw's second candidate would be."""
    a, b, c = 0, 1, 2
    m_b, m_s = torch.tensor([.3, .4, .3], dtype=F64), torch.tensor([.6, .3, .1], dtype=F64)
    tree = make_tree([-1, 0, 0, 1, 1, 2], [a, a, c, b, c, a], m_s.expand(6, 3).clone())
    probs = m_b.expand(6, 3)
    rates, targets = traversal_rates(tree, probs[None], tree.tokens[None], tree.draft_probs[None])
    assert post_order(tree).tolist() == [5, 2, 4, 0, 1, 3]  # X3, X4, X1, X5, X2, then the root
    want = torch.tensor([1.0, 0.0, 1.0, 2 / 3, 7 / 11, 0.5], dtype=F64)
    assert torch.allclose(rates[0], want, atol=1e-15)
    # X2 after X5 = a is rejected: the residual [0, 1/3, 2/3] the bonus is drawn from.
    assert torch.allclose(targets[0, 2], torch.tensor([0, 1 / 3, 2 / 3], dtype=F64))
    u = lambda *tests: torch.tensor([0.5, *tests], dtype=F64)  # noqa: E731 - u[0]: the bonus draw
    for decide_one in (verdict_of, traversal_reference):
        assert decide_one(tree, probs, u(.9, .9, .6, .9, .9)).accepted_path.tolist() == [0, 1, 3]  # X3: .6 < 2/3
        assert decide_one(tree, probs, u(.9, .9, .7, .6, .9)).accepted_path.tolist() == [0, 1, 4]  # X4: .6 < 7/11
        assert decide_one(tree, probs, u(.0, .9, .7, .7, .4)).accepted_path.tolist() == [0, 2, 5]  # X1 can't pass
        last = decide_one(tree, probs, u(.0, .9, .7, .7, .6))  # X5 rejected: X2 certain, bonus from [0, 1/3, 2/3]
        assert last.accepted_path.tolist() == [0, 2] and last.bonus_token == c


@given(tree=draft_trees(max_nodes=16, vocab_size=6))
def test_post_order_is_the_traversal_order(tree):
    """The closed-form positions equal a literal post-order DFS (children in tree order)."""
    parents = tree.parents.tolist()
    order: list[int] = []

    def visit(node: int) -> None:
        for child in (i for i in range(len(parents)) if parents[i] == node):
            visit(child)
        order.append(node)

    visit(0)
    assert post_order(tree).tolist() == [order.index(i) for i in range(len(parents))]


# ---------------------------------------------------------------------------- fast = reference
def _random_case(tree: DraftTree, mode: str, seed: int, sparse: bool,
                 vocab: int) -> tuple[DraftTree, torch.Tensor, torch.Generator]:
    """Warped target rows (top-3 when ``sparse``: exact zeros), positive draft rows, the tree in
    ``mode``."""
    gen = torch.Generator().manual_seed(seed)
    n = len(tree)
    logits = torch.randn(n, vocab, generator=gen, dtype=F64) * 2
    options = dataclasses.replace(make_plugin("verifiers", "traversal").options, top_k=3 if sparse else 0)
    probs = target_probs(logits, options)
    q = torch.softmax(torch.randn(n, vocab, generator=gen, dtype=F64) * 2, dim=-1)
    return dataclasses.replace(tree, drafting=mode, draft_probs=None if mode == "deterministic" else q), probs, gen


@given(data=st.data(), vocab=st.integers(4, 8), mode=st.sampled_from(DRAFTING_MODES),
       seed=st.integers(0, 2**31 - 1), sparse=st.booleans())
def test_fast_takes_the_reference_decisions(data, vocab, mode, seed, sparse):
    """Random trees of up to 10 nodes, 32 uniform draws each: same accepted node, same bonus
    (and, for a deterministic tree, the same refusal)."""
    tree = data.draw(draft_trees(max_nodes=10, vocab_size=vocab))
    tree, probs, gen = _random_case(tree, mode, seed, sparse, vocab)
    u = torch.rand(32, len(tree), generator=gen, dtype=F64)
    if mode == "deterministic":
        for run in (lambda: traversal_accept_batch(tree, probs, u), lambda: traversal_reference(tree, probs, u[0])):
            with pytest.raises(ValueError, match="drafting is 'deterministic'"):
                run()
        return
    last, bonus = traversal_accept_batch(tree, probs, u)
    for s in range(len(u)):
        ref = traversal_reference(tree, probs, u[s])
        assert (int(last[s]), int(bonus[s])) == (ref.accepted_path.tolist()[-1], ref.bonus_token)
        path = ref.accepted_path.tolist()
        assert all(probs[tree.parents[i], tree.tokens[i]] > 0 for i in path[1:])  # only possible tokens
        assert probs[path[-1], ref.bonus_token] > 0


@given(tree=draft_trees(max_nodes=10, vocab_size=6), mode=st.sampled_from(SAMPLED_MODES),
       seed=st.integers(0, 2**31 - 1))
def test_batched_trees_equal_one_at_a_time(tree, mode, seed):
    """Five trees of one topology, each with its own tokens, target and draft rows."""
    tree, _, gen = _random_case(tree, mode, seed, False, 6)
    n = len(tree)
    tokens = torch.stack([torch.randperm(6, generator=gen)[tree.tokens] for _ in range(5)])
    probs = torch.softmax(torch.randn(5, n, 6, generator=gen, dtype=F64) * 2, dim=-1)
    q = torch.softmax(torch.randn(5, n, 6, generator=gen, dtype=F64) * 2, dim=-1)
    u = torch.rand(5, n, generator=gen, dtype=F64)
    last, bonus = traversal_accept_batch(tree, probs, u, tokens=tokens, draft_probs=q)
    for s in range(5):
        ref = traversal_reference(dataclasses.replace(tree, tokens=tokens[s], draft_probs=q[s]), probs[s], u[s])
        assert (int(last[s]), int(bonus[s])) == (ref.accepted_path.tolist()[-1], ref.bonus_token)


@given(tree=draft_trees(max_nodes=10, vocab_size=8), mode=st.sampled_from(SAMPLED_MODES),
       seed=st.integers(0, 2**31 - 1))
def test_verifier_and_reference_verifier_agree(tree, mode, seed):
    """``verify`` (warping, uniforms, decision) equals the reference verifier from one generator state."""
    tree, _, _ = _random_case(tree, mode, seed, False, 8)
    logits = torch.randn(len(tree), 8, generator=torch.Generator().manual_seed(seed), dtype=F64) * 2
    verifier = make_plugin("verifiers", ("traversal", {"temperature": 0.8, "top_p": 0.9}))
    fast = decide(verifier, tree, logits, torch.Generator().manual_seed(seed + 1))
    ref = decide(TraversalReferenceVerifier(verifier.options), tree, logits, torch.Generator().manual_seed(seed + 1))
    assert (fast.accepted_path.tolist(), fast.bonus_token) == (ref.accepted_path.tolist(), ref.bonus_token)


def test_verify_reads_nothing_from_the_device():
    """No host read inside ``verify`` (the engine reads the decision once per step)."""
    tree, _, _ = _random_case(make_tree([-1, 0, 0, 1, 1, 2, 4]), "without_replacement", 3, False, 8)
    verifier = make_plugin("verifiers", ("traversal", {"top_p": 0.9}))
    logits = torch.randn(len(tree), 8, dtype=F64)
    with HostReadCounter() as counter:
        verifier.verify(tree, logits, torch.Generator().manual_seed(0))
    assert counter.total == 0, dict(counter.counts)


# ---------------------------------------------------------------------------- refusals and options
def test_deterministic_trees_are_refused_with_a_pointer_to_sampling():
    tree = make_tree([-1, 0, 0], [4, 2, 5], drafting="deterministic")
    logits = torch.zeros(3, 8)
    verifier = make_plugin("verifiers", "traversal")
    reference = TraversalReferenceVerifier(verifier.options)
    for run in (lambda: verifier.verify(tree, logits), lambda: reference.verify(tree, logits),
                lambda: traversal_accept_batch(tree, torch.full((3, 8), 1 / 8), torch.rand(1, 3))):
        with pytest.raises(ValueError, match="drafting is 'deterministic'.*verifier 'sampling'") as err:
            run()
        assert "\n" not in str(err.value)


@pytest.mark.parametrize("mode", SAMPLED_MODES)
def test_sampled_tree_without_draft_probs_is_a_clear_error(mode):
    tree = make_tree([-1, 0, 0], [4, 2, 5], drafting=mode)
    with pytest.raises(MissingDraftProbsError, match=f"tree.drafting is '{mode}' but tree.draft_probs is None"):
        make_plugin("verifiers", "traversal").verify(tree, torch.zeros(3, 8))


@pytest.mark.parametrize("options, option", [
    ({"temperature": 0.0}, "temperature"), ({"temperature": float("nan")}, "temperature"),
    ({"top_k": -1}, "top_k"), ({"top_p": 1.5}, "top_p"), ({"seed": "7"}, "seed"),
])
def test_bad_options_name_the_option(options, option):
    with pytest.raises(specframe.OptionError, match=f"option '{option}'"):
        make_plugin("verifiers", ("traversal", options))


def test_unknown_option_lists_the_valid_ones():
    with pytest.raises(specframe.OptionError, match=r"unknown option\(s\) \['temp'\].*temperature, top_k, top_p"):
        make_plugin("verifiers", ("traversal", {"temp": 0.5}))


# ---------------------------------------------------------------------------- exact losslessness
def _tables(vocab: int, depth: int, seed: int, scale: float = 1.5) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Target rows for every path of length 0..depth and draft rows for lengths 0..depth-1:
    ``T[d]`` is ``[V] * d + [V]`` (the row after the path's d tokens); the draft disagrees often."""
    gen = torch.Generator().manual_seed(seed)
    target = [torch.randn(*([vocab] * d), vocab, generator=gen, dtype=F64) * scale for d in range(depth + 1)]
    noise = [torch.randn(*([vocab] * d), vocab, generator=gen, dtype=F64) * scale for d in range(depth)]
    draft = [torch.softmax(0.6 * target[d] + noise[d], dim=-1) for d in range(depth)]
    return [torch.softmax(t, dim=-1) for t in target], draft


def _rows(tables: list[torch.Tensor], tree: DraftTree, tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """``[S, n, V]``: each node's row, looked up by its path's tokens (zeros past the tables)."""
    anc = tree.ancestor_mask()
    rows = []
    for node, depth in enumerate(tree.depths.tolist()):
        if depth >= len(tables):
            rows.append(torch.zeros(len(tokens), vocab, dtype=F64))
            continue
        path = [a for a in range(1, len(tree)) if anc[node, a]]  # ancestors in index order = by depth
        rows.append(tables[depth][tuple(tokens[:, a] for a in path)] if path
                    else tables[0].expand(len(tokens), vocab))
    return torch.stack(rows, dim=1)


def _all_trees(parents: list[int], mode: str, draft: list[torch.Tensor],
               vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every way to draft ``parents``' shape from ``draft`` (children i.i.d. or without
    replacement, in tree order): ``(tokens [S, n], probability [S])``."""
    n = len(parents)
    kids = [[i for i in range(n) if parents[i] == p] for p in range(n)]
    draws = {"iid": lambda k: itertools.product(range(vocab), repeat=k),
             "without_replacement": lambda k: itertools.permutations(range(vocab), k)}[mode]
    found: list[tuple[list[int], float]] = []

    def grow(frontier: list[int], tokens: list[int], mass: float) -> None:
        if not frontier:
            found.append((tokens, mass))
            return
        node, rest = frontier[0], frontier[1:]
        if not kids[node]:
            return grow(rest, tokens, mass)
        path = tuple(tokens[a] for a in _path(parents, node)[1:])
        q = draft[len(path)][path].tolist()
        for combo in draws(len(kids[node])):
            chance, left = mass, 1.0
            for t in combo:  # the ordered draw's probability
                chance *= q[t] / left
                left -= q[t] if mode == "without_replacement" else 0.0
            new = list(tokens)
            for child, t in zip(kids[node], combo):
                new[child] = t
            grow(rest + kids[node], new, chance)

    grow([0], [0] * n, 1.0)
    return torch.tensor([t for t, _ in found]), torch.tensor([m for _, m in found], dtype=F64)


def _path(parents: list[int], node: int) -> list[int]:
    """Node indices from the root to ``node``."""
    path = [node]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    return path[::-1]


def _exact_first_two(parents: list[int], mode: str, vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact P(x1, x2) of one traversal step averaged over every drafted tree, and the target's."""
    target, draft = _tables(vocab, 3, seed)
    tree = make_tree(parents, drafting=mode)
    tokens, chance = _all_trees(parents, mode, draft, vocab)
    probs, q = _rows(target, tree, tokens, vocab), _rows(draft, tree, tokens, vocab)
    rates, targets = traversal_rates(tree, probs, tokens, q)
    end = end_probabilities(tree, rates) * chance[:, None]  # P(tree) * P(step ends at a | tree)
    out = torch.zeros(vocab, vocab, dtype=F64)
    for node, depth in enumerate(tree.depths.tolist()):
        path = _path(parents, node)
        if depth >= 2:  # both tokens drafted
            out.index_put_((tokens[:, path[1]], tokens[:, path[2]]), end[:, node], accumulate=True)
        elif depth == 1:  # x1 drafted, x2 the bonus
            out.index_add_(0, tokens[:, node], end[:, node, None] * targets[:, node])
        else:  # x1 the bonus, x2 from the target after it
            out += (end[:, 0, None] * targets[:, 0]).sum(dim=0)[:, None] * target[1]
    return out, target[0][:, None] * target[1]


@pytest.mark.parametrize("parents, mode", [
    ([-1, 0, 1], "iid"), ([-1, 0, 1, 2], "iid"),
    ([-1, 0, 0, 1, 1, 2, 2], "without_replacement"), ([-1, 0, 0, 0, 1, 1, 4], "without_replacement"),
])
def test_exactly_lossless_by_enumeration(parents, mode):
    """Every tree the draft can make (V = 4), weighted by its probability, with every step's
    exact outcome probabilities: the first two emitted tokens are distributed as the target's
    to rounding. (Applying the i.i.d. rule (2) to children drawn without replacement is not:
    see the power test at the end.)"""
    got, want = _exact_first_two(parents, mode, 4, seed=sum(parents) + len(parents))
    assert torch.allclose(got, want, atol=1e-13, rtol=0), (got - want).abs().max()


# ---------------------------------------------------------------------------- chains: optimal
def _chain_case(vocab: int, depth: int, seed: int, scale: float) -> tuple[float, float, tuple]:
    """Every chain of ``depth`` i.i.d. draft tokens with its probability, and both verifiers'
    exact expected accepted lengths: token-level speculative sampling (prod of min(1, p/q)) and
    traversal (from its rates)."""
    target, draft = _tables(vocab, depth, seed, scale)
    parents = list(range(-1, depth))
    tree = make_tree(parents, drafting="iid")
    tokens, chance = _all_trees(parents, "iid", draft, vocab)
    probs, q = _rows(target, tree, tokens, vocab), _rows(draft, tree, tokens, vocab)
    drafted = tokens[:, 1:, None]
    ratio = (probs[:, :-1].gather(2, drafted) / q[:, :-1].gather(2, drafted))[..., 0].clamp(max=1.0)
    token_level = float((chance * ratio.cumprod(dim=1).sum(dim=1)).sum())
    rates, _ = traversal_rates(tree, probs, tokens, q)
    ends = end_probabilities(tree, rates)
    traversal = float((chance * (ends * tree.depths.to(F64)).sum(dim=1)).sum())
    return token_level, traversal, (tree, tokens, chance, probs, q)


def test_chain_rates_are_block_verification():
    """On a chain the test of node i (deepest first) is Block Verification's h_i (Sun et al.,
    arXiv 2403.10444, Algorithm 2): h_gamma = p_gamma and, below, r / (r + 1 - p_i) with
    r = sum_x [p_i M_b(x|X^i) - M_s(x|X^i)]_+ and p_i = min(1, p_(i-1) M_b(X_i) / M_s(X_i))."""
    gen = torch.Generator().manual_seed(5)
    depth, vocab = 4, 6
    m_b = torch.softmax(torch.randn(depth + 1, vocab, generator=gen, dtype=F64) * 2, dim=-1)
    m_s = torch.softmax(torch.randn(depth + 1, vocab, generator=gen, dtype=F64) * 2, dim=-1)
    tokens = torch.cat([torch.zeros(1, dtype=torch.long), torch.multinomial(m_s[:-1], 1, generator=gen)[:, 0]])
    tree = make_tree(list(range(-1, depth)), tokens.tolist(), m_s, "iid")
    rates, _ = traversal_rates(tree, m_b[None], tokens[None], m_s[None])
    p = [1.0]
    for i in range(1, depth + 1):
        p.append(min(1.0, p[-1] * float(m_b[i - 1, tokens[i]] / m_s[i - 1, tokens[i]])))
    residual = [float((p[i] * m_b[i] - m_s[i]).clamp(min=0).sum()) for i in range(depth)]
    h = [r / (r + 1 - p[i]) for i, r in enumerate(residual)] + [p[depth]]
    assert torch.allclose(rates[0], torch.tensor(h, dtype=F64), atol=1e-14)


def test_chain_traversal_is_never_below_token_level(capsys):
    """150 random cases (V 4-8, depth 2-4, random path-dependent target and draft, chains drawn
    i.i.d. from the draft): the EXACT expected accepted length (every chain enumerated) of
    traversal is never below token-level speculative sampling's (Theorem 3.4; a tolerance for
    rounding only, so stricter than any one-sided test) and above it on average."""
    gen = torch.Generator().manual_seed(2505)
    gains = []
    for case in range(150):
        vocab, depth = int(torch.randint(4, 9, (1,), generator=gen)), int(torch.randint(2, 5, (1,), generator=gen))
        scale = 0.5 + 2.0 * float(torch.rand(1, generator=gen, dtype=F64))
        token_level, traversal, _ = _chain_case(vocab, depth, 1000 + case, scale)
        assert traversal >= token_level - 1e-12, (case, vocab, depth, token_level, traversal)
        gains.append(traversal / token_level - 1)
    mean = sum(gains) / len(gains)
    with capsys.disabled():
        print(f"\nchain gain of traversal over token-level sampling: mean {mean:+.2%}, "
              f"min {min(gains):+.2%}, max {max(gains):+.2%} over {len(gains)} cases")
    assert mean > 0.01


def test_chain_exact_expectation_matches_the_decisions():
    """The exact expectation above is what the real decisions average to (Monte Carlo, 5 sigma):
    draw chains by their probability and verify each once with ``traversal_accept_batch``."""
    token_level, traversal, (tree, tokens, chance, probs, q) = _chain_case(6, 3, 7, 1.5)
    gen = torch.Generator().manual_seed(8)
    pick = torch.multinomial(chance, 40_000, replacement=True, generator=gen)
    u = torch.rand(len(pick), len(tree), generator=gen, dtype=F64)
    last, _ = traversal_accept_batch(tree, probs[pick], u, tokens[pick], q[pick])
    accepted = tree.depths[last].to(F64)
    stderr = float(accepted.std()) / len(pick) ** 0.5
    assert abs(float(accepted.mean()) - traversal) < 5 * stderr
    assert traversal > token_level


# ---------------------------------------------------------------------------- trees: side by side
#: Two sampled children per node: a ragged tree of depth 3, and the full binary tree of depth 3.
TREE_SHAPES = {"ragged": [-1, 0, 0, 1, 1, 2, 2, 3, 3, 5], "binary": [-1] + [(i - 1) // 2 for i in range(1, 15)]}


def _sampled_trees(parents: list[int], samples: int, vocab: int, seed: int,
                   mode: str = "without_replacement") -> tuple[DraftTree, torch.Tensor, torch.Tensor, torch.Tensor,
                                                                list[torch.Tensor], torch.Generator]:
    """``samples`` trees of one shape drawn from path-dependent draft tables (no model), their
    tokens, target and draft rows, the target tables, and the generator (for uniforms)."""
    depth = max(_depths(parents))
    target, draft = _tables(vocab, depth, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    tree = make_tree(parents, drafting=mode)
    tokens = torch.zeros(samples, len(parents), dtype=torch.long)
    for node in range(len(parents)):  # parents are drawn before their children
        kids = [i for i in range(len(parents)) if parents[i] == node]
        if kids:
            row = _rows(draft, tree, tokens, vocab)[:, node]
            tokens[:, kids] = torch.multinomial(row, len(kids), replacement=mode == "iid", generator=gen)
    return tree, tokens, _rows(target, tree, tokens, vocab), _rows(draft, tree, tokens, vocab), target, gen


def _depths(parents: list[int]) -> list[int]:
    """Depth of every node of the shape."""
    return [len(_path(parents, i)) - 1 for i in range(len(parents))]


@pytest.mark.parametrize("shape", TREE_SHAPES)
def test_trees_traversal_accepts_at_least_as_much_as_sampling(shape, capsys):
    """The same 20,000 sampled trees (drawn without replacement from fixed target / draft
    tables, V = 8), each verified by both: traversal's mean accepted length is >= sampling's
    (paired one-sided test at 1%)."""
    tree, tokens, probs, q, _, gen = _sampled_trees(TREE_SHAPES[shape], 20_000, 8, seed=11)
    u = torch.rand(2, len(tokens), len(tree), generator=gen, dtype=F64)
    ours, _ = traversal_accept_batch(tree, probs, u[0], tokens, q)
    theirs, _ = sample_accept_batch(tree, probs, u[1], tokens, q)
    a, b = tree.depths[ours].to(F64), tree.depths[theirs].to(F64)
    diff = a - b
    stderr = float(diff.std()) / len(diff) ** 0.5
    with capsys.disabled():
        print(f"\n{shape} sampled tree: traversal {float(a.mean()):.4f} vs sampling {float(b.mean()):.4f} "
              f"accepted tokens per step, ratio {float(a.mean() / b.mean()):.4f} (+/- {stderr / float(b.mean()):.4f})")
    assert float(diff.mean()) > -2.33 * stderr


# ---------------------------------------------------------------------------- engine
V_E2E = 32
PROMPT = [5, 9, 2, 17]


@lru_cache(maxsize=None)
def _pair() -> tuple:
    """The tiny random target (V = 32) and a perturbed copy of it as the draft."""
    target = tiny_target(vocab_size=V_E2E)
    return target, perturbed_copy(target, 0.3, seed=4)


def _decoder(policy, verifier=("traversal", {})) -> specframe.SpecDecoder:
    """A decoder over the tiny pair with the ``model`` drafter."""
    target, draft = _pair()
    return specframe.SpecDecoder.build(target=target, drafter=("model", {"model": draft}), policy=policy,
                                       verifier=verifier)


def _greedy(n: int) -> list[int]:
    """The target's own greedy continuation of ``PROMPT``."""
    target, _ = _pair()
    ids = torch.tensor([PROMPT])
    out = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n, pad_token_id=0)
    return out[0, len(PROMPT):].tolist()


@pytest.mark.parametrize("policy", [("chain", {"sample": True, "gamma": 3}), ("sampled-tree", {"k": 2, "depth": 2})])
def test_engine_generates_and_temperature_zero_is_greedy(policy):
    dec = _decoder(policy, ("traversal", {"temperature": 0.9}))
    first = dec.generate(PROMPT, max_new_tokens=12, seed=1, eos_token_id=None)
    assert len(first.tokens) == 12 and all(0 <= t < V_E2E for t in first.tokens)
    assert dec.generate(PROMPT, max_new_tokens=12, seed=1, eos_token_id=None).tokens == first.tokens
    greedy = _greedy(12)
    assert dec.generate(PROMPT, max_new_tokens=12, temperature=0, eos_token_id=None).tokens == greedy
    # Near zero the target is one-hot (logits within ~1e-3 aside): traversal itself reproduces greedy.
    assert dec.generate(PROMPT, max_new_tokens=12, temperature=1e-4, seed=2, eos_token_id=None).tokens == greedy


def test_reference_verifier_instance_runs_in_the_engine():
    fast = _decoder(("sampled-tree", {"k": 2, "depth": 2}), ("traversal", {"temperature": 0.9}))
    slow = _decoder(("sampled-tree", {"k": 2, "depth": 2}), TraversalReferenceVerifier(fast.verifier.options))
    for seed in range(2):
        assert (fast.generate(PROMPT, max_new_tokens=8, seed=seed, eos_token_id=None).tokens
                == slow.generate(PROMPT, max_new_tokens=8, seed=seed, eos_token_id=None).tokens)


def test_engine_refuses_a_deterministic_policy_at_the_first_step():
    with pytest.raises(ValueError, match="drafting is 'deterministic'.*verifier 'sampling'"):
        _decoder("chain").generate(PROMPT, max_new_tokens=4, seed=0)


# ---------------------------------------------------------------------------- distribution
ALPHA = 1e-3  # pass iff p >= ALPHA; a broken variant must give p < ALPHA
SAMPLES = 20_000
V_DIST = 8
WARPS = {"T1.0": {}, "T0.7": {"temperature": 0.7}, "top_p0.9": {"top_p": 0.9}}
DIST_SHAPES = {"chain": ([-1, 0, 1], "iid"), "tree": ([-1, 0, 0, 0, 1, 1, 2], "without_replacement")}


def bonus_from_the_untouched_target(tree, probs, uniforms, tokens, draft_probs):
    """A WRONG variant (power test): right acceptance, but the bonus is drawn from the
    accepted node's original target row instead of its residual."""
    last, _ = traversal_accept_batch(tree, probs, uniforms, tokens, draft_probs)
    return last, inverse_cdf(probs[torch.arange(len(last)), last], uniforms[:, 0])


def iid_rule_on_any_tree(tree, probs, uniforms, tokens, draft_probs):
    """A WRONG variant (power test): the draft row is not renormalised after a rejected child
    drawn without replacement (the paper's (2) left out)."""
    return traversal_accept_batch(dataclasses.replace(tree, drafting="iid"), probs, uniforms, tokens, draft_probs)


def _first_two_counts(shape: str, warp: str, decide_batch=traversal_accept_batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Counts ``[V, V]`` of the first two emitted tokens over ``SAMPLES`` steps (a step that
    emits one token gets its second from the exact warped target after it) and the exact
    warped P(x1, x2) (transformers' own warpers)."""
    parents, mode = DIST_SHAPES[shape]
    tree, tokens, probs, q, target, gen = _sampled_trees(parents, SAMPLES, V_DIST, seed=21, mode=mode)
    options = make_plugin("verifiers", ("traversal", WARPS[warp])).options
    logits = probs.log()  # the tables' rows as logits (softmax gives them back)
    u = torch.rand(SAMPLES, len(tree), generator=gen, dtype=F64)
    last, bonus = decide_batch(tree, target_probs(logits, options), u, tokens, q)
    hf = lambda rows: hf_warped_probs(rows.log(), options.temperature, options.top_k, options.top_p)  # noqa: E731
    second = hf(target[1])
    anc, depth = tree.ancestor_mask(), tree.depths[last]
    draw = torch.arange(SAMPLES)
    at1, at2 = ((anc & (tree.depths == d)[None, :]).long().argmax(dim=1)[last] for d in (1, 2))
    x1 = torch.where(depth >= 1, tokens[draw, at1], bonus)
    drawn = inverse_cdf(second[x1], torch.rand(SAMPLES, generator=gen, dtype=F64))
    x2 = torch.where(depth >= 2, tokens[draw, at2], torch.where(depth == 1, bonus, drawn))
    counts = torch.bincount(x1 * V_DIST + x2, minlength=V_DIST * V_DIST).reshape(V_DIST, V_DIST)
    return counts, hf(target[0][None])[0][:, None] * second


def _p_value(counts: torch.Tensor, exact: torch.Tensor) -> tuple[float, float]:
    """Chi-square p-values of the first token and of the first two (zero cells must be empty)."""
    assert int(counts[exact == 0].sum()) == 0, "samples in zero-probability cells"
    marginal = {k: float(p) for k, p in enumerate(exact.sum(1).tolist()) if p > 0}
    first = chi_square_pvalue(dict(enumerate(counts.sum(1).tolist())), marginal)[0]
    cells = {k: int(c) for k, c in enumerate(counts.flatten().tolist())}
    both = chi_square_pvalue(cells, {k: float(p) for k, p in enumerate(exact.flatten().tolist()) if p > 0})[0]
    return first, both


@pytest.mark.statistical
@pytest.mark.parametrize("shape, warp", [(shape, warp) for shape in DIST_SHAPES for warp in WARPS])
def test_first_two_tokens_follow_the_target(shape, warp):
    counts, exact = _first_two_counts(shape, warp)
    first, both = _p_value(counts, exact)
    print(f"{shape} {warp}: first token p={first:.3g}, first two p={both:.3g}")
    assert first >= ALPHA and both >= ALPHA, (first, both)


@pytest.mark.statistical
@pytest.mark.parametrize("shape, broken", [("chain", bonus_from_the_untouched_target),
                                           ("tree", bonus_from_the_untouched_target), ("tree", iid_rule_on_any_tree)])
def test_statistic_rejects_broken_variants(shape, broken):
    counts, exact = _first_two_counts(shape, "T1.0", broken)
    first, both = _p_value(counts, exact)
    print(f"BROKEN {broken.__name__} {shape}: first token p={first:.3g}, first two p={both:.3g}")
    assert both < ALPHA, f"{broken.__name__} passed on the {shape}: p = {both:.3g}"
