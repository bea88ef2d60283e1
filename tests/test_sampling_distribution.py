"""Losslessness in distribution: speculative sampling emits the warped target's distribution.

Two levels, both compared with the EXACT distribution of the first two generated tokens,
computed by enumeration (V = 12, so 144 cells) with transformers' own warpers:

* Verifier level (20,000 samples per case): model-free target and drafter (SyntheticDrafters:
  rows are pure functions of the token path, float64), every registered policy x drafting mode
  x warping (temperature 1.0, temperature 0.7, top-p 0.9). Each sample builds a tree (a fresh
  one for policies that sample children) and verifies it with the real decision code
  (``sample_accept_batch``, the same function ``SamplingVerifier.verify`` runs with S = 1). If a
  step emits one token, the second comes from the exact target conditional: this tests the
  step itself, which is what composes into lossless generation.
* Engine level (fewer samples, slower): ``SpecDecoder.generate(max_new_tokens=2)`` on tiny
  transformers models, first two tokens against the target model's exact distribution.

Test statistic: Pearson chi-square over the 144 cells, cells with expected count < 5 pooled;
p-value from the chi-square survival function. A case passes when p >= ALPHA = 1e-3 (and no
sample falls in a zero-probability cell); every case runs at a fixed seed, so the outcome is
deterministic. Power: the same statistic must REJECT (p < ALPHA) deliberately broken verifiers:
one that tests children correctly but never updates the residual (the classic bug class; at
both levels), and one that applies the i.i.d. rule to children drawn without replacement.
(Applying the deterministic rule to sampled children is NOT a bug: "draw y from R, accept the
child equal to y" is lossless for any tree drawn independently of y, just accepts less.)
"""

from __future__ import annotations

import dataclasses
import zlib
from functools import lru_cache

import pytest
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

import specframe
from specframe.decode.engine import make_plugin
from specframe.testing.models import perturbed_copy, tiny_model
from specframe.testing.synthetic import SyntheticDrafter, make_session, paths_of
from specframe.verifiers.sampling import SamplingVerifier, sample_accept_batch, sampling_inputs, target_probs

pytestmark = pytest.mark.statistical

ALPHA = 1e-3  # pass iff the chi-square p-value is >= ALPHA; the broken verifier must give < ALPHA
SAMPLES = 20_000
#: Engine-level samples per case. A verifier without the residual update gives p far below ALPHA at
#: this size (p = 3.7e-20, printed by test_engine_statistic_rejects_a_verifier_without_residual_update).
E2E_SAMPLES = 1_000
V = 12
ROOT = 3
BUDGET = 16  # trees are built with at most this many nodes (keeps deterministic policies small)

WARPS = {
    "T1.0": {"temperature": 1.0},
    "T0.7": {"temperature": 0.7},
    "top_p0.9": {"temperature": 1.0, "top_p": 0.9},
}

#: Smaller shapes than the defaults where a policy builds a fresh tree per sample (cost).
OPTIONS = {"sampled-tree": {"k": 3, "depth": 2}}
CHAIN_SAMPLE = ("chain", {"sample": True, "gamma": 2})  # i.i.d. children: Leviathan's chain
MERGED_IID = ("sampled-tree", {"k": 3, "depth": 2, "replacement": True})  # i.i.d. draws, merged


def _arms() -> list[tuple[str, dict]]:
    """Every registered policy with its default options (smaller for sampled-tree), plus
    chain with sample=True so that every drafting mode is covered."""
    names = specframe.get_registry().names("policies")
    return [(name, OPTIONS.get(name, {})) for name in names] + [CHAIN_SAMPLE]


def _arm_id(arm) -> str:
    name, options = arm
    return name + "".join(f"-{k}={v}" for k, v in sorted(options.items()) if k not in OPTIONS.get(name, {}))


#: Every arm at every warp, plus the merged-i.i.d. variant of sampled-tree at one warp.
CASES = [(arm, warp) for arm in _arms() for warp in WARPS] + [(MERGED_IID, "T1.0")]


