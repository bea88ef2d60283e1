"""Train Hydra heads for any causal LM target by self-distillation (``specframe train-hydra``).

The target stays frozen. On windows of text it gives, at every position t, its hidden state
h_t and its next-token distributions; head i (0-based) reads h_t (for Hydra++, the prefix
layer's output over h_0..h_t) and the embeddings of the window's tokens x_{t+1}..x_{t+i+1},
and learns the target's distribution at position t + 1 + i: exactly what the ``hydra`` drafter
asks of head i at a node of depth i. Loss: Hydra's teacher loss (zankner/Hydra
``hydra/train/train.py``, ``teacher_loss_fct``), the soft cross-entropy of each head against
those distributions, the heads summed with equal weight, on ``--positions`` random positions of
each batch (the heads' output layers over every position would cost more than the target's
forward); Hydra++'s prefix layer runs over the whole window, as the reference trains it.

Heads start as the reference starts them (``HydraMLP.__init__``): each lm_head a copy of the
target's output layer, each block's ``linear`` weight at zero, everything else at PyTorch's
default initialisation. The checkpoint is the reference's layout (``config.json`` +
``hydra_lm_head.pt``), so the reference can load it too.

Resumable like ``train-medusa`` (the loop of :mod:`specframe.drafters.training`): state in a
work directory, and a rerun of the same command continues. With ``--heldout`` the result's
``training.json`` reports each head's top-1 agreement with the target on that text.
"""

from __future__ import annotations

import copy
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import click
import torch

from .eagle_train import read_texts, token_stream
from .hydra_heads import ARCHS, HydraHeads, save_heads
from .medusa_train import pick_positions, target_pass
from .training import StepResult, TrainingSettings, load_frozen_target, recent_means, run_training, sample_windows


@dataclass(kw_only=True)
class HydraTrainConfig(TrainingSettings):
    """Everything a Hydra training run depends on (stored with the state; a resume must match)."""

    heads: int = 4
    layers: int = 1
    arch: str = "mlp"
    positions: int = 256
    heldout: list[str] = field(default_factory=list)

    #: The held-out text only reports; a resume may name another.
    RESUMABLE = TrainingSettings.RESUMABLE | {"heldout"}

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("heads", "layers", "positions"):
            if getattr(self, name) < 1:
                raise click.BadParameter(f"must be >= 1, got {getattr(self, name)}", param_hint=f"--{name}")
        if self.arch not in ARCHS:
            raise click.BadParameter(f"must be one of {list(ARCHS)}, got {self.arch!r}", param_hint="--arch")


def new_heads(cfg: HydraTrainConfig, model: Any) -> HydraHeads:
    """Fresh grounded heads sized for ``model``, initialised as the reference's (module docstring)."""
    config = model.config.get_text_config()
    out_layer = model.get_output_embeddings()
    heads = HydraHeads(int(config.hidden_size), int(out_layer.weight.shape[0]), cfg.heads, cfg.layers,
                       grounded=True, arch=cfg.arch, base_config=config)
    with torch.no_grad():
        for name, param in heads.named_parameters():
            if name.startswith("hydra_mlp") and name.endswith("linear.weight"):
                param.zero_()
            elif name.startswith("hydra_lm_head") and name.endswith("weight"):
                param.copy_(out_layer.weight)
    return heads.float().train()


def head_inputs(heads: HydraHeads, base: torch.Tensor, tokens: torch.Tensor, embed: Any, rows: torch.Tensor,
                cols: torch.Tensor) -> list[torch.Tensor]:
    """Each head's inputs ``[P, (i+2) H]`` at the picked (row, position) pairs: the hidden state
    (Hydra++: the prefix layer's output) and the embeddings of the next i+1 tokens."""
    if heads.has_prefix:
        batch, seq = base.shape[:2]
        positions = torch.arange(seq, device=base.device).expand(batch, -1)
        base = heads.prefix_embeding_layer(inputs_embeds=base, position_ids=positions, use_cache=False).last_hidden_state
    with torch.no_grad():
        emb = embed(tokens).float()
    state = base[rows, cols].float()
    return [torch.cat([state] + [emb[rows, cols + 1 + j] for j in range(i + 1)], dim=-1) for i in range(len(heads))]


