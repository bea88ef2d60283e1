"""Train Medusa-1 heads for any causal LM target by self-distillation (``specframe train-medusa``).

The target stays frozen. On windows of text it gives, at every position t, its final hidden
state h_t and its next-token distributions; head i (0-based) learns from h_t the target's
distribution at position t + 1 + i, i.e. the token i + 1 places past the one h_t predicts,
which is exactly what the ``medusa`` drafter asks of head i at a node of depth i + 1. Loss: the
soft cross-entropy of each head against those distributions, weighted 0.8**i as in Medusa-1,
on ``--positions`` random positions of each batch (the heads' output-layer matmul over every
position would cost more than the target's forward).

Heads are Medusa-1's residual blocks, their linear layers starting at zero (Medusa's init: a
fresh head repeats the target's next-token guess). ``--shared-lm-head`` (the default) keeps the
target's output layer frozen as every head's lm_head, so only the blocks train and the
checkpoint stays small; ``--own-lm-head`` gives each head a trainable copy (the original layout).

Resumable like ``train-eagle`` (the loop of :mod:`specframe.drafters.training`): state (heads,
optimizer, RNG, step, elapsed time) in a work directory, and a rerun of the same command continues. With ``--heldout`` the result's
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
from .medusa import MedusaHeads, save_heads
from .training import (StepResult, TrainingSettings, load_frozen_target, recent_means, run_training,
                       sample_windows)

#: Medusa-1's per-head loss weight: later heads are harder and matter less.
HEAD_DECAY = 0.8


@dataclass(kw_only=True)
class MedusaTrainConfig(TrainingSettings):
    """Everything a Medusa training run depends on (stored with the state; a resume must match)."""

    heads: int = 3
    layers: int = 1
    shared_lm_head: bool = True
    positions: int = 256
    heldout: list[str] = field(default_factory=list)

    #: The held-out text only reports; a resume may name another.
    RESUMABLE = TrainingSettings.RESUMABLE | {"heldout"}

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("heads", "layers", "positions"):
            if getattr(self, name) < 1:
                raise click.BadParameter(f"must be >= 1, got {getattr(self, name)}", param_hint=f"--{name}")


def new_heads(cfg: MedusaTrainConfig, model: Any) -> MedusaHeads:
    """Fresh heads sized for ``model``: zero residual blocks (each head starts as the identity),
    own lm_heads copied from the target's output layer."""
    hidden = int(model.config.get_text_config().hidden_size)
    out_layer = model.get_output_embeddings()
    heads = MedusaHeads(hidden, int(out_layer.weight.shape[0]), cfg.heads, cfg.layers, cfg.shared_lm_head)
    with torch.no_grad():
        for name, param in heads.named_parameters():
            if "linear" in name:
                param.zero_()
            else:  # an own lm_head
                param.copy_(out_layer.weight)
    return heads.float().train()


