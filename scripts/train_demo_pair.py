#!/usr/bin/env python
"""Train the tiny demo target/draft Llama pair shipped in ``specframe/assets/demo-pair``.

Both models are Llama-architecture (``transformers.LlamaForCausalLM``) causal LMs
trained from scratch on the CPython standard library's own ``.py`` sources, and
share one byte-level BPE tokenizer (vocabulary 2048, ``<|endoftext|>`` is
bos/eos/pad).

Data
----
* Files: every ``*.py`` under ``sysconfig.get_paths()["stdlib"]`` (recursive,
  sorted by relative POSIX path). Skipped: anything under ``site-packages``, and
  test code (any directory component named ``test``, ``tests`` or
  ``idle_test``; this also removes lib2to3's Python-2 test data). Tests were
  dropped so the training distribution matches the library-code prompts.
  Files that are not valid UTF-8 are skipped.
* Split by file: a file is HELD OUT iff ``int(sha1(relpath).hexdigest(), 16) % 20 == 0``
  (relpath = POSIX path relative to the stdlib dir), about 5% of files.
* Training stream: ``<|endoftext|>`` + file text for each train file, concatenated;
  batches are random contiguous windows (seq len 256) drawn with a seeded generator.
* The tokenizer is trained on the train split only. It does NOT add a BOS token
  automatically (models were trained on random windows, so none is needed).
* Held-out evaluation: up to 200k tokens, as evenly spaced non-overlapping windows
  of the held-out stream (deterministic). bits/byte = total nats / ln 2 / total
  UTF-8 bytes of the predicted tokens (the ``<|endoftext|>`` separator counts as
  one byte).
* ``examples/prompts/code.jsonl``: 50 prompts (Spec-Bench format) taken from the
  held-out, non-test files only: ``def`` line through the docstring's closing
  quotes (dedented to column 0; no trailing newline, see ``extract_prompts``).
  Selected deterministically, round-robin over top-level modules/packages, and
  rewritten on every run (cheap) even when the token streams are cached.

Training
--------
Plain PyTorch float32 loop: AdamW (betas 0.9/0.95, wd 0.1 on matrices), linear
warmup then cosine decay to 10% of peak *by elapsed wall-clock fraction of the time
budget*, grad clip 1.0, one CPU thread per process by default (``--threads``).
Training stops when the accumulated wall-clock training time reaches the budget.
Checkpoints (model + optimizer + RNG + step + elapsed) are written every 5 minutes to
the work dir ``scripts/.demo-train/<which>/ckpt.pt``; re-running the same command
resumes (data prep is cached in the work dir too).

``--which both`` (default) prepares data, then runs target and draft as two
parallel child processes (1 thread each), then a final step that evaluates
greedy generations and the draft/target greedy agreement and writes metrics.json.

Run time (2-core CPU box): data prep ~1-2 min, then the target trains for
``--target-minutes`` (default 60) while the draft trains for ``--draft-minutes``
(default 20) in parallel, then ~2-3 min of evaluation/writing: about 65 minutes
in total with defaults. ``--smoke`` runs everything tiny in well under a minute.
The shipped pair was trained longer by resuming with raised budgets: the target
``--target-minutes 130`` (after 60), the draft ``--draft-minutes 60`` (after 20 and 35):
about 4,300 tokens/s for the target and 10-15k for the draft on one thread each.
``--with-tests --target-size large`` (a 5.3M target on 9.9M tokens, 105 min, about 2,000
tokens/s on one thread and 3,700 on two) reached 1.134 bits/byte but loops as often as the
shipped target under greedy decoding; see ``specframe/assets/demo-pair/README.md``.

Usage::

    nohup python scripts/train_demo_pair.py --which both > scripts/.demo-train/run.log 2>&1 &
    python scripts/train_demo_pair.py --smoke --out /tmp/demo-smoke
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import math
import os
import platform
import random
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "specframe" / "assets" / "demo-pair"
DEFAULT_WORK = REPO / "scripts" / ".demo-train"
DEFAULT_PROMPTS = REPO / "examples" / "prompts" / "code.jsonl"
EOT = "<|endoftext|>"
SEED = 1234
HOLDOUT_MOD = 20
SKIP_DIRS = {"site-packages", "test", "tests", "idle_test", "__pycache__"}
TEST_DIRS = {"test", "tests", "idle_test"}

# ---------------------------------------------------------------- model sizes
TARGET_CFG = dict(hidden_size=192, intermediate_size=512, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=4)
# A larger target for longer runs (--target-size large, ~5M parameters).
TARGET_CFG_LARGE = dict(hidden_size=256, intermediate_size=704, num_hidden_layers=6,
                        num_attention_heads=4, num_key_value_heads=4)
DRAFT_CFG = dict(hidden_size=96, intermediate_size=256, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=4)
SMOKE_TARGET_CFG = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                        num_attention_heads=2, num_key_value_heads=2)
SMOKE_DRAFT_CFG = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=2)

TRAIN_HP = {
    "target": dict(lr=2.5e-3, batch_size=16, seq_len=256, warmup_steps=100,
                   weight_decay=0.1, betas=(0.9, 0.95), grad_clip=1.0, min_lr_frac=0.1),
    "draft": dict(lr=3e-3, batch_size=16, seq_len=256, warmup_steps=100,
                  weight_decay=0.1, betas=(0.9, 0.95), grad_clip=1.0, min_lr_frac=0.1),
}


def log(msg: str, fh=None) -> None:
    line = f"[{time.strftime('%H:%M:%S')}] {msg}"
    print(line, flush=True)
    if fh is not None:
        fh.write(line + "\n")
        fh.flush()


# ---------------------------------------------------------------- data
def skipped_dirs(with_tests: bool) -> set[str]:
    """Directory names whose files never enter the corpus."""
    return SKIP_DIRS - TEST_DIRS if with_tests else SKIP_DIRS


def list_stdlib_files(with_tests: bool = False) -> tuple[Path, list[str]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = skipped_dirs(with_tests)
    rels = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in skip]
        for fn in filenames:
            if fn.endswith(".py"):
                rels.append(Path(dirpath, fn).relative_to(root).as_posix())
    rels.sort()
    return root, rels


def is_heldout(rel: str) -> bool:
    return int(hashlib.sha1(rel.encode("utf-8")).hexdigest(), 16) % HOLDOUT_MOD == 0


def is_test(rel: str) -> bool:
    return any(part in TEST_DIRS for part in rel.split("/")[:-1])


def read_split(smoke: bool, with_tests: bool = False):
    """(stdlib root, train files, held-out files). ``with_tests`` adds the stdlib's test code
    (about 1.6x the library's bytes) to TRAINING only: held-out test files are dropped, so the
    held-out set, its bits/byte and the prompts stay those of the library code."""
    root, rels = list_stdlib_files(with_tests)
    train, held = [], []
    for rel in rels:
        try:
            text = (root / rel).read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            continue
        if not is_heldout(rel):
            train.append((rel, text))
        elif not is_test(rel):
            held.append((rel, text))
    if smoke:
        train, held = train[:60], held[:20]
    return root, train, held


def category_of(rel: str) -> str:
    first = rel.split("/")[0]
    return first[:-3] if first.endswith(".py") else first


def extract_prompts(held, n_max: int = 50, max_chars: int = 600) -> list[dict]:
    """Function signature + docstring prompts from held-out files (deterministic)."""
    by_cat: dict[str, list[str]] = {}
    for rel, text in held:
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        lines = text.splitlines()
        nodes = []
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                nodes.append(node)
            elif isinstance(node, ast.ClassDef):
                nodes.extend(n for n in node.body
                             if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
        for node in nodes:
            if ast.get_docstring(node) is None or len(node.body) < 2:
                continue
            if node.name.startswith("_"):
                continue
            doc = node.body[0]
            indent = node.col_offset
            body_indent = node.body[1].col_offset - indent
            if body_indent <= 0:
                continue
            chunk = lines[node.lineno - 1: doc.end_lineno]
            if not all(l[:indent].strip() == "" for l in chunk):
                continue
            if not chunk[-1].rstrip().endswith(('"""', "'''")):
                continue  # docstring must end its line
            # End exactly at the closing quotes: byte-level BPE merges a newline with the
            # following indent into one token, so a prompt ending in "\n    " puts a token
            # boundary the model never saw in training and it drifts into comment loops.
            prompt = "\n".join(l[indent:].rstrip() for l in chunk)
            if 60 <= len(prompt) < max_chars:
                by_cat.setdefault(category_of(rel), []).append(prompt)
    out: list[dict] = []
    cats = sorted(by_cat)
    i = 0
    while len(out) < n_max and any(by_cat[c] for c in cats):
        for c in cats:
            if i < len(by_cat[c]) and len(out) < n_max:
                out.append({"question_id": len(out), "category": c, "turns": [by_cat[c][i]]})
        i += 1
        if all(i >= len(by_cat[c]) for c in cats):
            break
    return out


def write_prompts(held, path: Path) -> list[dict]:
    """Extract the held-out prompts and write them as Spec-Bench jsonl lines."""
    prompts = extract_prompts(held, n_max=50)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for p in prompts:
            f.write(json.dumps(p) + "\n")
    log(f"wrote {len(prompts)} prompts to {path}")
    return prompts


def train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2,
                                  special_tokens=[EOT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOT, eos_token=EOT,
                                   pad_token=EOT, unk_token=None,
                                   model_max_length=1024)


def prepare(args) -> None:
    """Split, prompts, tokenizer, token streams -> work dir (cached)."""
    import torch

    work = Path(args.work)
    done = work / "prep" / "done.json"
    root, train, held = read_split(args.smoke, args.with_tests)
    # Prompts are rewritten even when the token streams are cached: extraction is cheap
    # and deterministic, so a change to the prompt format needs no re-tokenisation.
    prompts = write_prompts(held, Path(args.prompts))
    if done.exists():
        log(f"prep cached in {work / 'prep'}")
        return
    t0 = time.time()
    (work / "prep").mkdir(parents=True, exist_ok=True)
    log(f"stdlib {root}: {len(train)} train files, {len(held)} held-out files")

    tok = train_tokenizer([t for _, t in train], args.vocab_size)
    tok.save_pretrained(work / "prep" / "tokenizer")
    eot_id = tok.convert_tokens_to_ids(EOT)
    log(f"tokenizer: vocab {len(tok)}, eot id {eot_id} ({time.time() - t0:.0f}s)")

    def stream(files):
        encs = tok.backend_tokenizer.encode_batch([t for _, t in files], add_special_tokens=False)
        ids = []
        for e in encs:
            ids.append(eot_id)
            ids.extend(e.ids)
        return torch.tensor(ids, dtype=torch.int16 if len(tok) < 32000 else torch.int32)

    train_ids, held_ids = stream(train), stream(held)
    torch.save({"train": train_ids, "heldout": held_ids}, work / "prep" / "ids.pt")
    n_bytes = sum(len(t.encode()) for _, t in train)
    info = {"train_files": len(train), "heldout_files": len(held),
            "train_tokens": len(train_ids), "heldout_tokens": len(held_ids),
            "train_bytes": n_bytes, "bytes_per_token": n_bytes / len(train_ids),
            "num_prompts": len(prompts), "stdlib": str(root),
            "heldout_rule": f"int(sha1(relpath),16) % {HOLDOUT_MOD} == 0",
            "skipped_dirs": sorted(skipped_dirs(args.with_tests)),
            "test_code_in_training": args.with_tests, "prep_seconds": time.time() - t0}
    done.write_text(json.dumps(info, indent=1))
    log(f"prep done: {info}")


# ---------------------------------------------------------------- model / training
def model_config(which: str, args, tok):
    from transformers import LlamaConfig

    eot_id = tok.convert_tokens_to_ids(EOT)
    base = (SMOKE_TARGET_CFG if which == "target" else SMOKE_DRAFT_CFG) if args.smoke \
        else ((TARGET_CFG_LARGE if args.target_size == "large" else TARGET_CFG) if which == "target" else DRAFT_CFG)
    return LlamaConfig(vocab_size=len(tok), max_position_embeddings=1024,
                       tie_word_embeddings=True, bos_token_id=eot_id, eos_token_id=eot_id,
                       pad_token_id=eot_id, rms_norm_eps=1e-5, rope_theta=10000.0,
                       attention_bias=False, mlp_bias=False, initializer_range=0.02,
                       hidden_act="silu", **base)


def byte_lengths(tok):
    """UTF-8 byte length of each token id (byte-level BPE: one char == one byte)."""
    import torch

    vocab = tok.backend_tokenizer.get_vocab()
    lens = torch.zeros(len(tok), dtype=torch.float64)
    for s, i in vocab.items():
        lens[i] = 1 if s == EOT else len(s)
    return lens


def evaluate(model, held_ids, tok, seq_len: int, max_tokens: int, batch: int = 16):
    import torch

    lens = byte_lengths(tok)
    n = len(held_ids)
    win = seq_len + 1
    n_win = max(1, min(max_tokens // seq_len, n // win))
    starts = torch.linspace(0, n - win, n_win).long().tolist() if n_win > 1 else [0]
    # make non-overlapping: evenly spaced with spacing >= win since n_win <= n // win
    total_nats, total_bytes, total_tok = 0.0, 0.0, 0
    model.eval()
    with torch.no_grad():
        for b in range(0, len(starts), batch):
            x = torch.stack([held_ids[s:s + win].long() for s in starts[b:b + batch]])
            logits = model(input_ids=x[:, :-1]).logits.float()
            nll = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1), reduction="sum")
            total_nats += nll.item()
            total_bytes += lens[x[:, 1:]].sum().item()
            total_tok += x[:, 1:].numel()
    model.train()
    return {"heldout_tokens_evaluated": total_tok, "heldout_bytes_evaluated": int(total_bytes),
            "heldout_windows": len(starts),
            "heldout_loss_nats_per_token": total_nats / total_tok,
            "heldout_bits_per_byte": total_nats / math.log(2) / total_bytes}


def train_one(which: str, args) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    torch.set_num_threads(args.threads)
    work = Path(args.work)
    wdir = work / which
    wdir.mkdir(parents=True, exist_ok=True)
    result_path = wdir / "result.json"
    if result_path.exists():
        log(f"{which}: already finished ({result_path})")
        return
    logf = open(wdir / "train.log", "a")
    tok = AutoTokenizer.from_pretrained(work / "prep" / "tokenizer")
    data = torch.load(work / "prep" / "ids.pt")
    train_ids, held_ids = data["train"], data["heldout"]
    hp = dict(TRAIN_HP[which])
    if args.smoke:
        hp.update(batch_size=4, seq_len=64, warmup_steps=5)
    budget_s = 60.0 * (args.target_minutes if which == "target" else args.draft_minutes)
    seed = SEED + (0 if which == "target" else 1)

    random.seed(seed)
    torch.manual_seed(seed)
    cfg = model_config(which, args, tok)
    model = LlamaForCausalLM(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": hp["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=hp["lr"], betas=hp["betas"], eps=1e-8)
    gen = torch.Generator().manual_seed(seed)
    step, elapsed, tokens_seen = 0, 0.0, 0
    ckpt_path = wdir / "ckpt.pt"
    if ckpt_path.exists():
        ck = torch.load(ckpt_path, weights_only=False)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        gen.set_state(ck["gen"])
        torch.set_rng_state(ck["torch_rng"])
        step, elapsed, tokens_seen = ck["step"], ck["elapsed"], ck["tokens_seen"]
        log(f"{which}: resumed from step {step}, elapsed {elapsed:.0f}s", logf)
    log(f"{which}: {n_params:,} params, cfg {json.dumps({k: getattr(cfg, k) for k in ('hidden_size', 'intermediate_size', 'num_hidden_layers', 'num_attention_heads', 'vocab_size')})}, "
        f"hp {hp}, budget {budget_s:.0f}s, train tokens {len(train_ids):,}", logf)

    B, T = hp["batch_size"], hp["seq_len"]
    max_start = len(train_ids) - T - 1

    def lr_at(step_, frac):
        if step_ < hp["warmup_steps"]:
            return hp["lr"] * (step_ + 1) / hp["warmup_steps"]
        frac = min(1.0, frac)
        m = hp["min_lr_frac"]
        return hp["lr"] * (m + (1 - m) * 0.5 * (1 + math.cos(math.pi * frac)))

    def save_ckpt():
        tmp = wdir / "ckpt.pt.tmp"
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "gen": gen.get_state(),
                    "torch_rng": torch.get_rng_state(), "step": step, "elapsed": elapsed,
                    "tokens_seen": tokens_seen}, tmp)
        os.replace(tmp, ckpt_path)

    log_every = 5 if args.smoke else 25
    ckpt_every_s = 20 if args.smoke else 300
    model.train()
    seg_start = time.time()
    seg_elapsed0 = elapsed
    last_ckpt = time.time()
    win_loss, win_tok, win_t = 0.0, 0, time.time()
    while elapsed < budget_s:
        starts = torch.randint(0, max_start, (B,), generator=gen)
        x = torch.stack([train_ids[s:s + T + 1].long() for s in starts.tolist()])
        lr = lr_at(step, elapsed / budget_s)
        for g in opt.param_groups:
            g["lr"] = lr
        logits = model(input_ids=x[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)),
                                                 x[:, 1:].reshape(-1))
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), hp["grad_clip"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        tokens_seen += B * T
        win_loss += loss.item()
        win_tok += B * T
        elapsed = seg_elapsed0 + (time.time() - seg_start)
        if step % log_every == 0:
            dt = time.time() - win_t
            log(f"{which} step {step} loss {win_loss / log_every:.4f} lr {lr:.2e} gnorm {gnorm:.2f} "
                f"tok/s {win_tok / dt:.0f} tokens {tokens_seen:,} elapsed {elapsed:.0f}/{budget_s:.0f}s", logf)
            win_loss, win_tok, win_t = 0.0, 0, time.time()
        if time.time() - last_ckpt > ckpt_every_s:
            save_ckpt()
            last_ckpt = time.time()
    save_ckpt()
    log(f"{which}: training done, {step} steps, {tokens_seen:,} tokens, {elapsed:.0f}s; evaluating", logf)
    t0 = time.time()
    ev = evaluate(model, held_ids, tok, T, 4000 if args.smoke else 200_000)
    log(f"{which}: held-out {ev} ({time.time() - t0:.0f}s)", logf)

    out = Path(args.out) / which
    out.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(out)
    tok.save_pretrained(out)
    result = {"parameters": n_params, "training_tokens_seen": tokens_seen, "steps": step,
              "train_wall_seconds": round(elapsed, 1), "seed": seed,
              "model_config": {k: getattr(cfg, k) for k in (
                  "hidden_size", "intermediate_size", "num_hidden_layers",
                  "num_attention_heads", "num_key_value_heads", "vocab_size",
                  "max_position_embeddings", "tie_word_embeddings")},
              "hyperparameters": {**hp, "betas": list(hp["betas"]), "optimizer": "AdamW",
                                  "schedule": "linear warmup, cosine decay over wall-clock budget",
                                  "budget_seconds": budget_s, "torch_threads": args.threads,
                                  "train_dtype": "float32", "saved_dtype": "bfloat16"},
              **ev}
    result_path.write_text(json.dumps(result, indent=1))
    log(f"{which}: saved to {out}", logf)


# ---------------------------------------------------------------- final checks
def greedy_agreement(draft, prompts: list, continuations: list) -> tuple[int, int]:
    """(agreeing positions, positions): where the draft's argmax equals the target's token along
    the target's own greedy ``continuations`` of ``prompts`` (1-D token tensors)."""
    import torch

    agree = total = 0
    for ids, new in zip(prompts, continuations):
        if len(new) == 0:
            continue
        with torch.no_grad():
            pred = draft(input_ids=torch.cat([ids, new])[None]).logits[0, len(ids) - 1 : -1].argmax(-1)
        agree += int((pred == new).sum())
        total += len(new)
    return agree, total


def finalize(args) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    torch.set_num_threads(1)
    work, out = Path(args.work), Path(args.out)
    results = {w: json.loads((work / w / "result.json").read_text())
               for w in ("target", "draft") if (work / w / "result.json").exists()}
    prompts = [json.loads(l) for l in Path(args.prompts).read_text().splitlines() if l.strip()]
    prep = json.loads((work / "prep" / "done.json").read_text())
    metrics = {"python_version": platform.python_version(),
               "torch_version": torch.__version__, "data": prep,
               "tokenizer": {"type": "byte-level BPE (tokenizers)", "vocab_size": None,
                             "special_tokens": [EOT], "adds_bos": False},
               "models": results}
    have = [w for w in ("target", "draft") if (out / w / "config.json").exists()]
    if "target" in have:
        tok = AutoTokenizer.from_pretrained(out / "target")
        metrics["tokenizer"]["vocab_size"] = len(tok)
        target = LlamaForCausalLM.from_pretrained(out / "target", dtype=torch.float32).eval()
        draft = (LlamaForCausalLM.from_pretrained(out / "draft", dtype=torch.float32).eval()
                 if "draft" in have else None)
        eot = tok.convert_tokens_to_ids(EOT)
        n_new = 16 if args.smoke else 96
        samples, prompt_ids, continuations = [], [], []
        for p in prompts[:10]:
            ids = torch.tensor(tok(p["turns"][0], add_special_tokens=False)["input_ids"])
            with torch.no_grad():
                g = target.generate(input_ids=ids[None], attention_mask=torch.ones_like(ids[None]),
                                    max_new_tokens=n_new, do_sample=False, pad_token_id=eot)
            prompt_ids.append(ids)
            continuations.append(g[0, len(ids):])
            if len(samples) < 3:
                samples.append({"question_id": p["question_id"], "prompt": p["turns"][0],
                                "target_greedy": tok.decode(continuations[-1])})
        agree, total = greedy_agreement(draft, prompt_ids, continuations) if draft is not None else (0, 0)
        for s in samples:
            print("=" * 70 + f"\nPROMPT {s['question_id']}:\n{s['prompt']}\n--- target greedy:\n{s['target_greedy']}\n", flush=True)
        metrics["target_greedy_samples"] = samples
        if total:
            metrics["draft_target_greedy_agreement"] = {
                "rate": agree / total, "positions": total, "prompts": min(10, len(prompts)),
                "new_tokens_per_prompt": n_new,
                "definition": "fraction of positions along the target's own greedy generation "
                              "where the draft's argmax equals the target's token"}
            log(f"draft/target greedy next-token agreement: {agree / total:.3f} over {total} positions")
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    log(f"wrote {out / 'metrics.json'}; asset dir {size / 1e6:.2f} MB")


# ---------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--which", choices=["target", "draft", "both"], default="both")
    ap.add_argument("--target-minutes", type=float, default=60.0)
    ap.add_argument("--draft-minutes", type=float, default=20.0)
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument("--work", default=None, help="work/checkpoint dir (default scripts/.demo-train)")
    ap.add_argument("--prompts", default=None, help="prompts jsonl (default examples/prompts/code.jsonl)")
    ap.add_argument("--vocab-size", type=int, default=2048)
    ap.add_argument("--smoke", action="store_true", help="tiny end-to-end check (<1 min)")
    ap.add_argument("--with-tests", action="store_true",
                    help="also train on the stdlib's test code (held-out set and prompts unchanged); "
                         "use a fresh --work dir: the tokenizer changes")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads per training process (1: target and draft in parallel on 2 cores)")
    ap.add_argument("--target-size", choices=["small", "large"], default="small",
                    help="small: 2.2M parameters (the shipped target); large: about 5M")
    ap.add_argument("--stage", choices=["all", "train"], default="all", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.smoke:
        if args.out == str(DEFAULT_OUT):
            ap.error("--smoke needs --out pointing at a scratch dir")
        # Seconds of training: the smoke run checks the pipeline end to end, not the models.
        args.target_minutes = min(args.target_minutes, 0.05)
        args.draft_minutes = min(args.draft_minutes, 0.05)
        args.vocab_size = min(args.vocab_size, 512)
    args.work = args.work or (str(Path(args.out) / ".work") if args.smoke else str(DEFAULT_WORK))
    args.prompts = args.prompts or (str(Path(args.out) / "prompts" / "code.jsonl") if args.smoke
                                    else str(DEFAULT_PROMPTS))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    if args.stage == "train":
        train_one(args.which, args)
        return
    t0 = time.time()
    prepare(args)
    if args.which == "both":
        base = [sys.executable, __file__, "--stage", "train", "--out", args.out, "--work", args.work,
                "--prompts", args.prompts, "--vocab-size", str(args.vocab_size),
                "--target-minutes", str(args.target_minutes), "--draft-minutes", str(args.draft_minutes)]
        base += ["--target-size", args.target_size, "--threads", str(args.threads)] + (["--with-tests"] if args.with_tests else [])
        if args.smoke:
            base.append("--smoke")
        procs = {w: subprocess.Popen(base + ["--which", w]) for w in ("target", "draft")}
        log("children: " + ", ".join(f"{w} pid {p.pid}" for w, p in procs.items()))
        rcs = {w: p.wait() for w, p in procs.items()}
        if any(rcs.values()):
            sys.exit(f"training child failed: {rcs}")
    else:
        train_one(args.which, args)
    finalize(args)
    log(f"all done in {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
