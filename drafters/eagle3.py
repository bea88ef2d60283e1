"""Drafter ``eagle3``: an EAGLE-3 head (fused low/mid/high target features, reduced draft vocabulary).

Same drafting loop as :mod:`drafters.eagle`; the head differs (see :mod:`drafters.eagle_head`):
the target features are the inputs of three target layers (``eagle_config.
eagle_aux_hidden_state_layer_ids``, default 2, L//2, L-3) concatenated and fused by ``fc``, and the
head's own ``lm_head`` covers a reduced draft vocabulary mapped to target ids through ``d2t``.
``expand`` still returns log-probs over the TARGET vocabulary (-inf outside the draft vocabulary).
"""

from __future__ import annotations

from typing import ClassVar

from .eagle import EagleDrafter, EagleOptions


class Eagle3Drafter(EagleDrafter):
    """EAGLE-3 head drafter: one batched head forward per tree layer, over its own KV cache."""

    name: ClassVar[str] = "eagle3"
    kind: ClassVar[str] = "eagle3"
    Options = EagleOptions