def teacher_targets(logits: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, num_heads: int) -> torch.Tensor:
    """The target's distributions ``[K, P, V]`` at position t + 1 + i for head i."""
    return torch.stack([torch.softmax(logits[rows, cols + 1 + i].float(), dim=-1) for i in range(num_heads)])


def teacher_loss(heads: HydraHeads, inputs: list[torch.Tensor], teacher: torch.Tensor) -> tuple[torch.Tensor, list[float]]:
    """Hydra's teacher loss (soft cross-entropy, heads summed) and each head's top-1 agreement."""
    loss, agree = torch.zeros((), device=teacher.device), []
    for i, x in enumerate(inputs):
        logp = torch.log_softmax(heads.head_logits(i, x).float(), dim=-1)
        loss = loss - (teacher[i] * logp).sum(-1).mean()
        agree.append(round(float((logp.argmax(-1) == teacher[i].argmax(-1)).float().mean()), 4))
    return loss, agree


@torch.no_grad()
def heldout_agreement(heads: HydraHeads, model: Any, stream: torch.Tensor, seq_len: int,
                      max_windows: int = 64) -> list[float]:
    """Each head's top-1 agreement with the target over every position of up to
    ``max_windows`` consecutive windows of ``stream``."""
    k, hits, total = len(heads), torch.zeros(len(heads)), 0
    embed = model.get_input_embeddings()
    for start in range(0, min(len(stream) - seq_len, max_windows * seq_len), seq_len):
        window = stream[start : start + seq_len][None].to(model.device)
        hidden, logits = target_pass(model, window)
        n = seq_len - k
        rows, cols = torch.zeros(n, dtype=torch.long), torch.arange(n)
        inputs = head_inputs(heads, hidden.float(), window, embed, rows, cols)
        teacher = teacher_targets(logits, rows, cols, k)
        for i, x in enumerate(inputs):
            hits[i] += float((heads.head_logits(i, x).argmax(-1) == teacher[i].argmax(-1)).float().sum())
        total += n
    return [round(float(h) / max(1, total), 4) for h in hits]


