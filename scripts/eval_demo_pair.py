#!/usr/bin/env python
"""Evaluate the shipped demo pair (``demo-target`` / ``demo-draft``) and print the figures.

Prints:
* held-out bits/byte of both models: as recorded by the trainer (metrics.json, float32 weights
  before the bf16 save) and recomputed here from the shipped bf16 weights loaded in float32, on
  the same held-out split (files with ``int(sha1(relpath), 16) % 20 == 0`` of this Python's
  stdlib; see scripts/train_demo_pair.py);
* the target's greedy continuations of 3 held-out prompts (examples/prompts/code.jsonl), in full;
* how often greedy continuations of all held-out prompts loop (a line repeated 3+ times), over
  the whole continuation and over the function body alone (cut where a code-completion
  harness would stop);
* greedy next-token agreement of the draft with the target along the target's own greedy
  generations on the held-out prompts;
* tau of a few SpecDecoder arms on 3 prompts, and the asset directory's size (limit 15 MB).

Usage::

    python scripts/eval_demo_pair.py [--assets DIR] [--prompts N] [--new-tokens N] [--eval-tokens N]

Run time on a 2-core CPU: about 3 minutes alone, 8 minutes when the CPU is shared (measured).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
DEFAULT_ASSETS = REPO / "specframe" / "assets" / "demo-pair"
PROMPTS = REPO / "examples" / "prompts" / "code.jsonl"
SIZE_LIMIT_MB = 15.0

# The trainer's split, tokens and evaluation code are the definitions these figures must match.
sys.path.insert(0, str(REPO / "scripts"))
import train_demo_pair as trainer  # noqa: E402


def load_pair(assets: Path):
    """Target, draft (float32) and the shared tokenizer from ``assets``."""
    from transformers import AutoTokenizer

    from specframe.models.target import load_causal_lm

    target = load_causal_lm(str(assets / "target"), dtype="float32")
    draft = load_causal_lm(str(assets / "draft"), dtype="float32")
    return target, draft, AutoTokenizer.from_pretrained(assets / "target")


def recompute_bits_per_byte(models: dict, tok, eval_tokens: int) -> dict[str, float]:
    """Held-out bits/byte of each model with the trainer's own split and evaluation code."""
    _, _, held = trainer.read_split(smoke=False)
    eot = tok.convert_tokens_to_ids(trainer.EOT)
    ids: list[int] = []
    for enc in tok.backend_tokenizer.encode_batch([t for _, t in held], add_special_tokens=False):
        ids.append(eot)
        ids.extend(enc.ids)
    stream = torch.tensor(ids, dtype=torch.int32)
    out = {}
    for name, model in models.items():
        ev = trainer.evaluate(model, stream, tok, seq_len=256, max_tokens=eval_tokens)
        model.eval()  # trainer.evaluate leaves the model in train mode
        out[name] = ev["heldout_bits_per_byte"]
    return out


