"""The resumable training loop the head trainers share (``train-eagle``, ``train-medusa``).

A trainer gives a module, its optimizer and data generator, one optimizer step as a function and
a way to write its result; :func:`run_training` resumes from ``cfg.work_dir/state.pt`` when it
exists (refusing, with the differing settings named, one made with other settings), runs steps
until ``cfg.steps`` or ``cfg.minutes`` of training time (whichever ends first), sets each step's
learning rate on the cosine schedule, shows progress, and saves the state and the result every
``cfg.checkpoint_every_s`` seconds and at the end, so a killed run loses at most that much.

The state file holds tensors and plain values only (the RNG state is a uint8 tensor, the
history lists of numbers), so :func:`load_state` can read it with ``weights_only=True`` and
refuse a file that could run code.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import click
import torch

@dataclass(kw_only=True)
class TrainingSettings:
    """What every head trainer's run takes: the target, the data, where the result and the
    state go, the budget and the optimizer schedule. A trainer's config adds its own fields."""

    target: str
    data: list[str]
    out: str
    steps: int | None = None
    minutes: float | None = None
    batch_size: int = 4
    seq_len: int = 256
    lr: float = 1e-3
    warmup_steps: int = 20
    min_lr_frac: float = 0.1
    grad_clip: float = 0.5
    seed: int = 0
    device: str = "cpu"
    save_dtype: str = "float16"
    work: str | None = None
    checkpoint_every_s: float = 120.0

    #: Fields a resume may change (budgets, paths, the device, the output's dtype).
    RESUMABLE = frozenset({"steps", "minutes", "out", "work", "device", "checkpoint_every_s", "save_dtype"})

    def __post_init__(self) -> None:
        if not self.steps and not self.minutes:
            raise click.BadParameter("give --steps or --minutes (or both: whichever ends first)", param_hint="--steps")

    @property
    def work_dir(self) -> Path:
        """Where the resumable training state lives (default ``OUT/.train-state``)."""
        return Path(self.work) if self.work else Path(self.out) / ".train-state"

    def resume_key(self) -> dict:
        """Fields that must match to resume, as JSON values: the state file stores it and must
        load with ``torch.load(weights_only=True)``, and a tuple given for a list must compare
        equal to the list that comes back."""
        return json.loads(json.dumps({k: v for k, v in asdict(self).items() if k not in self.RESUMABLE}, default=str))


#: What a trainer's batch gives: its loss (a tensor to back-propagate) and its per-depth (or
#: per-head) top-1 agreements.
StepResult = tuple[torch.Tensor, list[float]]


def load_frozen_target(cfg: TrainingSettings) -> tuple[Any, Any]:
    """The target ``cfg.target`` in float32 on ``cfg.device`` with every weight frozen (heads
    learn from it, never it from them), and its tokenizer."""
    from specframe.models.assets import resolve_model_path
    from specframe.models.target import load_causal_lm
    from specframe.models.tokenizer import load_tokenizer

    path = resolve_model_path(cfg.target)
    model = load_causal_lm(path, dtype="float32", device=cfg.device, attn_implementation="sdpa")
    for p in model.parameters():
        p.requires_grad_(False)
    return model, load_tokenizer(path)


def cosine_lr(cfg: Any, step: int, frac: float) -> float:
    """Linear warm-up over ``cfg.warmup_steps``, then cosine from ``cfg.lr`` down to
    ``cfg.min_lr_frac`` of it over the run's fraction ``frac`` (of steps or minutes)."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    m = cfg.min_lr_frac
    return cfg.lr * (m + (1 - m) * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def load_state(path: Path, device: str) -> dict:
    """The training state saved in ``path``, read with ``torch.load(weights_only=True)``: it holds
    tensors and plain values only, and a file that holds anything else (pickled objects, which
    could run code) is refused with the way out."""
    try:
        return torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError as err:
        # torch's message is a page of advice; its one line naming the object is what matters here.
        lines = str(err).splitlines()
        why = next((ln.strip() for ln in lines if "Unsupported global" in ln), lines[0].strip() if lines else "")
        raise click.ClickException(f"{path} holds more than tensors and plain values ({why}); "
                                   "delete it or use another --work directory") from None


def progress_bar(label: str, unit: str, enabled: bool) -> Any:
    """A rich progress bar for a training run (disabled: prints nothing)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    return Progress(TextColumn(f"[bold]{label}[/]"), BarColumn(),
                    TextColumn("{task.completed:.0f}/{task.total:.0f} " + unit), TextColumn("{task.description}"),
                    TimeElapsedColumn(), TimeRemainingColumn(), disable=not enabled)


