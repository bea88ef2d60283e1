"""Verifier ``typical``: Medusa's typical acceptance, a LOSSY verifier (``lossless = False``).

Source: Medusa (Cai et al., arXiv 2401.10774, Sec. 3.3, "typical acceptance"). A drafted token x
at an accepted node is accepted when the target's probability of it, under the
temperature-warped target distribution p at that node, exceeds an entropy-dependent threshold::

    p(x) > min(epsilon, delta * exp(-H(p))),    H(p) = -sum_t p(t) log p(t)

A confident target (low entropy) asks for a high probability, an uncertain one accepts less
likely continuations. The emitted tokens are NOT distributed as the target's samples (hence
lossy): the rule trades fidelity for longer accepted paths, and that cost must be measured
(docs/verifiers.md).

What this verifier decides, exactly:

* Walk from the root. At an accepted node, the candidates are its children that pass the test;
  the walk moves to the passing child of highest target probability (Medusa's order), the
  target's argmax token first on an exact tie, then the lower tree index. When no child
  passes (or at a leaf) the walk stops there.
* Bonus token, drawn at the last accepted node: a sample from the warped target (one uniform
  from the generator, by inverse CDF); at ``temperature = 0`` the target's argmax.
* ``temperature = 0`` (the greedy variant, still lossy): a child passes when it carries the
  target's argmax OR its probability under the unwarped target (temperature 1: a one-hot
  distribution would leave no threshold to pass) exceeds the threshold. So it accepts at least
  the path greedy verification accepts, on the same tree and logits.

Where this differs from Medusa's released code (FasterDecoding/Medusa, ``evaluate_posterior``):
Medusa scores whole candidate paths (longest accepted prefix, ties by likelihood) where this
verifier walks node by node taking the most probable passing child; Medusa's entropy adds 1e-5
inside the log, this one is exact (``0 log 0 = 0``); and Medusa's code takes the base model's
argmax as the next token in its default ``fast`` mode, where this one samples it at
``temperature > 0``. Defaults follow Medusa's code: ``posterior_threshold = 0.09`` (epsilon)
and ``posterior_alpha = 0.3`` (delta, "recommended sqrt(posterior_threshold)").

Strictness: the threshold is at most epsilon and exp(-H) >= 1/V, so ``epsilon = 1`` with
``delta >= V`` sets it to 1 and nothing but (at temperature 0) the argmax passes: exactly
greedy. Smaller epsilon or delta loosen the rule (``delta = 0`` accepts any child of positive
probability).

Every node is decided at once on the device (no host reads): pass/fail per child, the best
passing child of each node (two ``scatter_reduce``), then the walk from the root with the
ancestor mask (:func:`specframe.verifiers.sampling._deepest_accepted`). The literal reference is
:func:`specframe.testing.lossy_reference.typical_walk` (tests/test_lossy_verifiers.py).

The helpers below :func:`lossy_inputs`, :func:`child_probs`, :func:`argmax_children`,
:func:`best_passing_child`, :func:`walk` and :func:`bonus_token` are shared with the ``margin``
verifier (verifiers/margin.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from specframe import rng
from specframe.interfaces import Verifier
from specframe.options import require
from specframe.search_space import tunable
from specframe.tree import DraftTree
from specframe.verifiers.sampling import _deepest_accepted, inverse_cdf, warp_logits


@dataclass
class TypicalOptions:
    """Options of the ``typical`` verifier (names follow Medusa's paper; Medusa's code calls
    epsilon ``posterior_threshold`` and delta ``posterior_alpha``).

    Attributes:
        epsilon: the threshold's cap, in (0, 1]: a child with p(x) > epsilon always passes.
        delta: scale of the entropy term, >= 0: the threshold is min(epsilon, delta * exp(-H)).
            Medusa recommends sqrt(epsilon) (0.3 for the default 0.09).
        temperature: target logits are divided by it (> 0); 0 is the greedy variant (argmax
            children always pass, the threshold is tested under the unwarped target, the bonus
            token is the argmax).
        seed: when set, the verifier owns a ``torch.Generator`` seeded with it; a generator
            passed by the engine takes precedence.
    """

    epsilon: float = tunable(0.09, low=0.01, high=1.0, log=True)
    delta: float = tunable(0.3, low=0.0, high=1.0)
    temperature: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        require(math.isfinite(self.epsilon) and 0.0 < self.epsilon <= 1.0, "epsilon",
                f"must be in (0, 1], got {self.epsilon}")
        require(math.isfinite(self.delta) and self.delta >= 0.0, "delta",
                f"must be a finite number >= 0, got {self.delta}")
        check_temperature(self.temperature)


def check_temperature(temperature: float) -> None:
    """Raise an :class:`~specframe.options.OptionError` unless ``temperature`` is finite and >= 0."""
    require(math.isfinite(temperature) and temperature >= 0.0, "temperature",
            f"must be a finite number >= 0 (0 = the greedy variant), got {temperature}")


# ---------------------------------------------------------------------------- shared pieces
def lossy_inputs(
    target_logits: torch.Tensor, temperature: float, generator: torch.Generator | None, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """What a lossy verification decides from, on ``device``: the target distribution ``[n, V]``
    (float64; warped by ``temperature``, or unwarped at temperature 0, where the rules still
    need a distribution to threshold), the target's argmax ``[n]`` and, at ``temperature > 0``,
    one uniform ``[1]`` for the bonus token (None at 0: nothing random is drawn). The fast
    verifiers and their references draw through this, so from one generator state they see the
    same numbers."""
    warped = warp_logits(target_logits, temperature) if temperature > 0 else target_logits
    probs = torch.softmax(warped.to(torch.float64), dim=-1).to(device)
    # max(dim).indices: the first maximal index, greedy_leaf's tie rule (and its speed).
    argmax = target_logits.max(dim=-1).indices.to(device)
    uniform = rng.uniforms(1, generator, device) if temperature > 0 else None
    return probs, argmax, uniform


def child_probs(tree: DraftTree, probs: torch.Tensor) -> torch.Tensor:
    """``[n]`` float64: the target's probability of each node's token at its parent (0 at the root)."""
    p = torch.zeros(len(tree), dtype=probs.dtype, device=probs.device)
    p[1:] = probs[tree.parents[1:], tree.tokens[1:]]  # the root's token is never looked up
    return p


def argmax_children(tree: DraftTree, argmax: torch.Tensor) -> torch.Tensor:
    """``[n]`` bool: the node carries the target's argmax at its parent (False at the root)."""
    hit = tree.tokens == argmax[tree.parents.clamp(min=0)]
    hit[0] = False
    return hit


