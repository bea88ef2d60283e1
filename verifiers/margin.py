"""Verifier ``margin``: a per-step probability-ratio rule, a LOSSY verifier (``lossless = False``).

The rule: a drafted token x at an accepted node is accepted when the target's probability of it
is within a factor ``ratio`` of the target's top token there::

    p(x) >= ratio * max_t p(t)

so a runner-up the target barely prefers less than its top choice is not rejected. Walking from
the root, each accepted node moves to its passing child of highest target probability (the
target's argmax token first on an exact tie, then the lower tree index); when no child passes
(or at a leaf) the walk stops. The bonus token at the last accepted node is the target's argmax
at ``temperature = 0``, else a sample from the warped target (one uniform, inverse CDF).
p is the target distribution warped by ``temperature``; at ``temperature = 0`` it is the
unwarped target (temperature 1), since a one-hot distribution would leave only the argmax.

``ratio = 1`` at temperature 0 accepts exactly the argmax children (up to exact probability ties
with the argmax): greedy verification. Any ``ratio`` accepts the argmax child whenever greedy
does and takes it first, so on the same tree and logits the accepted path is never shorter
than greedy's; a smaller ratio accepts more.

Source, honestly: this is a margin-style rule in the spirit of "Margins, Not Windows:
Training-Free Per-Step Lossy Speculative Decoding" (Urbán, Kwon, Venieris, Mascolo; arXiv
2609.02897, "AdaptiveSpec"), NOT a reimplementation of it. The paper's text could not be read
here; its abstract and a third-party summary describe a per-step margin rule that admits a
mismatched draft token when the ratio of the target's probability of it to the target's top-1
probability exceeds a threshold, alongside a per-step tree policy (not implemented here). The
paper's exact comparison, warping, default threshold and bonus rule are unknown to this code;
the default ``ratio = 0.5`` is this framework's choice. A related rule on logit margins between
the top candidates is MARS (arXiv 2601.15498).

Every node is decided at once on the device with the helpers shared with ``typical``
(verifiers/typical.py); the literal reference is
:func:`specframe.testing.lossy_reference.margin_walk` (tests/test_lossy_verifiers.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from specframe.options import require
from specframe.search_space import tunable
from specframe.tree import DraftTree
from specframe.verifiers.typical import LossyVerifier, check_temperature


@dataclass
class MarginOptions:
    """Options of the ``margin`` verifier.

    Attributes:
        ratio: in (0, 1]: a child passes when p(x) >= ratio * max_t p(t) at its parent
            (1.0 at temperature 0: greedy verification).
        temperature: target logits are divided by it (> 0) for the test and the bonus draw;
            0 (the default) tests the unwarped target and takes the argmax as bonus token, so
            the verifier is deterministic.
        seed: when set, the verifier owns a ``torch.Generator`` seeded with it (used only at
            temperature > 0); a generator passed by the engine takes precedence.
    """

    ratio: float = tunable(0.5, low=0.1, high=1.0)
    temperature: float = 0.0
    seed: int | None = None

    def __post_init__(self) -> None:
        require(math.isfinite(self.ratio) and 0.0 < self.ratio <= 1.0, "ratio",
                f"must be in (0, 1] (1.0 = greedy at temperature 0), got {self.ratio}")
        check_temperature(self.temperature)


def margin_passes(tree: DraftTree, probs: torch.Tensor, p: torch.Tensor, ratio: float) -> torch.Tensor:
    """``[n]`` bool: the node's token passes the margin test at its parent (False at the root)."""
    top = probs.max(dim=-1).values
    passes = p >= ratio * top[tree.parents.clamp(min=0).to(probs.device)]
    passes[0] = False
    return passes


class MarginVerifier(LossyVerifier):
    """Lossy: accept a drafted token whose target probability is within ``ratio`` of the top token's."""

    name = "margin"
    Options = MarginOptions

    def passes(self, tree: DraftTree, probs: torch.Tensor, p: torch.Tensor, is_argmax: torch.Tensor) -> torch.Tensor:
        """:func:`margin_passes` with this verifier's ``ratio``."""
        return margin_passes(tree, probs, p, self.options.ratio)
