"""Drafter ``medusa``: Medusa-1 heads (Cai et al., arXiv 2401.10774) on the target's last hidden state.

Head i (0-based) is ``medusa_num_layers`` residual blocks (``x + SiLU(W x + b)``) followed by
its own ``Linear(hidden, vocab, bias=False)`` (or, in a checkpoint whose config says
``"shared_lm_head": true``, the target's own output layer), applied to the
target's final hidden state at the last accepted position, and predicts the token ``i + 1``
places past the next root. So a tree node at depth d gets head d's distribution, whatever its
ancestors (Medusa's conditional independence: siblings and cousins share a row), and the
deepest head serves every deeper node. One forward of the K heads per step, at the step's
first expansion; every later row is an index into it.

Checkpoints in the official layout (FasterDecoding/Medusa): a directory with ``config.json``
(``medusa_num_heads``, ``medusa_num_layers``) and ``medusa_lm_head.safetensors`` (or, only with
``allow_pickle = true``, ``medusa_lm_head.pt``), keys ``{i}.{j}.linear.weight`` /
``{i}.{j}.linear.bias`` for block j of head i and ``{i}.{num_layers}.weight`` for its lm_head.
Every mismatch names the key, the expected and the found shape.

``"shared_lm_head": true`` is this project's extension of the layout: Medusa initialises every
head's lm_head from the target's, and a head that keeps it needs only its residual blocks, so
the checkpoint holds ``{i}.{j}.linear.*`` alone (for SmolLM2-135M: 1 MB a head instead of 57 MB)
and the K heads share one output-layer matmul per step.

Replay: ``"approximate"``, as for EAGLE heads: it reads the target's hidden states, which a
recorded causal forward gives up to the last bits of the live tree forward's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from specframe.interfaces import Drafter
from specframe.options import require
from specframe.tree import DraftTree

CONFIG_NAME = "config.json"
SAFETENSORS_NAME = "medusa_lm_head.safetensors"
PICKLE_NAME = "medusa_lm_head.pt"


class MedusaCheckpointError(ValueError):
    """A Medusa checkpoint that does not fit its layout or the target; the message says where."""


class ResBlock(nn.Module):
    """Medusa's residual block: ``x + SiLU(linear(x))``."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """One residual step."""
        return x + self.act(self.linear(x))


class MedusaHeads(nn.ModuleList):
    """K heads, each ``num_layers`` ResBlocks and an lm_head; ``state_dict`` keys are Medusa's.

    With ``shared_lm_head`` a head is its ResBlocks only and :meth:`logits` takes the target's
    output layer (which is not part of the heads' state)."""

    def __init__(self, hidden: int, vocab: int, num_heads: int, num_layers: int = 1,
                 shared_lm_head: bool = False) -> None:
        def head() -> nn.Sequential:
            own = [] if shared_lm_head else [nn.Linear(hidden, vocab, bias=False)]
            return nn.Sequential(*[ResBlock(hidden) for _ in range(num_layers)], *own)

        super().__init__([head() for _ in range(num_heads)])
        self.num_layers, self.shared_lm_head = num_layers, shared_lm_head

    def logits(self, hidden: torch.Tensor, lm_head: nn.Module | None = None) -> torch.Tensor:
        """``[K, ..., V]`` logits of the K heads at hidden states ``[..., H]`` (``lm_head``: the
        target's output layer, needed and used only when the heads share it: one matmul for all K)."""
        if not self.shared_lm_head:
            return torch.stack([head(hidden) for head in self])
        if lm_head is None:
            raise ValueError("these Medusa heads share the target's lm_head: pass it")
        return lm_head(torch.stack([head(hidden) for head in self]))

    def log_probs(self, hidden: torch.Tensor, lm_head: nn.Module | None = None) -> torch.Tensor:
        """``[K, V]`` log-probabilities of the K heads at one hidden state ``[H]``."""
        return torch.log_softmax(self.logits(hidden, lm_head).float(), dim=-1)


def random_heads(hidden: int, vocab: int, num_heads: int = 3, num_layers: int = 1, shared_lm_head: bool = False,
                 seed: int = 0, std: float = 0.5) -> MedusaHeads:
    """Heads of seeded random weights, every one drawn from N(0, std^2) (tests, conformance: far
    from the trained ones, so they draft wrong often and the verifier's work shows)."""
    heads = MedusaHeads(hidden, vocab, num_heads, num_layers, shared_lm_head)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in heads.parameters():
            param.copy_(torch.randn(param.shape, generator=gen) * std)
    return heads


