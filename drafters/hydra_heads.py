"""Hydra's draft heads (Ankner et al., arXiv 2402.05109; zankner/Hydra) and their checkpoint layout.

Head i (0-based) of a *grounded* Hydra reads ``concat(h_t, E(x_{t+1}), ..., E(x_{t+i+1}))``: the
base model's hidden state and the embeddings of the tokens drafted before it on its path. It is
a first residual block ``res(x) + SiLU(W x + b)`` whose ``res`` is a ``Linear((i+2)H, H)``,
then ``num_layers - 1`` more blocks ``x + SiLU(W x + b)`` that are ONE module repeated (the
reference builds them as ``[ResBlock(H)] * (L-1)``, so their weights are tied), then its own
``Linear(H, V)`` with a bias. An ungrounded head (``grounded_heads: false``, Medusa's heads in
Hydra's code) reads ``h_t`` alone through ``num_layers`` repeats of one block.

Hydra++ (``hydra_head_arch = "prefix-mlp"``) first runs the base model's last hidden states
through one extra decoder layer of the target's architecture (its own KV over the committed
positions, and its own final norm) and gives the heads that layer's output instead of ``h_t``;
its blocks and lm_heads sit behind dropout slots, which only shift the state_dict indices.

The layout (zankner/Hydra ``HydraModel.from_pretrained``): a directory with ``config.json``
(``hydra_num_heads``, ``hydra_num_layers``, ``hydra_head_arch``, ``grounded_heads``,
``hidden_state_offset``) and ``hydra_lm_head.pt``, the state dict of ``model.hydra_head``: keys
``hydra_mlp.{i}.{j}.linear.*``, ``hydra_mlp.{i}.{j}.res_connection.*``, ``hydra_lm_head.{i}.*``
and, for Hydra++, ``prefix_embeding_layer.*`` (the reference's spelling).
"""

from __future__ import annotations

import copy
import inspect
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "hydra_lm_head.pt"
#: The head architectures this project runs (the reference's ``cross-attn`` and ``eagle-attn``
#: are research variants its released checkpoints do not use).
ARCHS = ("mlp", "prefix-mlp")
#: Keys the reference's checkpoints hold that the heads never read: its copy of the target's
#: token embedding (``input_embed_fn``, a submodule there; the drafter embeds with the target's
#: own), the prefix layer's token embedding (it is fed hidden states) and rotary buffers.
UNREAD_SUFFIXES = ("input_embed_fn.weight", "prefix_embeding_layer.embed_tokens.weight", "rotary_emb.inv_freq")


class HydraCheckpointError(ValueError):
    """A Hydra checkpoint that does not fit its layout or the target; the message says where."""


class ResBlock(nn.Module):
    """Hydra's residual block: ``res(x) + SiLU(linear(x))``, ``res`` the identity or, for a block
    reading ``num_condition`` embeddings beside the hidden state, a projection to ``hidden``."""

    def __init__(self, hidden: int, num_condition: int = 0) -> None:
        super().__init__()
        width = hidden * (num_condition + 1)
        self.linear = nn.Linear(width, hidden)
        self.res_connection: nn.Module = nn.Linear(width, hidden) if num_condition > 0 else nn.Identity()
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """One residual step."""
        return self.res_connection(x) + self.act(self.linear(x))


def _head_mlp(hidden: int, index: int, layers: int, grounded: bool, slots: bool) -> nn.Sequential:
    """Head ``index``'s blocks, tied as the reference ties them (module docstring); ``slots``
    puts a dropout slot before each block (Hydra++'s indices)."""
    if grounded:
        later = ResBlock(hidden)  # one instance for the L-1 later blocks: the reference's tie
        blocks = [ResBlock(hidden, index + 1)] + [later] * (layers - 1)
    else:
        blocks = [ResBlock(hidden)] * layers
    if not slots:
        return nn.Sequential(*blocks)
    return nn.Sequential(*[m for block in blocks for m in (nn.Dropout(0.0), block)])


