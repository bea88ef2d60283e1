"""Exact reference distributions and a goodness-of-fit test for verifiers (the suite's statistics).

* :func:`emitted_distribution`: what one lossless verification of a fixed tree must emit;
* :func:`chi_square_pvalue`: Pearson's test with small cells pooled;
* :func:`hf_warped_probs`: transformers' sampling distribution (temperature, top-k, top-p);
* :class:`TreeSampler`: trees of a fixed shape whose children are drafted in one of the three
  drafting modes from fixed draft rows.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from specframe.tree import DraftTree


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


def hf_warped_scores(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """transformers' own warpers (Temperature, TopK, TopP) in generate()'s order: the reference
    semantics of the sampling verifier's warping."""
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
    return scores


def hf_warped_probs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """transformers' sampling distribution: the warped scores' softmax (float64)."""
    return torch.softmax(hf_warped_scores(logits, temperature, top_k, top_p).double(), dim=-1)


class TreeSampler:
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