def greedy(model, ids: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """The model's greedy continuation (new tokens only)."""
    eos = model.generation_config.eos_token_id
    with torch.no_grad():
        out = model.generate(
            ids[None], attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=new_tokens, do_sample=False, eos_token_id=eos, pad_token_id=eos,
        )
    return out[0, len(ids) :]


def function_body(text: str) -> str:
    """``text`` up to the first non-blank line back at column 0: the body of the function the
    prompt opened (HumanEval-style code completions stop at the same place)."""
    lines = text.split("\n")
    for i, line in enumerate(lines[1:], start=1):
        if line.strip() and not line[0].isspace():
            return "\n".join(lines[:i]) + "\n"
    return text


def repetition(texts: list[str]) -> dict[str, int]:
    """How often greedy continuations loop: texts that repeat a complete non-blank line at least
    3 times, and texts that repeat no line at all (an unfinished last line is not counted)."""
    looping = clean = 0
    for text in texts:
        lines = [l.strip() for l in text.split("\n")[:-1] if l.strip()]
        worst = max((lines.count(l) for l in set(lines)), default=0)
        looping += worst >= 3
        clean += worst <= 1
    return {"prompts": len(texts), "looping": looping, "no_repeated_line": clean}


def spec_taus(target, draft_path: str, prompts: list[torch.Tensor], new_tokens: int) -> dict[str, float]:
    """tau (tokens per target forward) of a few arms; also re-checks losslessness."""
    import specframe

    arms = {
        "model x chain(gamma=4)": (("model", {"model": draft_path}), ("chain", {"gamma": 4})),
        "model x talon(N=60)": (("model", {"model": draft_path}), ("talon", {})),
        "ngram x chain(gamma=4)": (("ngram", {}), ("chain", {"gamma": 4})),
        "ngram x talon(N=60)": (("ngram", {}), ("talon", {})),
    }
    refs = [greedy(target, p, new_tokens).tolist() for p in prompts]
    out = {}
    for label, (drafter, policy) in arms.items():
        dec = specframe.SpecDecoder.build(target=target, drafter=drafter, policy=policy)
        emitted = forwards = 0
        for ids, ref in zip(prompts, refs):
            res = dec.generate(ids, max_new_tokens=new_tokens)
            if res.tokens != ref:
                raise AssertionError(f"{label}: speculative output differs from greedy decoding")
            emitted += len(res.tokens)
            forwards += len(res.steps)
        out[label] = emitted / forwards
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--assets", type=Path, default=DEFAULT_ASSETS)
    ap.add_argument("--prompts", type=int, default=20, help="held-out prompts for the agreement")
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--eval-tokens", type=int, default=50_000, help="held-out tokens to recompute bits/byte")
    args = ap.parse_args()
    torch.manual_seed(0)
    t0 = time.time()

    metrics = json.loads((args.assets / "metrics.json").read_text())
    target, draft, tok = load_pair(args.assets)
    params = {w: sum(p.numel() for p in m.parameters()) for w, m in (("target", target), ("draft", draft))}
    print(f"Python (stdlib corpus): {metrics.get('python_version')}, torch {metrics.get('torch_version')}")
    print("\n== held-out bits/byte")
    recomputed = recompute_bits_per_byte({"target": target, "draft": draft}, tok, args.eval_tokens)
    for w in ("target", "draft"):
        m = metrics.get("models", {}).get(w, {})
        print(
            f"{w:6s}: {params[w]:,} params, {m.get('training_tokens_seen', 0):,} training tokens, "
            f"bits/byte {m.get('heldout_bits_per_byte', float('nan')):.4f} (metrics.json, fp32, "
            f"{m.get('heldout_tokens_evaluated', 0):,} tokens) | {recomputed[w]:.4f} (shipped bf16, "
            f"first {args.eval_tokens:,} tokens' windows)"
        )
    gap = recomputed["draft"] - recomputed["target"]
    print(f"draft - target = {gap:.3f} bits/byte (issue asks >= 0.3)")

    lines = [json.loads(l) for l in PROMPTS.read_text().splitlines() if l.strip()]
    prompts = [torch.tensor(tok(p["turns"][0], add_special_tokens=False)["input_ids"]) for p in lines]

    print("\n== target greedy continuations of 3 held-out prompts")
    for p, ids in zip(lines[:3], prompts[:3]):
        text = tok.decode(greedy(target, ids, 128))
        print("=" * 72 + f"\n[question {p['question_id']} ({p['category']})]\n{p['turns'][0]}<<<GENERATED>>>{text}\n")

    # One greedy continuation per prompt serves the repetition count and the agreement.
    continuations = [greedy(target, ids, args.new_tokens) for ids in prompts]
    texts = [tok.decode(new) for new in continuations]
    bodies = [function_body(t) for t in texts]
    for label, rep in (("whole continuations", repetition(texts)), ("function bodies only", repetition(bodies))):
        print(f"== repetition over all {rep['prompts']} held-out prompts x {args.new_tokens} tokens, {label}: "
              f"{rep['looping']} repeat a line 3+ times, {rep['no_repeated_line']} repeat no line")
    ended = sum(b != t for b, t in zip(bodies, texts))
    print(f"   ({ended} of {len(texts)} bodies end within the {args.new_tokens} tokens; "
          f"median body {sorted(len(b.splitlines()) for b in bodies)[len(bodies) // 2]} lines)\n")

    agree, positions = trainer.greedy_agreement(draft, prompts[: args.prompts], continuations[: args.prompts])
    rate = agree / max(1, positions)
    print(f"== draft/target greedy next-token agreement: {rate:.3f} over {positions} positions "
          f"({min(args.prompts, len(prompts))} held-out prompts x {args.new_tokens} tokens; expected 0.5-0.85)")

    print("\n== speculative decoding (3 prompts x 64 tokens, lossless re-checked)")
    for label, tau in spec_taus(target, str(args.assets / "draft"), prompts[:3], 64).items():
        print(f"{label:24s} tau = {tau:.2f}")

    size = sum(f.stat().st_size for f in args.assets.rglob("*") if f.is_file()) / 1e6
    print(f"\n== asset dir {args.assets}: {size:.2f} MB (limit {SIZE_LIMIT_MB} MB): "
          f"{'OK' if size <= SIZE_LIMIT_MB else 'TOO LARGE'}")
    print(f"done in {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
