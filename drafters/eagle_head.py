"""EAGLE draft heads as torch modules, in the published parameter layouts.

Two layouts (SafeAILab/EAGLE):

* ``eagle`` (EAGLE-1/2, ``eagle/model/cnets1.py``): ``x = fc(cat(embed(token), feature))`` with
  ``fc`` ``[H, 2H]`` (+ bias), then Llama decoder layers ``layers.i`` (layer 0 has no
  ``input_layernorm``), then the TARGET's ``lm_head`` directly: the regressed feature is the
  target's final-normed hidden state, so no norm follows the head.
* ``eagle3`` (EAGLE-3, ``eagle/model/cnets.py``): target features are three layers' hidden states
  fused by ``fc`` ``[H, 3*H_target]`` (no bias); the single ``midlayer`` attends over
  ``cat(input_layernorm(embed(token)), hidden_norm(hidden))`` (2H wide) with the residual taken
  from ``hidden``; then ``norm`` and its own ``lm_head`` over a reduced draft vocabulary mapped to
  target ids by ``d2t`` offsets (``target = i + d2t[i]``).

Module attribute names equal the checkpoint keys, so ``state_dict()`` IS the published layout.
The head computes one row per (feature, next token) pair: the pair (f_t, x_{t+1}) sits at
position t and predicts x_{t+2} and the feature at t+1.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

KINDS = ("eagle", "eagle3")
KV = tuple[torch.Tensor, torch.Tensor]


@dataclass
class HeadConfig:
    """Shape and hyper-parameters of an EAGLE head (the fields of its config.json)."""

    kind: str
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    head_dim: int = 0
    draft_vocab_size: int = 0
    target_hidden_size: int = 0
    num_hidden_layers: int = 1
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 2048
    hidden_act: str = "silu"
    fc_bias: bool = True
    aux_layer_ids: tuple[int, ...] | None = None
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown EAGLE head kind {self.kind!r}; valid kinds: {', '.join(KINDS)}")
        self.head_dim = self.head_dim or self.hidden_size // self.num_attention_heads
        self.draft_vocab_size = self.draft_vocab_size or self.vocab_size
        self.target_hidden_size = self.target_hidden_size or self.hidden_size
        if self.kind == "eagle3":
            self.num_hidden_layers = 1  # EAGLE-3 has exactly one midlayer
        if self.aux_layer_ids is not None:
            self.aux_layer_ids = tuple(int(i) for i in self.aux_layer_ids)

    @property
    def feature_size(self) -> int:
        """Width of the target features the head takes (H_target, or 3 H_target for EAGLE-3)."""
        return self.target_hidden_size * (3 if self.kind == "eagle3" else 1)

    def llama_config(self) -> Any:
        """A ``transformers.LlamaConfig`` carrying the rotary settings (for the rotary embedding)."""
        from transformers import LlamaConfig

        rope = {"rope_type": "default", "rope_theta": float(self.rope_theta)}
        if self.rope_scaling:
            scaling = dict(self.rope_scaling)
            scaling.setdefault("rope_type", scaling.pop("type", "default"))
            rope.update(scaling)
        return LlamaConfig(
            hidden_size=self.hidden_size, num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads, head_dim=self.head_dim,
            max_position_embeddings=self.max_position_embeddings, rope_parameters=rope,
        )

    def to_dict(self) -> dict:
        """Plain dict of the fields (for checkpoints' training state)."""
        out = asdict(self)
        out["aux_layer_ids"] = list(self.aux_layer_ids) if self.aux_layer_ids else None
        return out


def default_aux_layer_ids(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's feature layers: inputs of layers 2, L//2 and L-3 (vLLM / SafeAILab default).

    Small targets (L < 7) cannot give three distinct such layers; they use the inputs of the
    last three layers instead (index L is the final-normed output when L < 3).
    """
    ids = (2, num_layers // 2, num_layers - 3)
    if ids[0] < ids[1] < ids[2]:
        return ids
    if num_layers < 1:
        raise ValueError(f"an EAGLE-3 head needs a target with at least 1 layer, got {num_layers}")
    low = max(0, num_layers - 3)
    return tuple(range(low, low + 3))  # type: ignore[return-value]


class RMSNorm(nn.Module):
    """Llama RMSNorm (computed in float32 at least, as transformers does)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise the last dimension and scale."""
        work = torch.promote_types(x.dtype, torch.float32)
        y = x.to(work)
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * y.to(x.dtype)


class MLP(nn.Module):
    """Llama gated MLP."""

    def __init__(self, cfg: HeadConfig) -> None:
        super().__init__()
        from transformers.activations import ACT2FN

        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.act = ACT2FN[cfg.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """down(act(gate(x)) * up(x))."""
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    """Llama attention over ``in_features`` inputs (2H for EAGLE-3) with an explicit bool mask."""

    def __init__(self, cfg: HeadConfig, in_features: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = nn.Linear(in_features, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(in_features, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(in_features, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                past: KV | None, mask: torch.Tensor) -> tuple[torch.Tensor, KV]:
        """``x`` ``[B, q, in]``; ``mask`` bool ``[B|1, q, S + q]`` over past keys then new ones.

        Returns the output ``[B, q, H]`` and the keys/values including the new rows.
        """
        b, q, _ = x.shape
        shape = lambda t, n: t.view(b, q, n, self.head_dim).transpose(1, 2)  # noqa: E731
        qs = shape(self.q_proj(x), self.heads)
        ks = shape(self.k_proj(x), self.kv_heads)
        vs = shape(self.v_proj(x), self.kv_heads)
        cos, sin = cos[:, None], sin[:, None]
        qs = qs * cos + _rotate_half(qs) * sin
        ks = ks * cos + _rotate_half(ks) * sin
        if past is not None:
            ks = torch.cat([past[0], ks], dim=2)
            vs = torch.cat([past[1], vs], dim=2)
        rep = self.heads // self.kv_heads
        k_all = ks.repeat_interleave(rep, dim=1) if rep > 1 else ks
        v_all = vs.repeat_interleave(rep, dim=1) if rep > 1 else vs
        out = F.scaled_dot_product_attention(qs, k_all, v_all, attn_mask=mask[:, None].to(x.device),
                                             scale=1.0 / math.sqrt(self.head_dim))
        out = out.transpose(1, 2).reshape(b, q, self.heads * self.head_dim)
        return self.o_proj(out), (ks, vs)


class Layer(nn.Module):
    """One EAGLE decoder layer: EAGLE-1 ``layers.i`` or EAGLE-3 ``midlayer``."""

    def __init__(self, cfg: HeadConfig, index: int) -> None:
        super().__init__()
        self.eagle3 = cfg.kind == "eagle3"
        self.index = index
        if self.eagle3:
            self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if self.eagle3 or index > 0:
            # EAGLE-1's first layer has no input norm: its input is fc's fresh output.
            self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, 2 * cfg.hidden_size if self.eagle3 else cfg.hidden_size)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, hidden: torch.Tensor, emb: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
                past: KV | None, mask: torch.Tensor) -> tuple[torch.Tensor, KV]:
        """Residual attention + MLP; EAGLE-3 attends over cat(norm(emb), norm(hidden))."""
        if self.eagle3:
            attn_in = torch.cat([self.input_layernorm(emb), self.hidden_norm(hidden)], dim=-1)
        elif self.index > 0:
            attn_in = self.input_layernorm(hidden)
        else:
            attn_in = hidden
        out, kv = self.self_attn(attn_in, cos, sin, past, mask)
        hidden = hidden + out
        hidden = hidden + self.mlp(self.post_attention_layernorm(hidden))
        return hidden, kv


class EagleHead(nn.Module):
    """An EAGLE-1/2 or EAGLE-3 draft head; ``state_dict()`` keys follow the published layout.

    ``embed_tokens`` is frozen (the target's embeddings unless a checkpoint ships its own).
    EAGLE-1/2 heads read logits through the target's ``lm_head`` (``target_lm_head`` buffer,
    not saved); EAGLE-3 heads own ``norm`` and ``lm_head`` over the draft vocabulary.
    """

    def __init__(self, cfg: HeadConfig, target_lm_head: torch.Tensor | None = None) -> None:
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.embed_tokens.weight.requires_grad_(False)
        if cfg.kind == "eagle":
            self.fc = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=cfg.fc_bias)
            self.layers = nn.ModuleList([Layer(cfg, i) for i in range(cfg.num_hidden_layers)])
            if target_lm_head is None:
                target_lm_head = torch.zeros(cfg.vocab_size, cfg.hidden_size)
            self.register_buffer("target_lm_head", target_lm_head.detach().clone(), persistent=False)
        else:
            self.fc = nn.Linear(cfg.feature_size, cfg.hidden_size, bias=False)
            self.midlayer = Layer(cfg, 0)
            self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
            self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
            self.register_buffer("t2d", torch.ones(cfg.vocab_size, dtype=torch.bool)
                                 if cfg.draft_vocab_size == cfg.vocab_size else torch.zeros(cfg.vocab_size, dtype=torch.bool))
        self.rotary = LlamaRotaryEmbedding(cfg.llama_config())

    # ------------------------------------------------------------------ structure
    @property
    def kind(self) -> str:
        """``eagle`` or ``eagle3``."""
        return self.config.kind

    @property
    def decoder_layers(self) -> list[Layer]:
        """The decoder layers in order (one for EAGLE-3)."""
        return list(self.layers) if self.kind == "eagle" else [self.midlayer]

    @property
    def draft_ids(self) -> torch.Tensor:
        """Target id of each draft-vocabulary entry (``arange + d2t``; identity for EAGLE-1)."""
        if self.kind == "eagle":
            return torch.arange(self.config.vocab_size, device=self.embed_tokens.weight.device)
        return torch.arange(self.config.draft_vocab_size, device=self.d2t.device) + self.d2t

    def features(self, hidden_states: tuple[torch.Tensor, ...] | list[torch.Tensor],
                 rows: torch.Tensor | None = None) -> torch.Tensor:
        """The head's input features from a transformers ``hidden_states`` tuple: ``[B, n, F]``.

        EAGLE-1/2: the target's final-normed last hidden state (the tuple's last element).
        EAGLE-3: inputs of the configured layers (element i of the tuple = input of layer i),
        concatenated in that order. ``rows`` picks sequence positions first (cheaper).
        """
        if self.kind == "eagle":
            picked = [hidden_states[-1]]
        else:
            ids = self.config.aux_layer_ids or default_aux_layer_ids(len(hidden_states) - 1)
            picked = [hidden_states[i] for i in ids]
        if len(picked) > 1:
            # One cat, then one gather of the rows (three gathers and their index moves cost
            # more than concatenating a tree's few rows first).
            picked = [torch.cat(picked, dim=-1)]
        if rows is not None:
            # index_select: advanced indexing ([:, rows]) cost 60-80 us more after a target forward.
            picked = [torch.index_select(picked[0], 1, rows if rows.device == picked[0].device
                                         else rows.to(picked[0].device))]
        return picked[0]

    # ------------------------------------------------------------------ forward
    def forward(self, tokens: torch.Tensor, feats: torch.Tensor, positions: torch.Tensor,
                mask: torch.Tensor, past: list[KV] | None = None,
                from_target: bool = True) -> tuple[torch.Tensor, list[KV]]:
        """Run pairs (feature, token) through the head.

        Args:
            tokens: ``[B, q]`` token ids (the token FOLLOWING each feature's position).
            feats: ``[B, q, F]`` target features (``from_target``) or head outputs ``[B, q, H]``.
            positions: ``[B, q]`` rotary positions.
            mask: bool ``[B|1, q, S + q]``: which past keys (S) and new rows each row sees.
            past: per decoder layer ``(keys, values)`` ``[B, kv_heads, S, head_dim]`` or None.
            from_target: EAGLE-3 fuses target features through ``fc``; its own outputs skip it.

        Returns:
            hidden ``[B, q, H]`` (the next features) and per layer the keys/values incl. new rows.
        """
        emb = self.embed_tokens(tokens).to(feats.dtype)
        cos, sin = self.rotary(feats, positions)
        if self.kind == "eagle":
            hidden, layer_emb = self.fc(torch.cat([emb, feats], dim=-1)), None
        else:
            hidden, layer_emb = (self.fc(feats) if from_target else feats), emb
        present: list[KV] = []
        for i, layer in enumerate(self.decoder_layers):
            hidden, kv = layer(hidden, layer_emb, cos, sin, None if past is None else past[i], mask)
            present.append(kv)
        return hidden, present

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft logits over the head's vocabulary (the target's for EAGLE-1, the draft one for EAGLE-3)."""
        if self.kind == "eagle":
            return F.linear(hidden, self.target_lm_head.to(hidden.dtype))
        return self.lm_head(self.norm(hidden))

    def target_logp(self, logits: torch.Tensor) -> torch.Tensor:
        """Log-probs ``[n, V_target]`` from draft logits ``[n, V_draft]``; -inf outside the draft vocab."""
        return self.to_target(self.draft_logp(logits))

    def draft_logp(self, logits: torch.Tensor) -> torch.Tensor:
        """Log-probs over the head's own vocabulary (``[n, V_draft]``, at least float32)."""
        dtype = torch.promote_types(logits.dtype, torch.float32)
        return torch.log_softmax(logits if logits.dtype == dtype else logits.to(dtype), dim=-1)

    @property
    def maps_vocab(self) -> bool:
        """Whether draft rows must be mapped to the target's vocabulary (EAGLE-3 with a draft
        vocabulary that is not the target's, in order)."""
        return not (self.kind == "eagle" or self.config.draft_vocab_size == self.config.vocab_size
                    and not bool(self.d2t.any()))

    def to_target(self, logp: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary log-probs ``[n, V_draft]`` as the target's ``[n, V_target]``."""
        if not self.maps_vocab:
            return logp
        out = logp.new_full((logp.shape[0], self.config.vocab_size), float("-inf"))
        out[:, self.draft_ids] = logp
        return out


def reference_path_logp(head: EagleHead, feats: torch.Tensor, tokens: torch.Tensor,
                        path_tokens: list[int]) -> torch.Tensor:
    """Slow, obviously-correct reference: the head run along ONE path, from scratch each time.

    ``feats``/``tokens`` are the committed pairs (``[P, F]``, ``[P]``: target feature at t and the
    token at t+1; the last pair ends in the tree's root). Then each path token is paired with the
    head's own output at the previous row, recomputing the whole sequence without any cache.
    Returns the target-vocabulary log-probs after the last path token.
    """
    with torch.no_grad():
        p = len(tokens)
        dev = feats.device
        causal = lambda n: torch.ones(n, n, dtype=torch.bool, device=dev).tril()[None]  # noqa: E731
        hidden, _ = head(tokens[None], feats[None], torch.arange(p, device=dev)[None], causal(p))
        if head.kind == "eagle":
            own_feats, own_tokens = feats, tokens
            for tok in path_tokens:
                own_feats = torch.cat([own_feats, hidden[0, -1:]])
                own_tokens = torch.cat([own_tokens, torch.tensor([tok], device=dev)])
                n = len(own_tokens)
                hidden, _ = head(own_tokens[None], own_feats[None], torch.arange(n, device=dev)[None], causal(n))
        else:
            # EAGLE-3 fuses target features through fc only; feed fc's output and own outputs alike.
            fused = head.fc(feats)
            own_tokens = tokens
            for tok in path_tokens:
                fused = torch.cat([fused, hidden[0, -1:]])
                own_tokens = torch.cat([own_tokens, torch.tensor([tok], device=dev)])
                n = len(own_tokens)
                hidden, _ = head(own_tokens[None], fused[None], torch.arange(n, device=dev)[None], causal(n),
                                 from_target=False)
        return head.target_logp(head.logits(hidden[0, -1:]))[0]