def best_passing_child(tree: DraftTree, passes: torch.Tensor, p: torch.Tensor, is_argmax: torch.Tensor) -> torch.Tensor:
    """``[n]`` the child each node accepts (-1: none): among its children that pass, the one of
    highest target probability ``p``; on an exact tie the target's argmax token, then the lower
    node index. Decided for every node at once (no host reads)."""
    n = len(tree)
    device = p.device
    if n == 1:
        return torch.full((1,), -1, dtype=torch.long, device=device)
    # The argmax child ranks first among passing children: p <= 1 < 2. It has the highest p
    # anyway; the rank only settles exact ties the way greedy verification does.
    priority = torch.where(is_argmax, torch.full_like(p, 2.0), p)[1:]
    parents, kids, ok = tree.parents[1:].to(device), torch.arange(1, n, device=device), passes[1:]
    ranked = torch.where(ok, priority, -math.inf)
    best = torch.full((n,), -math.inf, dtype=priority.dtype, device=device)
    best = best.scatter_reduce(0, parents, ranked, reduce="amax")
    winner = ok & (priority == best[parents])
    first = torch.full((n,), n, dtype=torch.long, device=device)
    first = first.scatter_reduce(0, parents, torch.where(winner, kids, n), reduce="amin")
    return torch.where(first < n, first, -1)


