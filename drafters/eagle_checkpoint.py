"""Read and write EAGLE heads in the published checkpoint layouts.

A checkpoint is a directory with ``config.json`` and ``model.safetensors`` (or a sharded
``model.safetensors.index.json``, or, only with ``allow_pickle=True``, ``pytorch_model.bin``).
Keys are those of SafeAILab/EAGLE:

* EAGLE-3: ``fc.weight``, ``midlayer.{hidden_norm,input_layernorm,post_attention_layernorm}.weight``,
  ``midlayer.self_attn.{q,k,v,o}_proj.weight``, ``midlayer.mlp.{gate,up,down}_proj.weight``,
  ``norm.weight``, ``lm_head.weight``, ``d2t`` (int64 offsets), ``t2d`` (bool over the target vocab).
* EAGLE-1/2: ``fc.weight`` (+ ``fc.bias`` when config ``bias`` is true), ``layers.{i}.self_attn.*``,
  ``layers.{i}.post_attention_layernorm.weight``, ``layers.{i}.mlp.*`` (``layers.{i>0}.input_layernorm``).

``embed_tokens.weight`` is optional in both: when absent the target's embeddings are used.
Every mismatch raises :class:`CheckpointError` naming the key, the expected and the found shape.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from .eagle_head import KINDS, EagleHead, HeadConfig, default_aux_layer_ids

CONFIG_NAME = "config.json"
SAFETENSORS_NAME = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLE_NAME = "pytorch_model.bin"
OPTIONAL_KEYS = ("embed_tokens.weight",)
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # old checkpoints saved the rotary buffer
ARCHITECTURE = {"eagle": "LlamaForCausalLM", "eagle3": "LlamaForCausalLMEagle3"}


class CheckpointError(ValueError):
    """A checkpoint does not fit the expected layout or the target; the message says where."""


# ---------------------------------------------------------------------- target facts
def hf_model(target: Any) -> Any:
    """The transformers model behind a TargetModel (or the model itself)."""
    return getattr(target, "model", target) if hasattr(target, "architecture") else target


def target_facts(target: Any) -> dict:
    """Hidden size, layer count, vocabulary, embeddings and lm_head of a target model."""
    model = hf_model(target)
    cfg = model.config
    lm_head = model.get_output_embeddings().weight
    return {
        "hidden_size": int(cfg.hidden_size),
        "num_layers": int(cfg.num_hidden_layers),
        "vocab_size": int(lm_head.shape[0]),
        "embed": model.get_input_embeddings().weight,
        "lm_head": lm_head,
        "config": cfg,
    }


def config_for_target(target: Any, kind: str, draft_vocab_size: int | None = None,
                      aux_layer_ids: tuple[int, ...] | None = None,
                      intermediate_size: int | None = None) -> HeadConfig:
    """A head configuration sized for ``target`` (its width, heads, rotary settings, vocabulary)."""
    facts = target_facts(target)
    cfg = facts["config"]
    heads = int(cfg.num_attention_heads)
    rope = getattr(cfg, "rope_parameters", None) or {}
    theta = rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))
    scaling = {k: v for k, v in rope.items() if k != "rope_theta"} if rope.get("rope_type", "default") != "default" else None
    if kind == "eagle3" and aux_layer_ids is None:
        aux_layer_ids = default_aux_layer_ids(facts["num_layers"])
    return HeadConfig(
        kind=kind, hidden_size=facts["hidden_size"],
        intermediate_size=int(intermediate_size or getattr(cfg, "intermediate_size", 4 * facts["hidden_size"])),
        num_attention_heads=heads, num_key_value_heads=int(getattr(cfg, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(cfg, "head_dim", None) or facts["hidden_size"] // heads),
        vocab_size=facts["vocab_size"], draft_vocab_size=int(draft_vocab_size or facts["vocab_size"]),
        target_hidden_size=facts["hidden_size"], rms_norm_eps=float(getattr(cfg, "rms_norm_eps", 1e-6)),
        rope_theta=float(theta), rope_scaling=scaling,
        max_position_embeddings=int(getattr(cfg, "max_position_embeddings", 2048)),
        hidden_act=str(getattr(cfg, "hidden_act", "silu")), fc_bias=kind == "eagle",
        aux_layer_ids=aux_layer_ids,
    )


# ---------------------------------------------------------------------- config.json
def config_to_json(cfg: HeadConfig, dtype: torch.dtype) -> dict:
    """The published config.json of a head."""
    out = {
        "architectures": [ARCHITECTURE[cfg.kind]], "model_type": "llama",
        "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim, "num_hidden_layers": cfg.num_hidden_layers,
        "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": cfg.rope_theta, "rope_scaling": cfg.rope_scaling,
        "max_position_embeddings": cfg.max_position_embeddings, "hidden_act": cfg.hidden_act,
        "vocab_size": cfg.vocab_size, "tie_word_embeddings": False,
        "torch_dtype": str(dtype).removeprefix("torch."),
    }
    if cfg.kind == "eagle":
        out["bias"] = cfg.fc_bias
    else:
        out["draft_vocab_size"] = cfg.draft_vocab_size
        out["target_hidden_size"] = cfg.target_hidden_size
        out["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(cfg.aux_layer_ids or ()),
                               "use_aux_hidden_state": True}
    return out


def _rope_from_json(raw: dict) -> tuple[float, dict | None]:
    params = raw.get("rope_parameters") or {}
    theta = float(raw.get("rope_theta") or params.get("rope_theta") or 10000.0)
    scaling = raw.get("rope_scaling")
    if not scaling and params.get("rope_type", "default") != "default":
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    return theta, scaling or None


def config_from_json(raw: dict, kind: str, keys: set[str], where: str) -> HeadConfig:
    """Parse a published config.json; a missing required field is named with the file."""
    def need(name: str) -> Any:
        if raw.get(name) is None:
            raise CheckpointError(f"{where}: config.json has no {name!r} (required for an {kind} head)")
        return raw[name]

    heads = int(need("num_attention_heads"))
    theta, scaling = _rope_from_json(raw)
    ids = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    layers = 1 if kind == "eagle3" else 1 + max(
        [int(k.split(".")[1]) for k in keys if k.startswith("layers.")] or [int(raw.get("num_hidden_layers") or 1) - 1])
    return HeadConfig(
        kind=kind, hidden_size=int(need("hidden_size")), intermediate_size=int(need("intermediate_size")),
        num_attention_heads=heads, num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=int(raw.get("head_dim") or 0), vocab_size=int(need("vocab_size")),
        draft_vocab_size=int(raw.get("draft_vocab_size") or 0),
        target_hidden_size=int(raw.get("target_hidden_size") or 0), num_hidden_layers=layers,
        rms_norm_eps=float(raw.get("rms_norm_eps") or 1e-6), rope_theta=theta, rope_scaling=scaling,
        max_position_embeddings=int(raw.get("max_position_embeddings") or 2048),
        hidden_act=str(raw.get("hidden_act") or "silu"),
        # EAGLE's loader reads config "bias" (default True); trust the weights when it is absent.
        fc_bias=kind == "eagle" and bool(raw["bias"] if "bias" in raw else "fc.bias" in keys),
        aux_layer_ids=tuple(ids) if ids else None,
    )


def detect_kind(raw: dict, keys: set[str], where: str) -> str:
    """``eagle3`` for ``midlayer.*`` keys (or an Eagle3 architecture), ``eagle`` for ``layers.*``."""
    archs = [str(a).lower() for a in raw.get("architectures") or []]
    if any(k.startswith("midlayer.") for k in keys) or any("eagle3" in a for a in archs):
        return "eagle3"
    if any(k.startswith("layers.") for k in keys):
        return "eagle"
    raise CheckpointError(
        f"{where}: not an EAGLE head: no 'midlayer.*' keys (EAGLE-3) and no 'layers.*' keys (EAGLE-1/2); "
        f"found keys {sorted(keys)[:8]}"
    )


# ---------------------------------------------------------------------- weights on disk
def read_state(directory: Path, allow_pickle: bool = False) -> dict[str, torch.Tensor]:
    """The tensors of a checkpoint directory (safetensors; pickle only with ``allow_pickle``)."""
    from safetensors.torch import load_file

    if (directory / SAFETENSORS_NAME).exists():
        return load_file(str(directory / SAFETENSORS_NAME))
    if (directory / SAFETENSORS_INDEX).exists():
        shards = sorted(set(json.loads((directory / SAFETENSORS_INDEX).read_text())["weight_map"].values()))
        state: dict[str, torch.Tensor] = {}
        for shard in shards:
            state.update(load_file(str(directory / shard)))
        return state
    if (directory / PICKLE_NAME).exists():
        if not allow_pickle:
            raise CheckpointError(
                f"{directory}: only {PICKLE_NAME} (a pickle, which can run code when loaded) is present; "
                f"pass option allow_pickle=True if you trust it, or convert it to {SAFETENSORS_NAME}"
            )
        state = torch.load(directory / PICKLE_NAME, map_location="cpu", weights_only=True)
        return dict(state.get("state_dict", state)) if isinstance(state, dict) else state
    raise CheckpointError(f"{directory}: no {SAFETENSORS_NAME}, {SAFETENSORS_INDEX} or {PICKLE_NAME}")


def check_state(state: dict[str, torch.Tensor], expected: dict[str, tuple[int, ...]], where: str) -> None:
    """Raise naming the first missing, unexpected or mis-shaped key."""
    for key, shape in expected.items():
        if key not in state:
            if key in OPTIONAL_KEYS:
                continue
            raise CheckpointError(f"{where}: missing key {key!r} (expected shape {shape})")
        found = tuple(state[key].shape)
        if found != shape:
            raise CheckpointError(f"{where}: key {key!r} has shape {found}, expected {shape}")
    extra = sorted(k for k in state if k not in expected and not k.endswith(IGNORED_SUFFIXES))
    if extra:
        raise CheckpointError(f"{where}: unexpected key(s) {extra}; expected keys: {sorted(expected)}")


def _check_vocab_map(head: EagleHead, where: str) -> None:
    """d2t must map the draft vocabulary one-to-one into the target's, onto t2d's True entries."""
    cfg = head.config
    ids = head.draft_ids
    bad = (ids < 0) | (ids >= cfg.vocab_size)
    if bool(bad.any()):
        i = int(torch.nonzero(bad)[0])
        raise CheckpointError(
            f"{where}: key 'd2t' maps draft id {i} to target id {int(ids[i])}, outside [0, {cfg.vocab_size}) "
            "(d2t holds offsets: target id = i + d2t[i])"
        )
    if len(torch.unique(ids)) != len(ids):
        raise CheckpointError(f"{where}: key 'd2t' maps two draft ids to the same target id")
    if int(head.t2d.sum()) != cfg.draft_vocab_size or not bool(head.t2d[ids].all()):
        raise CheckpointError(
            f"{where}: key 't2d' marks {int(head.t2d.sum())} target ids, expected exactly the "
            f"{cfg.draft_vocab_size} ids that d2t maps to"
        )


# ---------------------------------------------------------------------- load / save
def check_target(cfg: HeadConfig, target: Any, where: str) -> None:
    """The head must read the target's vocabulary and feature width (and its layers for EAGLE-3)."""
    facts = target_facts(target)
    if cfg.vocab_size != facts["vocab_size"]:
        raise CheckpointError(
            f"{where}: config vocab_size is {cfg.vocab_size}, the target's vocabulary has {facts['vocab_size']} ids"
        )
    if cfg.target_hidden_size != facts["hidden_size"]:
        field = "target_hidden_size" if cfg.kind == "eagle3" else "hidden_size"
        raise CheckpointError(
            f"{where}: config {field} is {cfg.target_hidden_size}, the target's hidden size is {facts['hidden_size']}"
        )
    if cfg.kind == "eagle3":
        ids = cfg.aux_layer_ids or default_aux_layer_ids(facts["num_layers"])
        if len(ids) != 3 or not all(0 <= i <= facts["num_layers"] for i in ids):
            raise CheckpointError(
                f"{where}: eagle_config.eagle_aux_hidden_state_layer_ids = {list(ids)}: need 3 layer ids in "
                f"[0, {facts['num_layers']}] for a target with {facts['num_layers']} layers"
            )
        cfg.aux_layer_ids = tuple(ids)


