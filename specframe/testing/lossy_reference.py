"""Obviously-correct host references for the lossy verifiers ``typical`` and ``margin``.

The fast verifiers (verifiers/typical.py, verifiers/margin.py) decide every node at once on the
device; these walk the tree from the root in plain Python, one node and one child at a time,
exactly as their module docstrings state the rules. Property tests hold the fast versions to
them (tests/test_lossy_verifiers.py), fed the same numbers: both draw through
:func:`specframe.verifiers.typical.lossy_inputs`, so from one generator state they see the same
target distribution and the same bonus uniform.

* :func:`typical_walk` / :func:`margin_walk`: the walks, returning a host
  :class:`~specframe.testing.reference.Verdict`;
* :class:`TypicalReferenceVerifier` / :class:`MarginReferenceVerifier`: those walks as verifier
  instances the engine can run (not registered; pass an instance). They read the device at every
  node, so they are slow on a GPU.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from specframe.testing.reference import Verdict, inverse_cdf_draw
from specframe.tree import DraftTree
from specframe.verifiers.margin import MarginOptions, MarginVerifier
from specframe.verifiers.typical import TypicalOptions, TypicalVerifier

#: ``test(row, token, is_argmax) -> bool``: whether a child passes at a node whose target row is ``row``.
ChildTest = Callable[[list[float], int, bool], bool]


def typical_walk(tree: DraftTree, probs: torch.Tensor, argmax: torch.Tensor, uniform: torch.Tensor | None,
                 options: TypicalOptions) -> Verdict:
    """Literal typical acceptance: at each node, a child passes when p(x) > min(epsilon, delta *
    exp(-H(p))) (or, at temperature 0, when it is the target's argmax); the walk takes the
    passing child of highest p (argmax first on a tie, then tree order)."""

    def passes(row: list[float], token: int, is_argmax: bool) -> bool:
        entropy = -sum(q * math.log(q) for q in row if q > 0)
        threshold = min(options.epsilon, options.delta * math.exp(-entropy))
        return row[token] > threshold or (options.temperature == 0 and is_argmax)

    return _walk(tree, probs, argmax, uniform, passes)


def margin_walk(tree: DraftTree, probs: torch.Tensor, argmax: torch.Tensor, uniform: torch.Tensor | None,
                options: MarginOptions) -> Verdict:
    """Literal margin rule: at each node, a child passes when p(x) >= ratio * max_t p(t); the walk
    takes the passing child of highest p (argmax first on a tie, then tree order)."""

    def passes(row: list[float], token: int, is_argmax: bool) -> bool:
        return row[token] >= options.ratio * max(row)

    return _walk(tree, probs, argmax, uniform, passes)


def _walk(tree: DraftTree, probs: torch.Tensor, argmax: torch.Tensor, uniform: torch.Tensor | None,
          passes: ChildTest) -> Verdict:
    """Walk from the root taking, at each node, the best passing child; the bonus token is the
    argmax at the last node (``uniform`` None) or an inverse-CDF draw from its row."""
    tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
    best_of = argmax.tolist()
    node, path = 0, [0]
    while True:
        row = [float(x) for x in probs[node].tolist()]
        passing = [child for child in range(len(tokens)) if parents[child] == node
                   and passes(row, tokens[child], tokens[child] == best_of[node])]
        if not passing:
            break
        # Highest target probability first; the argmax token on an exact tie; then tree order.
        node = min(passing, key=lambda child: (tokens[child] != best_of[node], -row[tokens[child]], child))
        path.append(node)
    bonus = best_of[node] if uniform is None else inverse_cdf_draw(row, float(uniform[0]))
    return Verdict(accepted_path=torch.tensor(path, dtype=torch.long), bonus_token=bonus)


class TypicalReferenceVerifier(TypicalVerifier):
    """The ``typical`` verifier running :func:`typical_walk` (same options and randomness)."""

    name = "typical-reference"

    def decide(self, tree: DraftTree, probs: torch.Tensor, argmax: torch.Tensor,
               uniform: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The same inputs as the fast verifier (its ``verify`` draws them), walked on the host."""
        return typical_walk(tree, probs, argmax, uniform, self.options).leaf(tree)


class MarginReferenceVerifier(MarginVerifier):
    """The ``margin`` verifier running :func:`margin_walk` (same options and randomness)."""

    name = "margin-reference"

    def decide(self, tree: DraftTree, probs: torch.Tensor, argmax: torch.Tensor,
               uniform: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The same inputs as the fast verifier (its ``verify`` draws them), walked on the host."""
        return margin_walk(tree, probs, argmax, uniform, self.options).leaf(tree)