# ---------------------------------------------------------------------------- synthetic models
TARGET = SyntheticDrafter(V, temperature=0.6, seed=101, dtype=torch.float64)
NOISE = SyntheticDrafter(V, temperature=1.0, seed=202, dtype=torch.float64)
#: The draft: the target's log-probs blurred and perturbed, so it agrees often but not always.
DRAFT = SyntheticDrafter(V, source=lambda path: 0.8 * TARGET.row(path) + 0.7 * NOISE.row(path), dtype=torch.float64)


def hf_probs(logits: torch.Tensor, warp: dict) -> torch.Tensor:
    """The target distribution transformers' generate(do_sample=True, ...) samples from."""
    scores = logits.to(torch.float64)[None]
    if warp.get("temperature", 1.0) != 1.0:
        scores = TemperatureLogitsWarper(warp["temperature"])(None, scores)
    if warp.get("top_p", 1.0) < 1.0:
        scores = TopPLogitsWarper(warp["top_p"])(None, scores)
    return torch.softmax(scores[0], dim=-1)


def exact_two_tokens(row_of, warp: dict) -> torch.Tensor:
    """``[V, V]`` exact P(x1, x2) by enumeration; ``row_of(path)`` gives target logits."""
    first = hf_probs(row_of((ROOT,)), warp)
    second = torch.stack([hf_probs(row_of((ROOT, x)), warp) for x in range(V)])
    return first[:, None] * second


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, float, float]:
    """``(statistic, p-value, total variation)`` of observed ``counts`` against ``probs``.

    Cells whose expected count is below 5 are pooled (smallest first) into one bin of >= 5.
    Zero-probability cells must be empty (asserted by the caller), so they are left out.
    """
    counts, probs = counts.flatten().double(), probs.flatten().double()
    total = float(counts.sum())
    positive = probs > 0
    expected, observed = probs[positive] * total, counts[positive]
    order = torch.argsort(expected)
    expected, observed = expected[order], observed[order]
    pool = int((expected < 5).sum())
    while pool < len(expected) and 0 < float(expected[:pool].sum()) < 5:
        pool += 1  # the pooled bin itself must expect >= 5
    obs = torch.cat([observed[:pool].sum()[None], observed[pool:]]) if pool else observed
    exp = torch.cat([expected[:pool].sum()[None], expected[pool:]]) if pool else expected
    stat = float(((obs - exp) ** 2 / exp).sum())
    dof = len(obs) - 1
    p_value = float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64),
                                            torch.tensor(stat / 2.0, dtype=torch.float64)))
    tv = 0.5 * float((counts / total - probs).abs().sum())
    return stat, p_value, tv


def _seed(*parts) -> int:
    return zlib.crc32("/".join(map(str, parts)).encode())


# ---------------------------------------------------------------------------- verifier level
def _tree_logits(tree) -> torch.Tensor:
    return torch.stack([TARGET.row(p) for p in paths_of(tree, range(len(tree)))])


@lru_cache(maxsize=None)
def _drafted(name: str, options: tuple) -> list[tuple]:
    """Drafted trees as ``(tree, tokens [S, n], target logits [S, n, V], q [S, n, V] | None)``
    groups of one topology each (compact tensors: 20,000 live DraftTrees would slow the GC).

    Deterministic policies give one tree, verified ``SAMPLES`` times; others draft ``SAMPLES``
    trees afresh with the policy's own (seeded) build. Shared by the warps, since drafting does
    not depend on the target's warping; each case still draws fresh uniforms."""
    policy = make_plugin("policies", (name, dict(options)))
    gen = torch.Generator().manual_seed(_seed("draft", name, options))
    budget = min(BUDGET, policy.max_budget)
    first = policy.build(make_session(DRAFT, ROOT, generator=gen), budget)
    if first.drafting == "deterministic":
        tokens = first.tokens.expand(SAMPLES, -1)
        return [(first, tokens, _tree_logits(first).expand(SAMPLES, -1, -1), None)]
    groups: dict[tuple, list] = {}
    for i in range(SAMPLES):
        tree = first if i == 0 else policy.build(make_session(DRAFT, ROOT, generator=gen), budget)
        groups.setdefault(tuple(tree.parents.tolist()), []).append((tree, _tree_logits(tree)))
    return [
        (members[0][0], torch.stack([t.tokens for t, _ in members]), torch.stack([lg for _, lg in members]),
         torch.stack([t.draft_probs for t, _ in members]))
        for members in groups.values()
    ]