def build_head(cfg: HeadConfig, target: Any) -> EagleHead:
    """An (uninitialised) head for ``target`` with the target's embeddings and, for EAGLE-1, lm_head."""
    facts = target_facts(target)
    head = EagleHead(cfg, target_lm_head=facts["lm_head"] if cfg.kind == "eagle" else None)
    embed = facts["embed"]
    if tuple(embed.shape) == tuple(head.embed_tokens.weight.shape):
        with torch.no_grad():
            head.embed_tokens.weight.copy_(embed.detach().to(head.embed_tokens.weight.dtype))
    return head


def load_head(path: str | Path, target: Any, kind: str | None = None, allow_pickle: bool = False,
              dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> EagleHead:
    """Load a published EAGLE-1/2 or EAGLE-3 head for ``target`` (a TargetModel or HF model).

    ``path`` is a checkpoint directory or a shipped name (``demo-eagle``). ``kind`` (``eagle`` or
    ``eagle3``), when given, must match the checkpoint. The head ends up in ``dtype`` on ``device``
    (default: the target's).
    """
    from specframe.models.assets import resolve_model_path

    directory = Path(resolve_model_path(str(path)))
    if not directory.exists():  # a hub id (resolve_model_path checked it looks like one)
        directory = _download(str(path), allow_pickle)
    where = f"EAGLE checkpoint {directory}"
    raw = json.loads((directory / CONFIG_NAME).read_text())
    state = read_state(directory, allow_pickle)
    found = detect_kind(raw, set(state), where)
    if kind is not None and kind != found:
        names = {"eagle": "EAGLE-1/2", "eagle3": "EAGLE-3"}
        raise CheckpointError(f"{where} is an {names[found]} head; use drafter {found!r}, not {kind!r}")
    cfg = config_from_json(raw, found, set(state), where)
    check_target(cfg, target, where)
    head = build_head(cfg, target)
    expected = {k: tuple(v.shape) for k, v in head.state_dict().items()}
    check_state(state, expected, where)
    if "embed_tokens.weight" not in state and tuple(target_facts(target)["embed"].shape) != expected["embed_tokens.weight"]:
        raise CheckpointError(
            f"{where}: key 'embed_tokens.weight' is absent and the target's embeddings have shape "
            f"{tuple(target_facts(target)['embed'].shape)}, expected {expected['embed_tokens.weight']}"
        )
    own = head.state_dict()
    for key, value in state.items():
        if key in own:
            own[key] = value.to(own[key].dtype)
    head.load_state_dict(own)
    if cfg.kind == "eagle3":
        _check_vocab_map(head, where)
    ref = next(hf_model(target).parameters())
    return head.to(device=device or ref.device, dtype=dtype or ref.dtype).eval()


def _download(repo_id: str, allow_pickle: bool) -> Path:
    """Fetch a head from the Hugging Face hub (config + weights only)."""
    try:
        from huggingface_hub import snapshot_download

        patterns = [CONFIG_NAME, "*.safetensors", SAFETENSORS_INDEX] + ([PICKLE_NAME] if allow_pickle else [])
        return Path(snapshot_download(repo_id, allow_patterns=patterns))
    except Exception as err:  # offline, unknown repo, ...: say what was tried
        raise CheckpointError(f"EAGLE checkpoint {repo_id!r} is not a local directory and could not be "
                              f"downloaded from the hub: {err}") from err


def save_head(head: EagleHead, out_dir: str | Path, dtype: torch.dtype = torch.float16,
              include_embeddings: bool | None = None) -> Path:
    """Write ``config.json`` + ``model.safetensors`` in the published layout; returns the directory.

    Embeddings are written for EAGLE-1/2 (EAGLE's own loader expects them) and left out for
    EAGLE-3 (loaders take the target's), unless ``include_embeddings`` says otherwise.
    """
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    keep_embed = head.kind == "eagle" if include_embeddings is None else include_embeddings
    state = {}
    for key, value in head.state_dict().items():
        if key == "embed_tokens.weight" and not keep_embed:
            continue
        value = value.detach().to("cpu")
        state[key] = (value.to(dtype) if value.is_floating_point() else value).contiguous()
    save_file(state, str(out / SAFETENSORS_NAME), metadata={"format": "pt"})
    (out / CONFIG_NAME).write_text(json.dumps(config_to_json(head.config, dtype), indent=2) + "\n")
    return out


def random_head(target: Any, kind: str, seed: int = 0, draft_vocab_size: int | None = None,
                std: float = 0.3, aux_layer_ids: tuple[int, ...] | None = None,
                intermediate_size: int | None = None) -> EagleHead:
    """A randomly initialised head for ``target`` (tests, and the trainer's starting point).

    With a reduced ``draft_vocab_size`` (EAGLE-3) the draft vocabulary is a seeded random subset of
    target ids, so ``d2t`` holds non-trivial offsets.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown EAGLE head kind {kind!r}; valid kinds: {', '.join(KINDS)}")
    cfg = config_for_target(target, kind, draft_vocab_size, aux_layer_ids, intermediate_size)
    head = build_head(cfg, target)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in head.named_parameters():
            if name == "embed_tokens.weight":
                continue
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.1 * torch.randn(param.shape, generator=gen))
            else:
                param.copy_(torch.randn(param.shape, generator=gen) * std)
        if kind == "eagle3":
            set_draft_vocab(head, torch.randperm(cfg.vocab_size, generator=gen)[: cfg.draft_vocab_size])
    ref = next(hf_model(target).parameters())
    return head.to(device=ref.device, dtype=ref.dtype).eval()


def set_draft_vocab(head: EagleHead, target_ids: torch.Tensor) -> None:
    """Make ``target_ids`` (any order, distinct) the draft vocabulary: sorted, as EAGLE-3 does."""
    used = torch.sort(target_ids.to(torch.long).cpu()).values
    if len(used) != head.config.draft_vocab_size:
        raise ValueError(f"need {head.config.draft_vocab_size} draft ids, got {len(used)}")
    head.d2t.copy_(used - torch.arange(len(used)))
    head.t2d.zero_()
    head.t2d[used] = True