def prefix_layer(base_config: Any) -> nn.Module:
    """One decoder layer of the target's architecture with its final norm (the target's base
    model class at one layer), fed hidden states: the token embedding is dropped."""
    from transformers import AutoModel

    config = copy.deepcopy(base_config)
    config.num_hidden_layers = 1
    if isinstance(getattr(config, "layer_types", None), list):
        config.layer_types = config.layer_types[:1]
    model = AutoModel.from_config(config)
    model.embed_tokens = None  # fed inputs_embeds; V x H weights it would never read
    return model


class HydraHeads(nn.Module):
    """K Hydra heads; ``state_dict`` keys are the reference's ``hydra_head`` keys.

    ``base_config``: the target's text config, needed (and read) only by Hydra++'s prefix layer.
    """

    def __init__(self, hidden: int, vocab: int, num_heads: int, num_layers: int = 1, grounded: bool = True,
                 arch: str = "mlp", base_config: Any = None, hidden_state_offset: int = 0) -> None:
        super().__init__()
        if arch not in ARCHS:
            raise HydraCheckpointError(f"hydra_head_arch {arch!r} is not supported; supported: {list(ARCHS)}")
        if num_heads < 1 or num_layers < 1:
            raise HydraCheckpointError(f"hydra_num_heads and hydra_num_layers must be >= 1, got {num_heads} "
                                       f"and {num_layers}")
        if arch == "prefix-mlp" and not grounded:
            raise HydraCheckpointError("an ungrounded prefix-mlp is not supported: the reference's proposal skips its "
                                       "prefix layer, so its heads draft from inputs they were not trained on")
        if arch == "prefix-mlp" and base_config is None:
            raise HydraCheckpointError("a prefix-mlp (Hydra++) head needs the target's config for its prefix layer")
        slots = arch == "prefix-mlp"
        self.hidden, self.vocab, self.num_layers = hidden, vocab, num_layers
        self.grounded, self.arch, self.hidden_state_offset = grounded, arch, hidden_state_offset
        if slots:
            self.prefix_embeding_layer = prefix_layer(base_config)
        self.hydra_mlp = nn.ModuleList([_head_mlp(hidden, i, num_layers, grounded, slots) for i in range(num_heads)])
        self.hydra_lm_head = nn.ModuleList([
            nn.Sequential(nn.Dropout(0.0), nn.Linear(hidden, vocab)) if slots else nn.Linear(hidden, vocab)
            for _ in range(num_heads)])

    def __len__(self) -> int:
        return len(self.hydra_mlp)

    @property
    def has_prefix(self) -> bool:
        """Whether the heads read Hydra++'s prefix layer (with its own KV) instead of ``h_t``."""
        return self.arch == "prefix-mlp"

    def width(self, index: int) -> int:
        """How many token embeddings head ``index`` reads beside the hidden state."""
        return index + 1 if self.grounded else 0

    def head_logits(self, index: int, x: torch.Tensor) -> torch.Tensor:
        """``[..., V]`` logits of head ``index`` at inputs ``[..., (width + 1) H]``."""
        return self.hydra_lm_head[index](self.hydra_mlp[index](x))

    def prefix(self, hidden: torch.Tensor, positions: torch.Tensor, cache: Any) -> torch.Tensor:
        """Hydra++'s prefix layer over hidden states ``[n, H]`` at ``positions``, appending to
        ``cache`` (a transformers cache of that layer): its outputs ``[n, H]``."""
        layer = self.prefix_embeding_layer
        # transformers 5.x renames past_key_values -> cache; pass whichever the layer takes.
        keyword = "cache" if "cache" in inspect.signature(layer.forward).parameters else "past_key_values"
        out = layer(inputs_embeds=hidden[None], position_ids=positions[None], use_cache=True, **{keyword: cache})
        return out.last_hidden_state[0]

    def config_dict(self) -> dict:
        """The reference's ``config.json`` fields for these heads."""
        return {"hydra_num_heads": len(self), "hydra_num_layers": self.num_layers, "hydra_head_arch": self.arch,
                "grounded_heads": self.grounded, "hidden_state_offset": self.hidden_state_offset}


def tied_keys(heads: HydraHeads) -> list[list[str]]:
    """Groups of state_dict keys that name one tensor (the repeated blocks), each group sorted."""
    groups: dict[int, list[str]] = {}
    for key, value in heads.state_dict(keep_vars=True).items():
        groups.setdefault(id(value), []).append(key)
    return [sorted(g) for g in groups.values() if len(g) > 1]