def _first_two(tree, tokens: torch.Tensor, last: torch.Tensor, bonus: torch.Tensor):
    """``(x1, x2, known)`` per draw (``tokens`` [S, n]): emitted tokens 1 and 2; ``known`` is False
    when the step emitted one token (x2 then comes from the exact target conditional)."""
    anc = tree.ancestor_mask()
    draw = torch.arange(len(last))
    at = [(anc & (tree.depths == d)[None, :]).long().argmax(dim=1)[last] for d in (1, 2)]
    d = tree.depths[last]
    x1 = torch.where(d >= 1, tokens[draw, at[0]], bonus)
    x2 = torch.where(d >= 2, tokens[draw, at[1]], bonus)
    return x1, x2, d >= 1


def broken_decide(tree, probs, uniforms, tokens=None, draft_probs=None):
    """A WRONG verifier (kept for the power test): each child is tested with the right
    probability (R(c) for deterministic children, min(1, R(c)/q(c)) for sampled ones), but a
    rejection never updates the residual, so the bonus comes from the unmodified target.
    Same calling convention as ``sample_accept_batch``."""
    samples, n = uniforms.shape
    tokens = tree.tokens.expand(samples, n) if tokens is None else tokens
    probs = probs.expand(samples, n, V)
    sampled = tree.drafting != "deterministic"
    q = (tree.draft_probs.expand(samples, n, V) if draft_probs is None else draft_probs) if sampled else None
    parents = tree.parents.tolist()
    children = {u: [i for i in range(n) if parents[i] == u] for u in range(n)}
    lasts, bonuses = [], []
    for s in range(samples):
        toks, u, p = tokens[s].tolist(), uniforms[s].tolist(), probs[s].tolist()
        node = 0
        while True:
            nxt = None
            for child in children[node]:
                c = toks[child]
                chance = min(1.0, p[node][c] / q[s, node, c].item()) if sampled else p[node][c]
                if u[child] < chance:
                    nxt = child
                    break
            if nxt is None:
                break
            node = nxt
        cdf = probs[s, node].cumsum(0)
        lasts.append(node)
        bonuses.append(min(int(torch.searchsorted(cdf, u[0] * cdf[-1], right=True)), V - 1))
    return torch.tensor(lasts), torch.tensor(bonuses)


def run_verifier_case(arm, warp_name: str, decide=sample_accept_batch):
    """Counts ``[V, V]`` of the first two tokens over ``SAMPLES`` speculative steps, the exact
    distribution, and the drafting mode."""
    name, options = arm
    warp = WARPS[warp_name]
    verifier_options = make_plugin("verifiers", ("sampling", warp)).options
    gen = torch.Generator().manual_seed(_seed("verify", name, sorted(options.items()), warp_name))
    drafted = _drafted(name, tuple(sorted(options.items())))
    second_exact = torch.stack([hf_probs(TARGET.row((ROOT, x)), warp) for x in range(V)]).cumsum(-1)
    counts = torch.zeros(V, V, dtype=torch.long)
    for tree, tokens, logits, q in drafted:
        uniforms = torch.rand(len(tokens), len(tree), generator=gen, dtype=torch.float64)
        last, bonus = decide(tree, target_probs(logits, verifier_options), uniforms, tokens, q)
        x1, x2, known = _first_two(tree, tokens, last, bonus)
        u = torch.rand(len(last), generator=gen, dtype=torch.float64)
        rows = second_exact[x1]
        drawn = torch.searchsorted(rows, (u * rows[:, -1])[:, None], right=True)[:, 0].clamp(max=V - 1)
        counts += torch.bincount(x1 * V + torch.where(known, x2, drawn), minlength=V * V).reshape(V, V)
    return counts, exact_two_tokens(TARGET.row, warp), drafted[0][0].drafting


def _check(counts, exact, label):
    assert int(counts.sum()) == SAMPLES or label.startswith("engine")
    assert int(counts[exact == 0].sum()) == 0, f"{label}: samples in zero-probability cells"
    stat, p_value, tv = chi_square(counts, exact)
    print(f"{label}: chi2={stat:.1f} p={p_value:.3g} TV={tv:.4f} n={int(counts.sum())}")
    return p_value


