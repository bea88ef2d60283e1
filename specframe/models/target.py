"""Adapter for any transformers causal LM: prefill, tree forward, KV compaction.

The same adapter runs the target and model-based drafters. A tree goes through the model in one
forward with an explicit 4D mask (prefix fully visible, tree part = ancestor mask) and explicit
position ids; afterwards the cache keeps exactly the prefix plus the accepted path.

Sliding-window layers (Mistral, Gemma 2/3, Qwen with SWA, ...) get their own mask: a query at
position p sees a key at position k only if ``p - k < sliding_window``, as in the model's own
decoding. Hybrid models (``config.layer_types``) get one mask per layer type in a dict. Every
layer's cache keeps all positions, so compaction is the same for every layer type.
"""

from __future__ import annotations

import inspect
from typing import Any, Literal

import torch

from specframe.models.attention import NAME as GQA_SDPA
from specframe.models.attention import use_gqa_sdpa
from specframe.models.exact.attention import NAME as EXACT
from specframe.models.kv_cache import SharedKV, preallocated_layer_class

SUPPORTED_ATTENTION = ("sdpa", "eager", GQA_SDPA, EXACT)
FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"
SUPPORTED_LAYER_TYPES = (FULL_ATTENTION, SLIDING_ATTENTION)
#: How a TargetModel's KV cache stores keys and values (:attr:`TargetModel.cache_kind`).
CacheKind = Literal["dynamic", "preallocated"]


class UnsupportedModelError(ValueError):
    """The model cannot run tree attention (no custom 4D mask or position ids)."""


def _architecture(model: Any) -> str:
    archs = getattr(model.config, "architectures", None) or [type(model).__name__]
    return archs[0]


def _text_config(config: Any) -> Any:
    """The decoder's config (multimodal configs nest it; plain ones are it)."""
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def layer_types(config: Any) -> tuple[str, ...]:
    """The attention type of every decoder layer, as transformers names them.

    ``config.layer_types`` when the config has it (Gemma 2/3, Qwen2/3, ...); otherwise every
    layer slides when the config sets a ``sliding_window`` (Mistral, Mixtral, Phi-3, Qwen3-MoE:
    their modeling code tests exactly that; Qwen's ``use_sliding_window=False`` already sets
    the window to None), else every layer attends to everything.
    """
    cfg = _text_config(config)
    types = getattr(cfg, "layer_types", None)
    if types:
        return tuple(types)
    n = int(getattr(cfg, "num_hidden_layers", None) or getattr(cfg, "n_layer", 0) or 1)
    sliding = getattr(cfg, "sliding_window", None) is not None
    return (SLIDING_ATTENTION if sliding else FULL_ATTENTION,) * n


def _decoder(model: Any) -> Any:
    """The decoder stack under the LM head (``model.model`` / ``model.transformer``)."""
    return getattr(model, "model", None) or getattr(model, "transformer", None) or model


def _reads_sliding_window(model: Any) -> bool:
    """Whether the model's modeling code uses a sliding window at all: some configs carry a
    ``sliding_window`` their model ignores, and the model's own decoding is the reference."""
    try:
        source = inspect.getsource(inspect.getmodule(type(_decoder(model))))
    except (OSError, TypeError):
        return True  # unknown code: assume it honours its config
    return "sliding_window" in source


def effective_layer_types(model: Any) -> tuple[str, ...]:
    """:func:`layer_types`, where "sliding" layers that cannot slide in this model (no window
    size in the config, or modeling code that never reads it) count as full attention."""
    types = layer_types(model.config)
    window = getattr(_text_config(model.config), "sliding_window", None)
    if SLIDING_ATTENTION in types and not (window and _reads_sliding_window(model)):
        types = tuple(FULL_ATTENTION if t == SLIDING_ATTENTION else t for t in types)
    return types