def save_heads(heads: MedusaHeads, directory: str | Path) -> Path:
    """Write ``heads`` in the official layout (tests and training write checkpoints this way)."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in heads.state_dict().items()}, str(directory / SAFETENSORS_NAME))
    config = {"medusa_num_heads": len(heads), "medusa_num_layers": heads.num_layers}
    if heads.shared_lm_head:
        config["shared_lm_head"] = True
    (directory / CONFIG_NAME).write_text(json.dumps(config))
    return directory


def load_heads(path: str | Path, hidden: int, vocab: int, allow_pickle: bool = False) -> MedusaHeads:
    """The heads of the checkpoint directory ``path`` (or a shipped name such as
    ``smollm2-135m-instruct-medusa``), checked against the target's sizes."""
    from specframe.models.assets import SHIPPED_MODELS

    directory = SHIPPED_MODELS.get(str(path), Path(path))
    config_file = directory / CONFIG_NAME
    if not config_file.is_file():
        raise MedusaCheckpointError(f"{directory}: no {CONFIG_NAME} (a Medusa checkpoint directory holds "
                                    f"{CONFIG_NAME} and {SAFETENSORS_NAME})")
    raw = json.loads(config_file.read_text(encoding="utf-8"))
    try:
        num_heads, num_layers = int(raw["medusa_num_heads"]), int(raw.get("medusa_num_layers", 1))
    except (KeyError, TypeError, ValueError) as err:
        raise MedusaCheckpointError(f"{config_file}: needs an integer 'medusa_num_heads' ({err})") from err
    heads = MedusaHeads(hidden, vocab, num_heads, num_layers, shared_lm_head=bool(raw.get("shared_lm_head", False)))
    state = _read_state(directory, allow_pickle)
    expected = {k: tuple(v.shape) for k, v in heads.state_dict().items()}
    for key, shape in expected.items():
        if key not in state:
            raise MedusaCheckpointError(f"{directory}: key {key!r} missing (expected shape {shape})")
        if tuple(state[key].shape) != shape:
            raise MedusaCheckpointError(f"{directory}: key {key!r} has shape {tuple(state[key].shape)}, the target "
                                        f"needs {shape} (hidden {hidden}, vocabulary {vocab})")
    heads.load_state_dict({k: state[k] for k in expected})
    return heads


def _read_state(directory: Path, allow_pickle: bool) -> dict[str, torch.Tensor]:
    if (directory / SAFETENSORS_NAME).is_file():
        from safetensors.torch import load_file

        return load_file(str(directory / SAFETENSORS_NAME))
    if (directory / PICKLE_NAME).is_file():
        if not allow_pickle:
            raise MedusaCheckpointError(f"{directory / PICKLE_NAME} is a pickle, which can run code when read: pass "
                                        f"option allow_pickle = true if you trust it, or convert it to {SAFETENSORS_NAME}")
        return torch.load(directory / PICKLE_NAME, map_location="cpu", weights_only=False)
    raise MedusaCheckpointError(f"{directory}: neither {SAFETENSORS_NAME} nor {PICKLE_NAME}")


@dataclass
class MedusaDrafterOptions:
    """Options of the ``medusa`` drafter.

    Attributes:
        path: a checkpoint directory in Medusa's layout (module docstring), or the shipped
            ``smollm2-135m-instruct-medusa``.
        allow_pickle: read a ``medusa_lm_head.pt`` (pickle) checkpoint.
        heads: a :class:`MedusaHeads` instance instead of ``path`` (tests, training).
    """

    path: str | None = None
    allow_pickle: bool = False
    heads: Any = None

    def __post_init__(self) -> None:
        require((self.path is None) != (self.heads is None), "path",
                "give exactly one of path (a Medusa checkpoint directory) or heads (a MedusaHeads module)")
        require(self.heads is None or isinstance(self.heads, MedusaHeads), "heads",
                f"must be a MedusaHeads module, got {type(self.heads).__name__}")


class MedusaDrafter(Drafter):
    """Medusa heads on the target's last hidden state: depth d's row is head d's (module docstring)."""

    name = "medusa"
    Options = MedusaDrafterOptions
    needs_target_hidden = True
    replay = "approximate"

    def __init__(self, options: MedusaDrafterOptions, target: Any) -> None:
        super().__init__(options, target)
        model = getattr(target, "model", target)
        hidden = int(model.config.get_text_config().hidden_size)
        heads = options.heads or load_heads(options.path, hidden, self.vocab_size, options.allow_pickle)
        device = getattr(target, "device", torch.device("cpu"))
        dtype = next(model.parameters()).dtype
        self.heads = heads.to(device=device, dtype=dtype).eval()
        # Shared heads project through the target's own output layer (packed or not).
        self.lm_head = model.get_output_embeddings() if self.heads.shared_lm_head else None
        self.state: torch.Tensor = torch.zeros(hidden, dtype=dtype, device=device)
        self._rows: torch.Tensor | None = None

    def shared_options(self) -> MedusaDrafterOptions:
        """Batch rows share the loaded heads."""
        return MedusaDrafterOptions(heads=self.heads)

    def begin(self, prompt_ids: torch.Tensor, target_hidden: Any = None) -> None:
        """The last prefill position's final hidden state (it predicted the first root); a
        one-token prompt has none, and its first step drafts from zeros."""
        if target_hidden is not None and target_hidden[-1] is not None and target_hidden[-1].shape[-2] > 0:
            self.state = target_hidden[-1][0, -1].to(self.state)
        else:
            self.state = torch.zeros_like(self.state)
        self._rows = None

    def commit(self, tokens: torch.Tensor, path: torch.Tensor | None = None, target_hidden: Any = None,
               tree: DraftTree | None = None) -> None:
        """The last accepted node's final hidden state (it predicted the bonus, the next root)."""
        if target_hidden is not None and path is not None:
            self.state = target_hidden[-1][0, path[-1]].to(self.state)
        self._rows = None

    @torch.inference_mode()
    def expand(self, tree: DraftTree, nodes: torch.Tensor) -> torch.Tensor:
        """Head ``depth``'s log-probs for each node (the last head past the deepest)."""
        if self._rows is None:  # one forward of the K heads per step
            self._rows = self.heads.log_probs(self.state, self.lm_head)
        depth = tree.depths[torch.as_tensor(nodes, device=tree.device).flatten()].clamp(max=len(self.heads) - 1)
        return self._rows[depth.to(self._rows.device)].to(tree.device)
