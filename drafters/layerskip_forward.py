"""The target's own decoder, run layer by layer with some sublayers skipped (self-speculation).

A :class:`SkipPlan` names the attention and MLP sublayers a draft forward leaves out. A skipped
sublayer leaves the residual stream unchanged and writes no KV: the forward is
``embed -> for each layer: [h += attn(norm(h))] [h += mlp(norm(h))] -> norm -> lm_head`` with
the bracketed parts present only for kept sublayers. Early exit after ``E`` layers is the plan
that skips both sublayers of every layer from ``E`` on (the final norm and LM head are shared).

The model is never patched: the runner calls the HF modules (``embed_tokens``, each layer's
``input_layernorm`` / ``self_attn`` / ``post_attention_layernorm`` / ``mlp``, ``norm``,
``rotary_emb``, ``lm_head``) of a Llama-family decoder directly, and hands ``self_attn`` a
:class:`StepKV`, which answers ``update`` with the context's K/V followed by this step's draft
rows, so no cache of the target is written.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Sequence

import numpy
import torch

#: Named skip sets (each keeps at least one layer): which layers' attention and MLP a preset skips.
PRESETS = ("odd", "even", "first-last-kept", "second-half", "none", "random")


@dataclass(frozen=True)
class SkipPlan:
    """The sublayers a draft forward skips (layer indices, 0-based).

    Attributes:
        attn: layers whose attention sublayer is skipped.
        mlp: layers whose MLP sublayer is skipped.
    """

    attn: frozenset[int]
    mlp: frozenset[int]

    @classmethod
    def from_lists(cls, attn: Sequence[int], mlp: Sequence[int]) -> "SkipPlan":
        """A plan from two index lists."""
        return cls(frozenset(int(i) for i in attn), frozenset(int(i) for i in mlp))

    @classmethod
    def exit_after(cls, exit_layer: int, layers: int) -> "SkipPlan":
        """Early exit: layers ``[0, exit_layer)`` run in full, every later sublayer is skipped."""
        rest = frozenset(range(exit_layer, layers))
        return cls(rest, rest)

    def as_booleans(self, layers: int) -> tuple[list[bool], list[bool]]:
        """Per-layer booleans (True: skipped), attention then MLP."""
        return [i in self.attn for i in range(layers)], [i in self.mlp for i in range(layers)]

    def kept_layers(self, layers: int) -> int:
        """How many layers run at least one sublayer (a rough share of a full forward's time)."""
        return sum(1 for i in range(layers) if i not in self.attn or i not in self.mlp)


def preset_plan(name: str, layers: int, ratio: float = 0.5, seed: int = 0) -> SkipPlan:
    """The skip set a preset names over ``layers`` decoder layers (both sublayers alike).

    ``odd``: layers 1, 3, 5, ...; ``even``: 2, 4, ... (layer 0 kept); ``first-last-kept``: every
    layer but the first and the last; ``second-half``: the upper half; ``none``: nothing;
    ``random``: ``int(ratio * 2 (layers - 2))`` of the inner sublayers, drawn with ``seed``
    (SWIFT's random draw, first and last layer kept). ValueError names a bad preset."""
    inner = range(1, layers - 1)
    if name == "odd":  # SWIFT's initial set: np.arange(1, layers - 1, 2)
        skip = list(range(1, layers - 1, 2))
    elif name == "even":
        skip = list(range(2, layers - 1, 2))
    elif name == "first-last-kept":
        skip = list(inner)
    elif name == "second-half":
        skip = list(range(layers - layers // 2, layers))
    elif name == "none":
        skip = []
    elif name == "random":
        attn, mlp = random_sets(layers, ratio, numpy.random.RandomState(seed))
        return SkipPlan.from_lists(attn, mlp)
    else:
        raise ValueError(f"skip preset {name!r} is not one of {PRESETS}")
    return SkipPlan.from_lists(skip, skip)


def random_sets(layers: int, ratio: float, rng: "numpy.random.RandomState") -> tuple[list[int], list[int]]:
    """``int(ratio * 2 (layers - 2))`` inner sublayers (first and last layer kept), drawn from
    ``rng`` as SWIFT's ``layer_random_search`` draws them (``choice(2 (layers - 2), count,
    replace=False)``; slots ``0 .. layers - 3`` are attention layers ``1 .. layers - 2``, the rest
    MLP layers): (attention layers, MLP layers), each sorted."""
    inner = 2 * max(layers - 2, 0)
    count = min(inner, int(inner * ratio))
    picked = set(rng.choice(inner, count, replace=False).tolist()) if count else set()
    attn = sorted(i + 1 for i in picked if i < layers - 2)
    mlp = sorted(i - (layers - 2) + 1 for i in picked if i >= layers - 2)
    return attn, mlp


class StepKV:
    """What ``self_attn`` is handed as its cache in a draft forward.

    ``context[i]``: layer ``i``'s K/V of the committed context (read-only: the target's cache or
    the drafter's own), ``None`` when empty. ``rows[i]``: this step's draft rows of layer ``i``,
    extended by each ``update``; they are thrown away when the step ends.
    """

    def __init__(self, context: Sequence[tuple[torch.Tensor, torch.Tensor] | None],
                 rows: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.context = context
        self.rows = rows

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Append the new keys/values to the step's rows; return context + rows."""
        old = self.rows.get(layer_idx)
        if old is not None:
            key_states = torch.cat([old[0], key_states], dim=-2)
            value_states = torch.cat([old[1], value_states], dim=-2)
        self.rows[layer_idx] = (key_states, value_states)
        ctx = self.context[layer_idx] if layer_idx < len(self.context) else None
        if ctx is None:
            return key_states, value_states
        return torch.cat([ctx[0], key_states], dim=-2), torch.cat([ctx[1], value_states], dim=-2)


class LayerRunner:
    """Runs a Llama-family causal LM's decoder under a :class:`SkipPlan`.

    Raises ``ValueError`` naming what is missing for a model without the Llama layout
    (``model.model.layers`` with ``input_layernorm`` / ``self_attn`` / ``post_attention_layernorm``
    / ``mlp``, ``norm``, ``rotary_emb``, ``lm_head``)."""

    def __init__(self, model: Any, attn_implementation: str) -> None:
        self.model = model
        decoder = getattr(model, "model", None)
        needed = ("embed_tokens", "layers", "norm", "rotary_emb")
        missing = [n for n in needed if not hasattr(decoder, n)] + ([] if hasattr(model, "lm_head") else ["lm_head"])
        if missing:
            raise ValueError(f"drafter 'layerskip' runs Llama-family decoders (model.model.layers, ...); "
                             f"{type(model).__name__} lacks {missing}")
        self.decoder = decoder
        self.layers = list(decoder.layers)
        self.eager = attn_implementation == "eager"
        params = inspect.signature(self.layers[0].self_attn.forward).parameters
        self.cache_kw = next((n for n in ("cache", "past_key_values", "past_key_value") if n in params), "cache")

    @property
    def num_layers(self) -> int:
        """Decoder layers of the model."""
        return len(self.layers)

    def _mask(self, visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The 4D mask the attention implementation takes (bool, or additive for eager)."""
        if not self.eager:
            return visible[None, None]
        zero = torch.zeros((), dtype=dtype, device=visible.device)
        return torch.where(visible, zero, torch.finfo(dtype).min)[None, None]

    @torch.inference_mode()
    def hidden(self, tokens: torch.Tensor, positions: torch.Tensor, visible: torch.Tensor,
               kv: StepKV, plan: SkipPlan) -> torch.Tensor:
        """The final-normed hidden states ``[q, H]`` of ``tokens`` at ``positions``; ``visible``
        (bool ``[q, C + S + q]``) over the context, the step's rows and the new tokens."""
        h = self.decoder.embed_tokens(tokens[None])
        cos_sin = self.decoder.rotary_emb(h, positions[None])
        mask = self._mask(visible, h.dtype)
        for i, layer in enumerate(self.layers):
            if i not in plan.attn:
                out = layer.self_attn(hidden_states=layer.input_layernorm(h), position_embeddings=cos_sin,
                                      attention_mask=mask, **{self.cache_kw: kv})
                h = h + out[0]
            if i not in plan.mlp:
                h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.decoder.norm(h)[0]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head over ``hidden`` rows."""
        with torch.inference_mode():
            return self.model.lm_head(hidden)


def context_from_cache(cache: Any, length: int, layers: int) -> list[tuple[torch.Tensor, torch.Tensor] | None] | None:
    """Per-layer K/V views of the first ``length`` entries of a single-sequence transformers cache
    (``cache.layers[i].keys``), or None when the cache does not hold exactly ``length`` entries of
    one sequence at every layer (then the drafter keeps its own context)."""
    if length == 0:
        return [None] * layers
    found = getattr(cache, "layers", None)
    if found is None or len(found) != layers:
        return None
    out: list[tuple[torch.Tensor, torch.Tensor] | None] = []
    for layer in found:
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if not isinstance(keys, torch.Tensor) or keys.dim() != 4 or keys.shape[0] != 1 or keys.shape[-2] != length:
            return None
        out.append((keys, values))
    return out