def _takes_mask_dict(model: Any) -> bool:
    """Whether the model's decoder accepts ``{layer type: 4D mask}`` as its attention mask.

    transformers' hybrid models test ``isinstance(attention_mask, dict)`` in their decoder's
    forward; older or custom ones do not, and would apply one mask to every layer.
    """
    try:
        source = inspect.getsource(type(_decoder(model)).forward)
    except (OSError, TypeError):
        return False
    return "attention_mask, dict" in source or "isinstance(attention_mask, dict)" in source


def _check_layer_types(model: Any, architecture: str, types: tuple[str, ...]) -> None:
    """Refuse layer types a tree mask cannot express, and hybrids that take one mask only."""
    cfg = _text_config(model.config)
    if getattr(cfg, "use_bidirectional_attention", False) or getattr(cfg, "is_causal", True) is False:
        raise UnsupportedModelError(
            f"{architecture}: configured for bidirectional attention (an encoder or embedding "
            "model), so it does not decode left to right and has no tree to verify"
        )
    local = getattr(model.config, "attention_layers", None) or ()
    if "local" in local:  # GPT-Neo
        raise UnsupportedModelError(
            f"{architecture}: its local-attention layers apply their window by cache index inside "
            "the attention, not through the mask, so tree nodes would see the wrong prefix"
        )
    odd = sorted(set(types) - set(SUPPORTED_LAYER_TYPES))
    if odd:
        raise UnsupportedModelError(
            f"{architecture}: layers of type {odd} (recurrent, convolutional, chunked or linear "
            "attention) cannot verify a tree with one mask and a compactable KV cache; supported: "
            f"{SUPPORTED_LAYER_TYPES}"
        )
    if len(set(types)) > 1 and not _takes_mask_dict(model):
        raise UnsupportedModelError(
            f"{architecture}: mixes {sorted(set(types))} layers but its forward takes one attention "
            "mask for all of them (no per-layer-type mask dict), so sliding layers would see too much"
        )


