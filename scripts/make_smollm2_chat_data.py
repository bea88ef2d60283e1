"""Self-distilled chat data for SmolLM2-135M-Instruct's EAGLE-3 head (no dataset hub needed).

Magpie (Xu et al. 2024, "Magpie: Alignment Data Synthesis from Scratch by Prompting Aligned
LLMs with Nothing"): the chat template's user prefix alone makes an instruction-tuned model write
a user turn; the same model's greedy answer to it is exactly what a greedy speculative decoder
must predict. Half the user turns start from a category word (summarize, rewrite, extract, ...)
so that every Spec-Bench category is covered.

Rows are appended to ``OUT/train.jsonl`` (and the first ``--held-out`` to ``OUT/heldout.jsonl``,
never trained on) as they are made, so a killed run resumes where it stopped.

    python scripts/make_smollm2_chat_data.py --out scripts/.smollm2-data --conversations 1500
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

import click
import torch

SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
USER = "<|im_start|>user\n"
ASSISTANT = "<|im_end|>\n<|im_start|>assistant\n"
# Category seeds: the first words of a user turn (the model writes the rest).
SEEDS = [
    "Write", "Write a short story about", "Write a poem about", "Write an email to", "Write a Python function",
    "Write a function that", "Fix this code:", "Explain", "What is", "How do", "Why does", "Who was",
    "Summarize the following text:", "Summarize this paragraph:", "Rewrite the following sentence",
    "Rewrite this paragraph", "Paraphrase", "Translate", "Extract", "List all the", "Find the names in",
    "Solve", "Calculate", "If a train", "What is the sum of", "Give me", "Compare", "Describe",
]


def _load(model_name: str):
    from transformers import AutoTokenizer

    from specframe.models.assets import resolve_model_path
    from specframe.models.target import load_causal_lm

    path = resolve_model_path(model_name)
    return load_causal_lm(path, dtype="float32"), AutoTokenizer.from_pretrained(path)


def _generate(model, tok, texts: list[str], max_new: int, sample: bool, seed: int) -> list[tuple[str, bool]]:
    """Continuations of ``texts`` and whether each ended with EOS (else it hit ``max_new``)."""
    tok.padding_side = "left"
    batch = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    torch.manual_seed(seed)
    kwargs = dict(do_sample=True, temperature=1.0, top_p=0.95) if sample else dict(do_sample=False)
    with torch.inference_mode():
        out = model.generate(**batch, max_new_tokens=max_new, eos_token_id=tok.eos_token_id,
                             pad_token_id=tok.pad_token_id or tok.eos_token_id, **kwargs)
    new = out[:, batch["input_ids"].shape[1]:]
    ended = (new == tok.eos_token_id).any(dim=1).tolist()
    return list(zip(tok.batch_decode(new, skip_special_tokens=True), ended))


@click.command()
@click.option("--model", default="smollm2-135m-instruct", show_default=True)
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True)
@click.option("--conversations", type=int, default=1500, show_default=True)
@click.option("--held-out", type=int, default=60, show_default=True, help="First conversations kept for evaluation only.")
@click.option("--batch", type=int, default=24, show_default=True)
@click.option("--user-tokens", type=int, default=96, show_default=True)
@click.option("--answer-tokens", type=int, default=256, show_default=True)
@click.option("--threads", type=int, default=None)
def main(model: str, out: Path, conversations: int, held_out: int, batch: int, user_tokens: int,
         answer_tokens: int, threads: int | None) -> None:
    """Write Magpie-style conversations of the target with itself."""
    if threads:
        torch.set_num_threads(threads)
    out.mkdir(parents=True, exist_ok=True)
    files = [out / "heldout.jsonl", out / "train.jsonl"]
    done = sum(len(f.read_text().splitlines()) for f in files if f.exists())
    lm, tok = _load(model)
    t0, made = time.time(), 0
    while done < conversations:
        rng = random.Random(done)  # row index seeds everything: a resumed run makes the same rows
        starts = [rng.choice(SEEDS) + " " if rng.random() < 0.5 else "" for _ in range(batch)]
        users = _generate(lm, tok, [SYSTEM + USER + s for s in starts], user_tokens, True, done)
        keep = [(s + u).strip() for s, (u, ended) in zip(starts, users) if ended and len(u) > 8]
        answers = _generate(lm, tok, [SYSTEM + USER + u + ASSISTANT for u in keep], answer_tokens, False, done)
        for user, (answer, ended) in zip(keep, answers):
            if done >= conversations:
                break
            target = files[0] if done < held_out else files[1]
            row = {"question_id": done, "turns": [user], "answer": answer.strip(),
                   "text": SYSTEM + USER + user + ASSISTANT + answer.strip() + ("<|im_end|>\n" if ended else "")}
            with target.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps(row) + "\n")
            done += 1
            made += 1
        rate = made / (time.time() - t0)
        print(f"{done}/{conversations} conversations ({rate * 60:.1f}/min)", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
