"""Train an EAGLE-1/2 or EAGLE-3 head for any causal LM target by self-distillation.

Labels come from the target itself (its next-token distribution, and for EAGLE-1/2 its
final-normed features), inputs from plain text. Training unrolls ``ttt_steps`` drafting steps
("training-time test", EAGLE-3): at step k the head is fed its own outputs of step k-1, with the
tree-attention pattern it meets when drafting (row i of step k sees the committed pairs up to i
and its own earlier steps at row i), at rotary position i + k.

Loss per step k (weighted 0.8**k as in EAGLE-3): cross-entropy against the target's distribution
(EAGLE-3: restricted to the draft vocabulary, rows whose target argmax falls outside it masked
out) plus, for EAGLE-1/2, ``v_weight`` x smooth-L1 feature regression (``p_weight`` scales the CE).

The result is written in the published layout (:mod:`specframe.drafters.eagle_checkpoint`);
training state (head, optimizer, RNG, step, elapsed time) sits in a work directory and a rerun
of the same command resumes from it (:mod:`specframe.drafters.training`, the loop both head
trainers share).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

import click
import torch
import torch.nn.functional as F

from .training import (StepResult, TrainingSettings, load_frozen_target, recent_means, run_training,
                       sample_windows)

TEXT_SUFFIXES = (".py", ".txt", ".md", ".rst")


@dataclass(kw_only=True)
class TrainConfig(TrainingSettings):
    """Everything an EAGLE training run depends on (stored with the state; a resume must match it)."""

    kind: str = "eagle3"
    batch_size: int = 8
    ttt_steps: int = 3
    warmup_steps: int = 50
    weight_decay: float = 0.0
    p_weight: float = 0.1
    v_weight: float = 1.0
    draft_vocab_size: int | None = None
    aux_layer_ids: list[int] | None = None
    intermediate_size: int | None = None
    lm_head_init: str = "target"
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in ("eagle", "eagle3"):
            raise click.BadParameter(f"kind must be eagle or eagle3, got {self.kind!r}", param_hint="--kind")
        super().__post_init__()
        if self.lm_head_init not in ("target", "random"):
            raise click.BadParameter(f"must be target or random, got {self.lm_head_init!r}", param_hint="--lm-head-init")
        if self.ttt_steps < 1:
            raise click.BadParameter(f"must be >= 1, got {self.ttt_steps}", param_hint="--ttt-steps")


# ---------------------------------------------------------------------- data
def read_texts(paths: Iterable[str | os.PathLike]) -> list[str]:
    """Texts from files/directories: ``.jsonl`` (``text``, ``turns``, ``prompt`` or ``content``
    per line), text files read whole; directories recursively (``.py .txt .md .rst .jsonl``)."""
    texts: list[str] = []
    for raw in paths:
        path = Path(raw).expanduser()
        if not path.exists():
            raise click.BadParameter(f"{path} does not exist", param_hint="--data")
        files = sorted(p for p in path.rglob("*") if p.suffix in TEXT_SUFFIXES + (".jsonl",)) if path.is_dir() else [path]
        for file in files:
            if file.suffix == ".jsonl":
                texts.extend(_jsonl_texts(file))
            else:
                try:
                    texts.append(file.read_text(encoding="utf-8"))
                except UnicodeDecodeError:
                    continue
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise click.BadParameter(f"no text found in {list(map(str, paths))}", param_hint="--data")
    return texts


def _jsonl_texts(file: Path) -> list[str]:
    out = []
    for n, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        value = next((row[k] for k in ("text", "turns", "prompt", "content") if k in row), None)
        if value is None:
            raise click.BadParameter(f"{file}:{n}: no 'text', 'turns', 'prompt' or 'content' field", param_hint="--data")
        out.append("\n".join(value) if isinstance(value, list) else str(value))
    return out


def token_stream(texts: list[str], tokenizer: Any) -> torch.Tensor:
    """One long stream: EOS (as a document separator) + tokens of each text."""
    sep = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.bos_token_id
    ids: list[int] = []
    for enc in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        if sep is not None:
            ids.append(int(sep))
        ids.extend(enc)
    return torch.tensor(ids, dtype=torch.long)


def frequent_tokens(stream: torch.Tensor, vocab_size: int, k: int) -> torch.Tensor:
    """The ``k`` most frequent target ids in the stream (EAGLE-3's draft vocabulary), ties by id."""
    counts = torch.bincount(stream, minlength=vocab_size).to(torch.float64)
    # A tiny id-dependent tie-breaker keeps the choice deterministic; unseen ids come last.
    order = torch.argsort(counts - torch.arange(vocab_size, dtype=torch.float64) * 1e-9, descending=True)
    return order[:k]


# ---------------------------------------------------------------------- loss
def ttt_mask(step: int, rows: int, device: torch.device) -> torch.Tensor:
    """Mask ``[1, T, (step + 1) T]`` of TTT step ``step``: causal over step 0, diagonal after."""
    eye = torch.eye(rows, dtype=torch.bool, device=device)
    causal = torch.ones(rows, rows, dtype=torch.bool, device=device).tril()
    return torch.cat([causal] + [eye] * step, dim=1)[None] if step else causal[None]


def head_losses(head: Any, feats: torch.Tensor, top: torch.Tensor, logits_t: torch.Tensor,
                tokens: torch.Tensor, cfg: TrainConfig) -> tuple[torch.Tensor, list[float]]:
    """Weighted TTT loss and per-step top-1 agreement with the target.

    ``tokens`` ``[B, N]``; ``feats`` ``[B, N, F]`` the head's target features at each position;
    ``top`` ``[B, N, H]`` the target's final-normed features; ``logits_t`` ``[B, N, V]`` the
    target's logits. With ``K = cfg.ttt_steps`` the head trains on ``T = N - K`` rows.
    """
    b, n = tokens.shape
    steps = cfg.ttt_steps
    rows = n - steps
    draft_ids = head.draft_ids
    x, past, from_target = feats[:, :rows], None, True
    total = feats.new_zeros(())
    accs: list[float] = []
    # Step k's labels are a shifted slice of the same positions: reduce the [B, N, V] target
    # logits (hundreds of MB for a 49k vocabulary) once, not once per step.
    with torch.no_grad():
        logits_t = logits_t[:, 1:].float()
        all_keep = head.t2d[logits_t.argmax(-1)] if head.kind == "eagle3" else torch.ones_like(logits_t[..., 0], dtype=torch.bool)
        all_probs = torch.softmax(logits_t[..., draft_ids] if head.kind == "eagle3" else logits_t, dim=-1)
    for k in range(steps):
        sl = slice(1 + k, 1 + k + rows)
        positions = (torch.arange(rows, device=tokens.device) + k)[None].expand(b, rows)
        hidden, past = head(tokens[:, sl], x, positions, ttt_mask(k, rows, tokens.device), past, from_target)
        logp = torch.log_softmax(head.logits(hidden).float(), dim=-1)
        keep, probs = all_keep[:, k : k + rows], all_probs[:, k : k + rows]
        ce = -((probs * logp).sum(-1) * keep).sum() / keep.numel()
        loss = ce
        if head.kind == "eagle":
            reg = F.smooth_l1_loss(hidden.float(), top[:, sl].float(), reduction="none").mean(-1).mean()
            loss = cfg.v_weight * reg + cfg.p_weight * ce
        total = total + (0.8 ** k) * loss
        accs.append(float(((logp.argmax(-1) == probs.argmax(-1)) & keep).float().mean()))
        x, from_target = hidden, False
    return total, accs


def target_outputs(model: Any, tokens: torch.Tensor, head: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The target's features for the head, its final-normed features and its logits (no grad)."""
    with torch.no_grad():
        out = model(input_ids=tokens, output_hidden_states=True)
        return head.features(out.hidden_states), out.hidden_states[-1], out.logits


# ---------------------------------------------------------------------- training loop
def _new_head(cfg: TrainConfig, model: Any, stream: torch.Tensor) -> Any:
    from .eagle_checkpoint import random_head, set_draft_vocab

    vocab = int(model.get_output_embeddings().weight.shape[0])
    dv = cfg.draft_vocab_size or (vocab if vocab <= 4096 else min(vocab, 32000))
    head = random_head(model, cfg.kind, seed=cfg.seed, draft_vocab_size=dv if cfg.kind == "eagle3" else None,
                       std=0.02, aux_layer_ids=tuple(cfg.aux_layer_ids) if cfg.aux_layer_ids else None,
                       intermediate_size=cfg.intermediate_size)
    with torch.no_grad():
        for name, param in head.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            elif name.endswith("bias"):
                param.zero_()
    if cfg.kind == "eagle3":
        set_draft_vocab(head, frequent_tokens(stream, vocab, dv))
        if cfg.lm_head_init == "target":
            _copy_target_output_layer(head, model)
    return head.float().train()


def _copy_target_output_layer(head: Any, model: Any) -> None:
    """Start the EAGLE-3 head's norm and lm_head from the target's final norm and the rows of its
    output layer for the draft vocabulary: the head then only has to learn to produce last-layer
    features, not a new output space, which matters when CPU training sees few tokens."""
    with torch.no_grad():
        head.lm_head.weight.copy_(model.get_output_embeddings().weight[head.draft_ids.to("cpu")])
        norm = getattr(getattr(model, "model", None), "norm", None)
        if norm is not None and getattr(norm, "weight", None) is not None and norm.weight.shape == head.norm.weight.shape:
            head.norm.weight.copy_(norm.weight)


def train(cfg: TrainConfig, progress: bool = True) -> dict:
    """Run (or resume) training; write the head to ``cfg.out``; return a summary dict."""
    from .eagle_checkpoint import save_head

    torch.manual_seed(cfg.seed)
    model, tokenizer = load_frozen_target(cfg)
    stream = token_stream(read_texts(cfg.data), tokenizer)
    window = cfg.seq_len + cfg.ttt_steps
    if len(stream) <= window:
        raise click.BadParameter(f"the data has {len(stream)} tokens, need more than {window} (--seq-len + --ttt-steps)",
                                 param_hint="--data")
    head = _new_head(cfg, model, stream).to(cfg.device)
    opt = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    gen = torch.Generator().manual_seed(cfg.seed)

    def step() -> StepResult:
        tokens = sample_windows(stream, window, cfg.batch_size, gen, cfg.device)
        return head_losses(head, *target_outputs(model, tokens, head), tokens, cfg)

    state = run_training(cfg, head, "head", opt, gen, step,
                         lambda: save_head(head, cfg.out, dtype=getattr(torch, cfg.save_dtype)),
                         f"train-eagle {cfg.kind}", cfg.batch_size * cfg.seq_len, progress)
    loss, accs = recent_means(state["history"], cfg.ttt_steps)
    summary = {"kind": cfg.kind, "steps": state["step"], "tokens": state["tokens"],
               "train_seconds": round(state["elapsed"], 1), "out": str(cfg.out), "loss_recent": loss, "acc_recent": accs}
    Path(cfg.out, "training.json").write_text(json.dumps({"summary": summary, "config": asdict(cfg)}, indent=1) + "\n")
    return summary


# ---------------------------------------------------------------------- command line
@click.command("train-eagle")
@click.option("--target", required=True, help="Target model: local path, hub id or shipped name (demo-target).")
@click.option("--data", required=True, multiple=True, help="Text: .jsonl (text/turns/prompt), text files or directories. Repeatable.")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Output directory (published EAGLE layout).")
@click.option("--kind", type=click.Choice(["eagle", "eagle3"]), default="eagle3", show_default=True)
@click.option("--steps", type=int, default=None, help="Stop after this many optimizer steps.")
@click.option("--minutes", type=float, default=None, help="Stop after this much training wall time (cosine LR follows it).")
@click.option("--batch-size", type=int, default=8, show_default=True)
@click.option("--seq-len", type=int, default=256, show_default=True)
@click.option("--ttt-steps", type=int, default=3, show_default=True, help="Drafting steps unrolled in training.")
@click.option("--lr", type=float, default=1e-3, show_default=True)
@click.option("--warmup-steps", type=int, default=50, show_default=True)
@click.option("--draft-vocab-size", type=int, default=None, help="EAGLE-3 draft vocabulary (most frequent tokens).")
@click.option("--aux-layers", default=None, help="EAGLE-3 feature layers, e.g. '2,16,29' (default 2, L//2, L-3).")
@click.option("--intermediate-size", type=int, default=None, help="Head MLP width (default: the target's).")
@click.option("--device", default=None, help="cpu, cuda, ... (default: cuda when available).")
@click.option("--threads", type=int, default=None, help="torch CPU threads.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--save-dtype", type=click.Choice(["float16", "bfloat16", "float32"]), default="float16", show_default=True)
@click.option("--lm-head-init", type=click.Choice(["target", "random"]), default="target", show_default=True,
              help="EAGLE-3: start norm and lm_head from the target's final norm and output rows, or at random.")
@click.option("--work", default=None, help="Training-state directory (default OUT/.train-state); rerun to resume.")
@click.option("--no-progress", is_flag=True, help="Plain output (no progress bar).")
def train_eagle_command(target, data, out, kind, steps, minutes, batch_size, seq_len, ttt_steps, lr, warmup_steps,
                        draft_vocab_size, aux_layers, intermediate_size, device, threads, seed, save_dtype, lm_head_init,
                        work, no_progress) -> None:
    """Train an EAGLE-1/2 or EAGLE-3 draft head for TARGET on text (self-distillation)."""
    if threads:
        torch.set_num_threads(threads)
    layer_ids = [int(x) for x in aux_layers.split(",")] if aux_layers else None
    cfg = TrainConfig(target=target, data=list(data), out=out, kind=kind, steps=steps, minutes=minutes,
                      batch_size=batch_size, seq_len=seq_len, ttt_steps=ttt_steps, lr=lr, warmup_steps=warmup_steps,
                      draft_vocab_size=draft_vocab_size, aux_layer_ids=layer_ids, intermediate_size=intermediate_size,
                      seed=seed, device=device or ("cuda" if torch.cuda.is_available() else "cpu"),
                      save_dtype=save_dtype, work=work, lm_head_init=lm_head_init)
    summary = train(cfg, progress=not no_progress)
    click.echo(json.dumps(summary))