class TargetModel:
    """Stateful wrapper over one transformers causal LM and its KV cache (batch size 1).

    Device- and dtype-agnostic: masks and position ids follow the model's parameters.

    ``preallocate``: give each sequence a KV cache allocated once for the capacity passed to
    :meth:`reset` and compacted in place, instead of transformers' ``DynamicCache``, which
    reallocates every layer's K/V at each step. On a GPU allocations and copies queue behind
    the forward; on a CPU keeping a chain's accepted path is a new length per layer instead of
    two views per layer (docs/results.md). None (default): on. Outputs are identical either way.
    """

    def __init__(self, model: Any, preallocate: bool | None = None) -> None:
        self.model = model.eval()
        self.architecture = _architecture(model)
        self.attn_implementation = getattr(model.config, "_attn_implementation", None) or "eager"
        if self.attn_implementation not in SUPPORTED_ATTENTION:
            raise UnsupportedModelError(
                f"{self.architecture}: attention implementation {self.attn_implementation!r} cannot "
                f"take a custom tree mask; load the model with attn_implementation in {SUPPORTED_ATTENTION}"
            )
        params = inspect.signature(model.forward).parameters
        if "position_ids" not in params:
            raise UnsupportedModelError(
                f"{self.architecture}: forward() takes no position_ids, so tree nodes cannot be "
                "placed at their depth; this architecture is not supported"
            )
        # transformers 5.x renames past_key_values -> cache; support whichever is installed.
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        # transformers' causal LMs can skip the lm_head rows a caller does not read.
        self._takes_logits_to_keep = "logits_to_keep" in params
        param = next(model.parameters())
        self.device: torch.device = param.device
        self.dtype: torch.dtype = param.dtype
        self.preallocate: bool = True if preallocate is None else bool(preallocate)
        self.vocab_size: int = int(model.get_output_embeddings().weight.shape[0])
        cfg = _text_config(model.config)
        # A sliding window does not bound the context: the window mask is built per query.
        self.max_positions: int = int(
            getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", 0) or 1 << 30
        )
        self.layer_types = effective_layer_types(model)
        _check_layer_types(model, self.architecture, self.layer_types)
        self.sliding_window: int | None = (
            int(cfg.sliding_window) if SLIDING_ATTENTION in self.layer_types else None
        )
        # Positions of the cache entries (only tracked when a layer slides): after compaction a
        # drafter's cache tail holds tree nodes whose position is not their index.
        self._kv_positions: torch.Tensor | None = None
        self.eos_token_id = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        self.cache: Any = None
        self._shared_kv = SharedKV(0)
        #: How :attr:`cache` stores K/V: ``"dynamic"`` (grows by concatenation) or
        #: ``"preallocated"`` (fixed buffers compacted in place); set by :meth:`reset`.
        self.cache_kind: CacheKind = "dynamic"
        self.cache_len = 0
        self._call: Any = model
        self.compiled = False

    def compile(self, **options: Any) -> None:
        """Run the model's forward through ``torch.compile`` from now on (``dynamic=True`` by
        default, since the query length follows the tree size and the cache grows every step).

        Pays off on a GPU for a target whose forward is launch-bound (small models, short trees);
        see docs/performance.md for the measurements. Outputs stay those of the eager model up to
        kernel-level rounding, so exact-equality tests keep it off.
        """
        options.setdefault("dynamic", True)
        self._call = torch.compile(self.model, **options)
        self.compiled = True

    def use_exact(self) -> None:
        """Run the exact forward from now on (:func:`specframe.models.exact.use_exact`, in place
        on :attr:`model`): a token's logits then depend only on its prefix, bit for bit."""
        from specframe.models.exact import use_exact

        use_exact(self.model)
        self.attn_implementation = self.model.config._attn_implementation

    @property
    def exact(self) -> bool:
        """Whether the model runs the exact forward."""
        return self.attn_implementation == EXACT

    # ------------------------------------------------------------------ cache
    def reset(self, capacity: int | None = None) -> None:
        """Drop the KV cache (start of a new sequence).

        ``capacity``: the most positions the sequence will hold (the engine passes prompt +
        max_new_tokens + budget). A target with ``preallocate`` allocates its cache once for
        that many; otherwise, or without a capacity, the cache grows by concatenation
        (transformers' DynamicCache).
        """
        from transformers import DynamicCache

        if capacity is None or not self.preallocate:
            self.cache = DynamicCache()
            self.cache_kind = "dynamic"
        else:
            from transformers.cache_utils import Cache

            layer_cls = preallocated_layer_class()
            n_layers = self.model.config.get_text_config().num_hidden_layers
            self._shared_kv = SharedKV(n_layers)
            self.cache = Cache(layers=[layer_cls(capacity, self._shared_kv, i) for i in range(n_layers)])
            self.cache_kind = "preallocated"
        self.cache_len = 0
        self._kv_positions = torch.zeros(0, dtype=torch.long, device=self.device)

    @torch.inference_mode()
    def keep(self, start: int, slots: torch.Tensor, contiguous: bool | None = None) -> None:
        """Compact the cache to entries ``[:start]`` plus ``start + slots`` (in that order).

        Used after verification: the prefix stays, the accepted path's entries move right behind
        it and everything else is dropped (a crop alone would keep rejected siblings).
        ``contiguous`` (slots are 0..k-1) may be passed by a caller that already knows it on the
        host; otherwise it is read from the device.
        """
        if slots.device != self.device or slots.dtype != torch.long:
            slots = slots.to(self.device, torch.long)
        n = int(slots.numel())
        if contiguous is None:
            contiguous = n == 0 or bool((slots == torch.arange(n, device=self.device)).all())
        if self.cache_kind == "preallocated":
            whole = self._shared_kv.whole
            if whole and n and not contiguous:
                # Every layer's rows move at once (the index copies first: overlap is safe).
                buffer = self._shared_kv.buffer
                buffer[..., start : start + n, :] = buffer[..., start + slots, :]
            for layer in self.cache.layers:
                if contiguous or whole:  # the path already sits behind the prefix: a new length is the crop
                    layer.length = start + n
                else:
                    layer.keep(start, slots, contiguous)
        for layer in self.cache.layers if self.cache_kind == "dynamic" else ():
            if getattr(layer, "keys", None) is None or layer.keys.numel() == 0:
                continue
            if contiguous:
                if layer.keys.shape[-2] == start + n:  # the whole tree was kept: nothing to drop
                    continue
                layer.keys = layer.keys[..., : start + n, :]
                layer.values = layer.values[..., : start + n, :]
            else:
                # The path's rows move behind the prefix in place (the index copies them first,
                # so overlap is safe), then a crop: a cat rebuilt the whole prefix per layer.
                idx = slots + start
                for name in ("keys", "values"):
                    cached = getattr(layer, name)
                    cached[..., start : start + n, :] = cached[..., idx, :]
                    setattr(layer, name, cached[..., : start + n, :])
        if self.sliding_window is not None:
            kept = self._kv_positions[: start + n] if contiguous else torch.cat(
                [self._kv_positions[:start], self._kv_positions[start + slots]])
            self._kv_positions = kept
        self.cache_len = start + n

    # ------------------------------------------------------------------ forwards
    def _visibility(self, new_mask: torch.Tensor) -> torch.Tensor:
        """Bool ``[q, cache_len + q]``: ``new_mask`` over the cache's tail + new tokens, every
        earlier cache entry (the committed prefix) visible to all.

        ``new_mask`` is ``[q, t + q]``: its columns are the last ``t`` cache entries followed by
        the new tokens.
        """
        q, cols = new_mask.shape
        visible = self.cache_len + q - cols
        return torch.cat(
            [torch.ones(q, visible, dtype=torch.bool, device=self.device), new_mask.to(self.device)],
            dim=1,
        )

    def _windowed(self, full: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``full`` restricted to keys less than ``sliding_window`` positions behind each query
        (transformers' ``sliding_window_overlay``: kv > q - window), by position, not by cache
        index, so deep tree nodes also lose their far ancestors, as in plain decoding."""
        keys = torch.cat([self._kv_positions, positions])
        return full & ((positions[:, None] - keys[None, :]) < self.sliding_window)

    def _as_attention_mask(self, visible: torch.Tensor) -> torch.Tensor:
        """The 4D mask the attention implementation takes: bool (SDPA) or additive float (eager)."""
        if self.attn_implementation != "eager":  # SDPA (either kind) takes the bool mask as it is
            return visible[None, None]
        # Eager adds the mask to the scores, so it needs an additive float mask in the model dtype.
        zero = torch.zeros((), dtype=self.dtype, device=self.device)
        return torch.where(visible, zero, torch.finfo(self.dtype).min)[None, None]

    def _mask(self, new_mask: torch.Tensor, positions: torch.Tensor | None = None) -> Any:
        """The attention mask for ``new_mask`` (see :meth:`_visibility`) at ``positions``.

        One 4D tensor ``[1, 1, q, cache_len + q]`` when all layers attend alike, otherwise a dict
        ``{layer type: 4D mask}`` (transformers' hybrid models pick their layer's entry).
        """
        full = self._visibility(new_mask)
        if self.sliding_window is None:
            return self._as_attention_mask(full)
        sliding = self._as_attention_mask(self._windowed(full, positions.to(self.device)))
        if FULL_ATTENTION not in self.layer_types:
            return sliding
        return {FULL_ATTENTION: self._as_attention_mask(full), SLIDING_ATTENTION: sliding}

    @torch.inference_mode()
    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        new_mask: torch.Tensor,
        output_hidden_states: bool = False,
        max_position: int | None = None,
        last_logits_only: bool = False,
    ) -> Any:
        """Run ``tokens`` (``[q]``) at ``positions`` on top of the cache; appends them to it.

        ``new_mask`` (bool) is ``[q, q]`` (attention among the new tokens, whole cache visible) or
        ``[q, t + q]`` (also masking the last ``t`` cache entries, e.g. tree nodes of a drafter).
        ``max_position``: an upper bound of ``positions`` the caller knows on the host; without
        it the range check reads ``positions.max()`` from the device.
        ``last_logits_only``: compute the logits of the last token only (``[1, 1, V]``), for a
        caller that reads no other row: a prompt's prefill skips ``q - 1`` lm_head rows (at
        SmolLM2's 49152 x 576 head, 28 M multiply-adds each). A model whose forward takes no
        ``logits_to_keep`` computes every row anyway.

        Returns the model output (``.logits`` is ``[1, q, V]``).
        """
        if self.cache is None:
            self.reset()
        q = int(tokens.shape[0])
        top = int(positions.max()) if max_position is None else max_position
        if top >= self.max_positions:
            raise ValueError(f"position {top} is beyond the model's {self.max_positions} positions")
        positions = positions.to(self.device)
        mask = self._mask(new_mask, positions)
        out = self._call(
            input_ids=tokens.to(self.device)[None],
            position_ids=positions[None],
            attention_mask=mask,
            use_cache=True,
            output_hidden_states=output_hidden_states,
            **{self._cache_kw: self.cache},
            **({"logits_to_keep": 1} if last_logits_only and self._takes_logits_to_keep else {}),
        )
        if self.sliding_window is not None:
            self._kv_positions = torch.cat([self._kv_positions, positions])
        self.cache_len += q
        return out

    def causal_forward(
        self, tokens: torch.Tensor, output_hidden_states: bool = False, last_logits_only: bool = False,
    ) -> Any:
        """Append a plain sequence of tokens after the cache (prefill / catch-up).

        ``last_logits_only``: see :meth:`forward` (the logits of the last token only)."""
        q = int(tokens.shape[0])
        positions = torch.arange(self.cache_len, self.cache_len + q, device=self.device)
        causal = torch.ones(q, q, dtype=torch.bool, device=self.device).tril()
        return self.forward(tokens, positions, causal, output_hidden_states, last_logits_only=last_logits_only)

    def tree_forward(
        self, tree_tokens: torch.Tensor, positions: torch.Tensor, ancestor_mask: torch.Tensor,
        output_hidden_states: bool = False, max_position: int | None = None,
    ) -> Any:
        """Forward a whole draft tree (already ordered topologically) on top of the cache."""
        return self.forward(tree_tokens, positions, ancestor_mask, output_hidden_states, max_position)


def load_causal_lm(
    name_or_path: str,
    dtype: str | torch.dtype | None = None,
    device: str | torch.device | None = None,
    attn_implementation: str = "sdpa",
    linears: str = "float32",
    exact: bool = False,
) -> Any:
    """Load a causal LM from a local path, a hub id or a shipped name (``demo-target``, ...).

    Raises FileNotFoundError with the resolved path when a local-looking path does not exist.
    A CPU model loaded with ``"sdpa"`` whose K/V heads are grouped gets
    :func:`specframe.models.attention.use_gqa_sdpa` (the same attention without copying K/V per head).
    ``linears="bf16"`` runs its linears through the row-invariant bf16 kernel where the CPU
    has one (:mod:`specframe.models.linears`, as ``[target] linears``); ValueError names the
    valid values. ``exact=True`` makes it run the exact forward (:mod:`specframe.models.exact`:
    a token's logits depend only on its prefix, bit for bit); a device without the exact
    kernel is refused in one line before anything loads.
    """
    from specframe.models.linears import apply_linears, check_linears

    check_linears(linears)
    if exact:
        from specframe.models.exact import check_exact_device

        check_exact_device(device)
    from transformers import AutoModelForCausalLM

    from specframe.models.assets import resolve_model_path

    path = resolve_model_path(name_or_path)
    torch_dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch_dtype or torch.float32, attn_implementation=attn_implementation
    )
    if device is not None:
        model = model.to(device)
    use_gqa_sdpa(model)
    if linears != "float32":
        apply_linears(model, linears)
    if exact:
        from specframe.models.exact import use_exact

        use_exact(model)
    return model.eval()