def walk(tree: DraftTree, accepted_child: torch.Tensor) -> torch.Tensor:
    """0-dim: the deepest node whose root path follows accepted children only (the walk's end)."""
    return _deepest_accepted(tree, tree.parents.to(accepted_child.device), accepted_child[None])[0]


def bonus_token(probs: torch.Tensor, argmax: torch.Tensor, last: torch.Tensor, uniform: torch.Tensor | None) -> torch.Tensor:
    """0-dim: the target's argmax at ``last`` when ``uniform`` is None (temperature 0), else an
    inverse-CDF draw from the target row of ``last``."""
    if uniform is None:
        return argmax[last]
    return inverse_cdf(probs.index_select(0, last.reshape(1)), uniform)[0]


# ---------------------------------------------------------------------------- decision
def typical_passes(tree: DraftTree, probs: torch.Tensor, p: torch.Tensor, is_argmax: torch.Tensor,
                   options: TypicalOptions) -> torch.Tensor:
    """``[n]`` bool: the node's token passes the typical test at its parent (False at the root)."""
    entropy = -torch.special.xlogy(probs, probs).sum(dim=-1)  # xlogy: 0 log 0 = 0
    threshold = torch.clamp(options.delta * torch.exp(-entropy), max=options.epsilon)
    passes = p > threshold[tree.parents.clamp(min=0).to(probs.device)]
    if options.temperature == 0:
        passes = passes | is_argmax
    passes[0] = False
    return passes


# ---------------------------------------------------------------------------- plugin
class LossyVerifier(Verifier):
    """What ``typical`` and ``margin`` share: a generator from ``seed``, the device-side inputs
    (:func:`lossy_inputs`) and the root-down walk; a subclass supplies :meth:`decide`."""

    lossless = False
    # A temperature option and a sampled bonus above 0, so generate(temperature=...) may
    # override it (at 0 the engine switches to the lossless greedy verifier).
    sampling = True

    def __init__(self, options: Any) -> None:
        super().__init__(options)
        self.generator = None if options.seed is None else torch.Generator().manual_seed(int(options.seed))

    def passes(self, tree: DraftTree, probs: torch.Tensor, p: torch.Tensor, is_argmax: torch.Tensor) -> torch.Tensor:
        """``[n]`` bool: the node's token passes this rule at its parent (False at the root).
        ``p``: each node's target probability at its parent; ``is_argmax``: whether it is the
        parent's argmax."""
        raise NotImplementedError

    def decide(self, tree: DraftTree, probs: torch.Tensor, argmax: torch.Tensor,
               uniform: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(last, bonus)`` from :func:`lossy_inputs`' numbers: walk from the root through the
        best passing child (:meth:`passes`), then the bonus at the last accepted node."""
        p, is_argmax = child_probs(tree, probs), argmax_children(tree, argmax)
        last = walk(tree, best_passing_child(tree, self.passes(tree, probs, p, is_argmax), p, is_argmax))
        return last, bonus_token(probs, argmax, last, uniform)

    def verify(
        self, tree: DraftTree, target_logits: torch.Tensor, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Decide every node at once on the device; randomness (the bonus draw at temperature
        > 0): ``generator`` if given, else the verifier's own (``seed``), else torch's global one."""
        gen = generator if generator is not None else self.generator
        probs, argmax, uniform = lossy_inputs(target_logits, self.options.temperature, gen, tree.device)
        return self.decide(tree, probs, argmax, uniform)


class TypicalVerifier(LossyVerifier):
    """Lossy: Medusa's typical acceptance (entropy-adaptive probability threshold)."""

    name = "typical"
    Options = TypicalOptions

    def passes(self, tree: DraftTree, probs: torch.Tensor, p: torch.Tensor, is_argmax: torch.Tensor) -> torch.Tensor:
        """:func:`typical_passes` with this verifier's options."""
        return typical_passes(tree, probs, p, is_argmax, self.options)