def random_heads(hidden: int, vocab: int, num_heads: int = 3, num_layers: int = 1, grounded: bool = True,
                 arch: str = "mlp", base_config: Any = None, seed: int = 0, std: float = 0.5) -> HydraHeads:
    """Heads of seeded random weights drawn from N(0, std^2), ties kept (tests, conformance);
    the prefix layer's norm starts at one."""
    heads = HydraHeads(hidden, vocab, num_heads, num_layers, grounded, arch, base_config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in heads.named_parameters():  # each tied tensor once
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.copy_(torch.randn(param.shape, generator=gen) * std)
    return heads


def save_heads(heads: HydraHeads, directory: str | Path) -> Path:
    """Write ``heads`` in the reference's layout (``config.json`` + ``hydra_lm_head.pt``)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    torch.save(heads.state_dict(), directory / WEIGHTS_NAME)
    (directory / CONFIG_NAME).write_text(json.dumps(heads.config_dict()) + "\n")
    return directory


def read_config(directory: Path) -> dict:
    """The head settings of ``directory/config.json``, checked."""
    config_file = directory / CONFIG_NAME
    if not config_file.is_file():
        raise HydraCheckpointError(f"{directory}: no {CONFIG_NAME} (a Hydra checkpoint directory holds {CONFIG_NAME} "
                                   f"and {WEIGHTS_NAME})")
    raw = json.loads(config_file.read_text(encoding="utf-8"))
    try:
        return {"num_heads": int(raw["hydra_num_heads"]), "num_layers": int(raw.get("hydra_num_layers", 1)),
                "arch": str(raw.get("hydra_head_arch", "mlp")), "grounded": bool(raw.get("grounded_heads", False)),
                "hidden_state_offset": int(raw.get("hidden_state_offset", 0))}
    except (KeyError, TypeError, ValueError) as err:
        raise HydraCheckpointError(f"{config_file}: needs an integer 'hydra_num_heads' ({err!r})") from err


def load_heads(path: str | Path, base_config: Any, vocab: int, allow_pickle: bool = False) -> HydraHeads:
    """The heads of the checkpoint directory ``path``, checked against the target (its text
    config ``base_config`` and vocabulary size): every key the heads need present with its
    shape, and the tied blocks' keys equal."""
    directory = Path(path)
    settings = read_config(directory)
    heads = HydraHeads(int(base_config.hidden_size), vocab, base_config=base_config, **settings)
    state = _read_state(directory / WEIGHTS_NAME, allow_pickle)
    expected = {k: tuple(v.shape) for k, v in heads.state_dict().items() if not k.endswith(UNREAD_SUFFIXES)}
    for key, shape in expected.items():
        if key not in state:
            raise HydraCheckpointError(f"{directory}: key {key!r} missing (expected shape {shape})")
        if tuple(state[key].shape) != shape:
            raise HydraCheckpointError(f"{directory}: key {key!r} has shape {tuple(state[key].shape)}, the target "
                                       f"needs {shape} (hidden {base_config.hidden_size}, vocabulary {vocab})")
    for group in tied_keys(heads):
        if any(not torch.equal(state[group[0]], state[k]) for k in group[1:]):
            raise HydraCheckpointError(f"{directory}: keys {group} are one tied block in Hydra's heads but hold "
                                       "different values")
    # Loaded at the checkpoint's precision: the drafter casts to the target's afterwards.
    heads.to(next(iter(state.values())).dtype).load_state_dict({k: state[k] for k in expected}, strict=False)
    return heads


def _read_state(file: Path, allow_pickle: bool) -> dict[str, torch.Tensor]:
    if not file.is_file():
        raise HydraCheckpointError(f"{file.parent}: no {WEIGHTS_NAME}")
    try:
        return torch.load(file, map_location="cpu", weights_only=True)
    except Exception as err:  # a pickle holding more than tensors
        if not allow_pickle:
            raise HydraCheckpointError(f"{file} holds more than tensors ({type(err).__name__}); reading it runs "
                                       "pickled code: pass option allow_pickle = true if you trust it") from err
        return torch.load(file, map_location="cpu", weights_only=False)