def head_targets(hidden: torch.Tensor, logits: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor,
                 num_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs ``[P, H]`` (h at the picked positions) and teacher distributions ``[K, P, V]``
    (the target's at position t + 1 + i for head i)."""
    teacher = torch.stack([torch.softmax(logits[rows, cols + 1 + i].float(), dim=-1) for i in range(num_heads)])
    return hidden[rows, cols].float(), teacher


def heads_loss(heads: MedusaHeads, lm_head: Any, x: torch.Tensor, teacher: torch.Tensor) -> tuple[torch.Tensor, list[float]]:
    """Weighted soft cross-entropy of the heads at ``x`` against ``teacher``, and each head's
    top-1 agreement with it."""
    logp = torch.log_softmax(heads.logits(x, lm_head).float(), dim=-1)          # [K, P, V]
    ce = -(teacher * logp).sum(-1).mean(-1)                                      # [K]
    weights = HEAD_DECAY ** torch.arange(len(heads), dtype=ce.dtype)
    agree = (logp.argmax(-1) == teacher.argmax(-1)).float().mean(-1)
    return (weights * ce).sum(), [round(float(a), 4) for a in agree]


def pick_positions(batch: int, seq_len: int, num_heads: int, count: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` random (row, position) pairs whose every head has a label inside the window."""
    flat = torch.randperm(batch * (seq_len - num_heads), generator=gen)[:count]
    return flat // (seq_len - num_heads), flat % (seq_len - num_heads)


@torch.no_grad()
def target_pass(model: Any, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's final hidden states (the ones the drafter reads) and logits."""
    out = model(input_ids=tokens, output_hidden_states=True)
    return out.hidden_states[-1], out.logits


@torch.no_grad()
def heldout_agreement(heads: MedusaHeads, model: Any, stream: torch.Tensor, seq_len: int,
                      max_windows: int = 64) -> list[float]:
    """Each head's top-1 agreement with the target over every position of up to
    ``max_windows`` consecutive windows of ``stream``."""
    k, hits, total = len(heads), torch.zeros(len(heads)), 0
    lm_head = model.get_output_embeddings()
    for start in range(0, min(len(stream) - seq_len, max_windows * seq_len), seq_len):
        hidden, logits = target_pass(model, stream[start : start + seq_len][None].to(model.device))
        n = seq_len - k
        x, teacher = head_targets(hidden, logits, torch.zeros(n, dtype=torch.long), torch.arange(n), k)
        guess = heads.logits(x, lm_head).argmax(-1)
        hits += (guess == teacher.argmax(-1)).float().sum(-1).cpu()
        total += n
    return [round(float(h) / max(1, total), 4) for h in hits]


def train_medusa(cfg: MedusaTrainConfig, progress: bool = True) -> dict:
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
    lm_head = model.get_output_embeddings() if cfg.shared_lm_head else None
    opt = torch.optim.AdamW(heads.parameters(), lr=cfg.lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(cfg.seed)

    def step() -> StepResult:
        hidden, logits = target_pass(model, sample_windows(stream, cfg.seq_len, cfg.batch_size, gen, cfg.device))
        rows, cols = pick_positions(cfg.batch_size, cfg.seq_len, cfg.heads, cfg.positions, gen)
        return heads_loss(heads, lm_head, *head_targets(hidden, logits, rows, cols, cfg.heads))

    # A copy is cast for the file: casting the trained heads would round them in place.
    write = lambda: save_heads(copy.deepcopy(heads).to(getattr(torch, cfg.save_dtype)), cfg.out)  # noqa: E731
    state = run_training(cfg, heads, "heads", opt, gen, step, write, f"train-medusa x{cfg.heads}",
                         cfg.batch_size * cfg.seq_len, progress)
    loss, agree = recent_means(state["history"], cfg.heads)
    summary = {"kind": "medusa", "heads": cfg.heads, "steps": state["step"], "tokens": state["tokens"],
               "train_seconds": round(state["elapsed"], 1), "out": str(cfg.out), "loss_recent": loss,
               "top1_recent": agree}
    if cfg.heldout:
        held = token_stream(read_texts(cfg.heldout), tokenizer)
        summary["heldout_top1"] = heldout_agreement(heads.eval(), model, held, min(cfg.seq_len, len(held) - 1))
    Path(cfg.out, "training.json").write_text(json.dumps({"summary": summary, "config": asdict(cfg)}, indent=1) + "\n")
    return summary


@click.command("train-medusa")
@click.option("--target", required=True, help="Target model: local path, hub id or shipped name (smollm2-135m-instruct).")
@click.option("--data", required=True, multiple=True, help="Text: .jsonl (text/turns/prompt), text files or directories. Repeatable.")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Output directory (Medusa's checkpoint layout).")
@click.option("--heads", "num_heads", type=int, default=3, show_default=True, help="Medusa heads (tokens +2..+K+1 past the bonus).")
@click.option("--layers", type=int, default=1, show_default=True, help="Residual blocks per head.")
@click.option("--shared-lm-head/--own-lm-head", default=True, show_default=True,
              help="Every head projects through the target's frozen output layer, or through its own trained copy.")
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
def train_medusa_command(target, data, out, num_heads, layers, shared_lm_head, steps, minutes, batch_size, seq_len,
                         positions, lr, warmup_steps, heldout, device, threads, seed, save_dtype, work, no_progress) -> None:
    """Train Medusa-1 heads for TARGET on text (self-distillation against the target)."""
    if threads:
        torch.set_num_threads(threads)
    cfg = MedusaTrainConfig(target=target, data=list(data), out=out, heads=num_heads, layers=layers,
                            shared_lm_head=shared_lm_head, steps=steps, minutes=minutes, batch_size=batch_size,
                            seq_len=seq_len, positions=positions, lr=lr, warmup_steps=warmup_steps, seed=seed,
                            device=device or ("cuda" if torch.cuda.is_available() else "cpu"), save_dtype=save_dtype,
                            work=work, heldout=list(heldout))
    click.echo(json.dumps(train_medusa(cfg, progress=not no_progress)))