def train_hydra(cfg: HydraTrainConfig, progress: bool = True) -> dict:
    """Run (or resume) training; write the heads to ``cfg.out``; return a summary dict."""
    torch.manual_seed(cfg.seed)
    model, tokenizer = load_frozen_target(cfg)
    stream = token_stream(read_texts(cfg.data), tokenizer)
    if len(stream) <= cfg.seq_len:
        raise click.BadParameter(f"the data has {len(stream)} tokens, need more than --seq-len {cfg.seq_len}",
                                 param_hint="--data")
    if cfg.seq_len <= cfg.heads:
        raise click.BadParameter(f"must exceed --heads ({cfg.heads}), got {cfg.seq_len}", param_hint="--seq-len")
    heads = new_heads(cfg, model).to(cfg.device)
    embed = model.get_input_embeddings()
    opt = torch.optim.AdamW([p for p in heads.parameters() if p.requires_grad], lr=cfg.lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(cfg.seed)

    def step() -> StepResult:
        tokens = sample_windows(stream, cfg.seq_len, cfg.batch_size, gen, cfg.device)
        hidden, logits = target_pass(model, tokens)
        rows, cols = pick_positions(cfg.batch_size, cfg.seq_len, cfg.heads, cfg.positions, gen)
        inputs = head_inputs(heads, hidden.float(), tokens, embed, rows, cols)
        return teacher_loss(heads, inputs, teacher_targets(logits, rows, cols, cfg.heads))

    # A copy is cast for the file: casting the trained heads would round them in place.
    write = lambda: save_heads(copy.deepcopy(heads).to(getattr(torch, cfg.save_dtype)), cfg.out)  # noqa: E731
    state = run_training(cfg, heads, "heads", opt, gen, step, write, f"train-hydra x{cfg.heads}",
                         cfg.batch_size * cfg.seq_len, progress)
    loss, agree = recent_means(state["history"], cfg.heads)
    summary = {"kind": "hydra", "arch": cfg.arch, "heads": cfg.heads, "steps": state["step"],
               "tokens": state["tokens"], "train_seconds": round(state["elapsed"], 1), "out": str(cfg.out),
               "loss_recent": loss, "top1_recent": agree}
    if cfg.heldout:
        held = token_stream(read_texts(cfg.heldout), tokenizer)
        summary["heldout_top1"] = heldout_agreement(heads.eval(), model, held, min(cfg.seq_len, len(held) - 1))
    Path(cfg.out, "training.json").write_text(json.dumps({"summary": summary, "config": asdict(cfg)}, indent=1) + "\n")
    return summary


@click.command("train-hydra")
@click.option("--target", required=True, help="Target model: local path, hub id or shipped name (smollm2-135m-instruct).")
@click.option("--data", required=True, multiple=True, help="Text: .jsonl (text/turns/prompt), text files or directories. Repeatable.")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Output directory (Hydra's checkpoint layout).")
@click.option("--heads", "num_heads", type=int, default=4, show_default=True, help="Hydra heads (tree depth they draft).")
@click.option("--layers", type=int, default=1, show_default=True, help="Residual blocks per head (the later ones tied).")
@click.option("--arch", type=click.Choice(list(ARCHS)), default="mlp", show_default=True,
              help="mlp: Hydra; prefix-mlp: Hydra++ (an extra decoder layer over the target's hidden states).")
@click.option("--steps", type=int, default=None, help="Stop after this many optimizer steps.")
@click.option("--minutes", type=float, default=None, help="Stop after this much training wall time (cosine LR follows it).")
@click.option("--batch-size", type=int, default=4, show_default=True)
@click.option("--seq-len", type=int, default=256, show_default=True)
@click.option("--positions", type=int, default=256, show_default=True, help="Positions of each batch the loss is taken on.")
@click.option("--lr", type=float, default=1e-3, show_default=True)
@click.option("--warmup-steps", type=int, default=20, show_default=True)
@click.option("--heldout", multiple=True, help="Text to report each head's top-1 agreement on (not trained on).")
@click.option("--device", default=None, help="cpu, cuda, ... (default: cuda when available).")
@click.option("--threads", type=int, default=None, help="torch CPU threads.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--save-dtype", type=click.Choice(["float16", "bfloat16", "float32"]), default="float16", show_default=True)
@click.option("--work", default=None, help="Training-state directory (default OUT/.train-state); rerun to resume.")
@click.option("--no-progress", is_flag=True, help="Plain output (no progress bar).")
def train_hydra_command(target, data, out, num_heads, layers, arch, steps, minutes, batch_size, seq_len, positions,
                        lr, warmup_steps, heldout, device, threads, seed, save_dtype, work, no_progress) -> None:
    """Train Hydra heads for TARGET on text (self-distillation against the target, Hydra's teacher loss)."""
    if threads:
        torch.set_num_threads(threads)
    cfg = HydraTrainConfig(target=target, data=list(data), out=out, heads=num_heads, layers=layers, arch=arch,
                           steps=steps, minutes=minutes, batch_size=batch_size, seq_len=seq_len, positions=positions,
                           lr=lr, warmup_steps=warmup_steps, seed=seed,
                           device=device or ("cuda" if torch.cuda.is_available() else "cpu"), save_dtype=save_dtype,
                           work=work, heldout=list(heldout))
    click.echo(json.dumps(train_hydra(cfg, progress=not no_progress)))