@pytest.mark.parametrize("arm, warp_name", CASES, ids=[f"{_arm_id(a)}-{w}" for a, w in CASES])
def test_verifier_keeps_the_target_distribution(arm, warp_name):
    counts, exact, mode = run_verifier_case(arm, warp_name)
    p_value = _check(counts, exact, f"{_arm_id(arm)} [{mode}] {warp_name}")
    assert p_value >= ALPHA, f"{_arm_id(arm)} ({mode}) at {warp_name}: chi-square p = {p_value:.3g} < {ALPHA}"


def test_every_drafting_mode_is_covered():
    modes = {make_plugin("policies", arm).build(make_session(DRAFT, ROOT), BUDGET).drafting for arm in _arms()}
    assert modes == {"deterministic", "iid", "without_replacement"}


def iid_rule_on_any_tree(tree, probs, uniforms, tokens=None, draft_probs=None):
    """A WRONG verifier (kept for the power test): mode confusion, the i.i.d. rule applied to
    children drawn without replacement (q is never renormalised after a rejected child)."""
    return sample_accept_batch(dataclasses.replace(tree, drafting="iid"), probs, uniforms, tokens, draft_probs)


SAMPLED_TREE = ("sampled-tree", OPTIONS["sampled-tree"])
POWER_CASES = (
    [(("chain", {}), w, broken_decide) for w in WARPS] + [(("talon", {}), w, broken_decide) for w in WARPS]
    + [(CHAIN_SAMPLE, "T1.0", broken_decide), (SAMPLED_TREE, "T0.7", broken_decide)]
    + [(SAMPLED_TREE, w, iid_rule_on_any_tree) for w in ("T1.0", "top_p0.9")]
)


@pytest.mark.parametrize("arm, warp_name, broken", POWER_CASES,
                         ids=[f"{b.__name__}-{_arm_id(a)}-{w}" for a, w, b in POWER_CASES])
def test_statistic_rejects_broken_verifiers(arm, warp_name, broken):
    counts, exact, mode = run_verifier_case(arm, warp_name, decide=broken)
    stat, p_value, tv = chi_square(counts, exact)
    print(f"BROKEN {broken.__name__} {_arm_id(arm)} [{mode}] {warp_name}: chi2={stat:.1f} p={p_value:.3g} TV={tv:.4f}")
    assert p_value < ALPHA, f"{broken.__name__} passed ({_arm_id(arm)}, {warp_name}): p = {p_value:.3g}"


# ---------------------------------------------------------------------------- engine level
@lru_cache(maxsize=None)
def _models():
    target = tiny_model("llama", seed=7, vocab_size=V, hidden=16, layers=1, init_std=0.5)
    return target, perturbed_copy(target, 0.5, seed=8)


PROMPT = (5, ROOT)


def _model_row(path: tuple) -> torch.Tensor:
    target, _ = _models()
    ids = torch.tensor([list(PROMPT[:-1]) + list(path)])
    with torch.no_grad():
        return target(ids).logits[0, -1]


E2E_CASES = [
    (CHAIN_SAMPLE, "T0.7"),
    (("sampled-tree", {"k": 2, "depth": 2}), "top_p0.9"),
    (("talon", {"budget": 10}), "T1.0"),
]


class NoResidualVerifier(SamplingVerifier):
    """``broken_decide`` inside the engine (for the engine-level power test)."""

    def verify(self, tree, target_logits, generator=None):
        gen = generator if generator is not None else self.generator
        probs, uniforms = sampling_inputs(tree, target_logits, self.options, gen)
        last, bonus = broken_decide(tree, probs, uniforms[None])
        return last[0].to(tree.device), bonus[0].to(tree.device)


def _drafter(name: str, target, draft):
    """The engine-level cases' drafter: a draft model, or one that needs none."""
    if name == "model":
        return ("model", {"model": draft})
    if name == "layerskip":  # the target drafting for itself with its (only) layer's MLP skipped
        return ("layerskip", {"attn_skip": [False], "mlp_skip": [True]})
    if name == "hydra":  # random grounded heads, built as the conformance suite builds them
        from specframe.testing.fixtures import BUILTIN_DRAFTER_FACTORIES

        return BUILTIN_DRAFTER_FACTORIES["specframe.drafters.hydra:HydraDrafter"](specframe.TargetModel(target))
    raise ValueError(f"no engine-level case for drafter {name!r}")