def run_training(cfg: Any, module: torch.nn.Module, key: str, opt: torch.optim.Optimizer, gen: torch.Generator,
                 step: Callable[[], StepResult], write: Callable[[], None], label: str,
                 tokens_per_step: int, progress: bool = True) -> dict:
    """Resume (or start) and run the loop (module docstring); returns the state:
    ``{"step", "elapsed", "tokens", "history": [[step, loss, *agreements], ...]}``.

    ``key`` names the module in the state file; ``step()`` draws a batch and returns its loss
    (the loop back-propagates it, clips the gradient of the module's trainable parameters to
    ``cfg.grad_clip`` and steps ``opt``); ``write()`` writes the result (the trained module) to
    ``cfg.out``."""
    state: dict = {"step": 0, "elapsed": 0.0, "tokens": 0, "history": []}
    state_path = cfg.work_dir / "state.pt"
    if state_path.exists():
        saved = load_state(state_path, cfg.device)
        if saved["config"] != cfg.resume_key():
            diff = sorted(k for k in cfg.resume_key() if saved["config"].get(k) != cfg.resume_key()[k])
            raise click.ClickException(f"{state_path} was made with different settings ({', '.join(diff)}); "
                                       "use another --work directory or delete it")
        module.load_state_dict(saved[key])
        opt.load_state_dict(saved["opt"])
        gen.set_state(saved["gen"])
        state = saved["state"]

    def save() -> None:
        cfg.work_dir.mkdir(parents=True, exist_ok=True)
        tmp = state_path.with_suffix(".tmp")
        torch.save({"config": cfg.resume_key(), key: module.state_dict(), "opt": opt.state_dict(),
                    "gen": gen.get_state(), "state": state}, tmp)
        os.replace(tmp, state_path)
        write()

    params = [p for p in module.parameters() if p.requires_grad]
    budget_s = 60.0 * cfg.minutes if cfg.minutes else float("inf")
    max_steps = cfg.steps or (1 << 62)
    bar = progress_bar(label, "steps" if cfg.steps else "s", progress)
    task = bar.add_task("train", total=cfg.steps or budget_s, completed=state["step"] if cfg.steps else state["elapsed"])
    last_save, seg_start, seg_elapsed = time.time(), time.time(), state["elapsed"]
    with bar:
        while state["step"] < max_steps and state["elapsed"] < budget_s:
            for group in opt.param_groups:
                group["lr"] = cosine_lr(cfg, state["step"], max(state["step"] / max_steps, state["elapsed"] / budget_s))
            loss_t, agree = step()
            loss_t.backward()
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            loss = loss_t.item()
            state["step"] += 1
            state["tokens"] += tokens_per_step
            state["elapsed"] = seg_elapsed + time.time() - seg_start
            state["history"].append([state["step"], round(loss, 4)] + [round(a, 4) for a in agree])
            bar.update(task, completed=state["step"] if cfg.steps else min(state["elapsed"], budget_s),
                       description=f"loss {loss:.3f} top-1 " + "/".join(f"{a:.2f}" for a in agree))
            if time.time() - last_save > cfg.checkpoint_every_s:
                save()
                last_save = time.time()
    save()
    return state


def sample_windows(stream: torch.Tensor, window: int, batch: int, gen: torch.Generator, device: str) -> torch.Tensor:
    """``[batch, window]`` token windows of ``stream`` at starts drawn from ``gen``."""
    starts = torch.randint(0, len(stream) - window, (batch,), generator=gen)
    return torch.stack([stream[s : s + window] for s in starts.tolist()]).to(device)


def recent_means(history: list[list[float]], columns: int, last: int = 50) -> tuple[float, list[float]]:
    """Mean loss and mean of each agreement column over the last ``last`` history rows."""
    recent = history[-last:]
    n = max(1, len(recent))
    return round(sum(h[1] for h in recent) / n, 4), [round(sum(h[2 + k] for h in recent) / n, 4) for k in range(columns)]