def run_engine_case(arm, warp_name: str, verifier=None, drafter: str = "model", samples: int = E2E_SAMPLES):
    """Counts ``[V, V]`` of ``generate(max_new_tokens=2)`` over ``samples`` calls, and the
    number of accepted draft tokens."""
    target, draft = _models()
    warp = WARPS[warp_name]
    dec = specframe.SpecDecoder.build(target=target, drafter=_drafter(drafter, target, draft), policy=arm,
                                      verifier=verifier or ("sampling", warp))
    salt = () if drafter == "model" else (drafter,)
    gen = torch.Generator().manual_seed(_seed("e2e", arm[0], warp_name, *salt))
    counts = torch.zeros(V, V, dtype=torch.long)
    accepted = 0
    for _ in range(samples):
        out = dec.generate(list(PROMPT), max_new_tokens=2, eos_token_id=None, generator=gen)
        counts[out.tokens[0], out.tokens[1]] += 1
        accepted += out.steps[0].accepted
    return counts, accepted


@pytest.mark.parametrize("arm, warp_name", E2E_CASES, ids=[f"{_arm_id(a)}-{w}" for a, w in E2E_CASES])
def test_engine_first_two_tokens_follow_the_target(arm, warp_name):
    counts, accepted = run_engine_case(arm, warp_name)
    p_value = _check(counts, exact_two_tokens(_model_row, WARPS[warp_name]), f"engine {_arm_id(arm)} {warp_name}")
    assert accepted > E2E_SAMPLES // 10, "drafts are almost never accepted: the case would not test acceptance"
    assert p_value >= ALPHA, f"engine {_arm_id(arm)} at {warp_name}: chi-square p = {p_value:.3g} < {ALPHA}"


#: Drafters without a draft model, at the engine level: the target drafting for itself
#: (``layerskip``; under the i.i.d. chain its own rows are the q the verifier divides by) and
#: Hydra's heads, at the draft-model cases' samples.
DRAFTER_SAMPLES = E2E_SAMPLES
DRAFTER_CASES = [
    ("layerskip", CHAIN_SAMPLE, "T0.7"),
    ("layerskip", ("talon", {"budget": 10}), "T1.0"),
    ("hydra", ("talon", {"budget": 10}), "top_p0.9"),
]


@pytest.mark.parametrize("drafter, arm, warp_name", DRAFTER_CASES,
                         ids=[f"{d}-{_arm_id(a)}-{w}" for d, a, w in DRAFTER_CASES])
def test_engine_first_two_tokens_follow_the_target_for_self_drafting_and_hydra(drafter, arm, warp_name):
    counts, accepted = run_engine_case(arm, warp_name, drafter=drafter, samples=DRAFTER_SAMPLES)
    p_value = _check(counts, exact_two_tokens(_model_row, WARPS[warp_name]), f"engine {drafter} {_arm_id(arm)} {warp_name}")
    assert accepted > DRAFTER_SAMPLES // 10, "drafts are almost never accepted: the case would not test acceptance"
    assert p_value >= ALPHA, f"engine {drafter} {_arm_id(arm)} at {warp_name}: chi-square p = {p_value:.3g} < {ALPHA}"


def test_engine_statistic_rejects_a_verifier_without_residual_update():
    arm, warp_name = ("talon", {"budget": 10}), "T1.0"
    options = make_plugin("verifiers", ("sampling", WARPS[warp_name])).options
    counts, _ = run_engine_case(arm, warp_name, verifier=NoResidualVerifier(options))
    stat, p_value, tv = chi_square(counts, exact_two_tokens(_model_row, WARPS[warp_name]))
    print(f"BROKEN engine {_arm_id(arm)} {warp_name}: chi2={stat:.1f} p={p_value:.3g} TV={tv:.4f}")
    assert p_value < ALPHA, f"the broken verifier passed the engine-level test: p = {p_value:.3g}"
