"""Acceptance of the SmolLM2 EAGLE-3 head on held-out conversations (never trained on).

Prints, on the held-out rows of ``make_smollm2_chat_data.py``:
* teacher-forced top-1 agreement with the target at drafting depths 1-3 (depth k: the head fed
  its own outputs for k-1 steps, as when drafting; rows whose target argmax is outside the draft
  vocabulary count as misses);
* the mean accepted length per step (tau - 1, and tau) of real greedy speculative decoding of the
  held-out user turns with the head under ``chain`` and ``talon``, every output checked against
  plain greedy decoding.

    python scripts/eval_smollm2_eagle.py [--head smollm2-135m-instruct-eagle3] [--prompts 50]
"""

from __future__ import annotations

import json
from pathlib import Path

import click
import torch

import specframe
from specframe.drafters.eagle_train import TrainConfig, head_losses, target_outputs

HERE = Path(__file__).resolve().parent
DEFAULT_HELDOUT = HERE / "smollm2_eagle_heldout.jsonl"


def teacher_forced_agreement(model, tok, head, texts: list[str], ttt_steps: int = 3) -> list[float]:
    """Token-weighted top-1 agreement per drafting depth over ``texts``."""
    cfg = TrainConfig(target="", data=[], out="", steps=1, ttt_steps=ttt_steps)
    totals, rows = [0.0] * ttt_steps, 0
    for text in texts:
        ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
        if ids.shape[1] <= ttt_steps + 1:
            continue
        feats, top, logits = target_outputs(model, ids, head)
        with torch.no_grad():
            _, accs = head_losses(head, feats.float(), top, logits, ids, cfg)
        n = ids.shape[1] - ttt_steps
        totals = [t + a * n for t, a in zip(totals, accs)]
        rows += n
    return [t / rows for t in totals]


def speculative_tau(model, tok, head_path: str, users: list[str], policy: tuple, tokens: int) -> tuple[float, int]:
    """Mean tau over ``users`` (chat template) and how many outputs differ from greedy."""
    dec = specframe.SpecDecoder.build(target=model, drafter=("eagle3", {"path": head_path}), policy=policy,
                                      verifier="greedy")
    emitted = forwards = mismatches = 0
    for user in users:
        ids = tok.apply_chat_template([{"role": "user", "content": user}], add_generation_prompt=True, tokenize=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        out = dec.generate(ids, max_new_tokens=tokens, eos_token_id=tok.eos_token_id)
        # All-ones mask: pad = <|im_end|> sits inside chat prompts, and generate() would mask it.
        ref = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             do_sample=False, max_new_tokens=tokens,
                             eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)[0, len(ids):].tolist()
        mismatches += out.tokens != ref[: len(out.tokens)] or len(out.tokens) != len(ref)
        emitted += len(out.tokens)
        forwards += len(out.steps)
    return emitted / forwards, mismatches


@click.command()
@click.option("--head", "head_path", default="smollm2-135m-instruct-eagle3", show_default=True)
@click.option("--heldout", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=DEFAULT_HELDOUT,
              show_default=True, help="Held-out conversations (JSONL with 'turns' and 'text').")
@click.option("--prompts", type=int, default=50, show_default=True)
@click.option("--tokens", type=int, default=64, show_default=True, help="New tokens per held-out prompt.")
@click.option("--threads", type=int, default=None)
def main(head_path: str, heldout: Path, prompts: int, tokens: int, threads: int | None) -> None:
    """Print the head's held-out agreement and accepted lengths."""
    from transformers import AutoTokenizer

    from specframe.models.assets import resolve_model_path
    from specframe.drafters.eagle_checkpoint import load_head
    from specframe.models.target import load_causal_lm

    if threads:
        torch.set_num_threads(threads)
    path = resolve_model_path("smollm2-135m-instruct")
    model, tok = load_causal_lm(path, dtype="float32"), AutoTokenizer.from_pretrained(path)
    rows = [json.loads(line) for line in heldout.read_text().splitlines() if line.strip()][:prompts]
    head = load_head(head_path, model, kind="eagle3", dtype=torch.float32)
    accs = teacher_forced_agreement(model, tok, head, [r["text"] for r in rows])
    click.echo(f"held-out conversations: {len(rows)} | teacher-forced top-1 agreement at depth 1/2/3: "
               + " / ".join(f"{a:.3f}" for a in accs))
    users = [r["turns"][0] for r in rows]
    for policy in (("chain", {"gamma": 4}), ("talon", {"budget": 16, "mu": 0.03})):
        tau, bad = speculative_tau(model, tok, head_path, users, policy, tokens)
        click.echo(f"eagle3 + {policy[0]}{policy[1]}: tau {tau:.3f} tokens/target forward, mean accepted "
                   f"length {tau - 1:.3f} per step over {len(users)} prompts x {tokens} tokens; "
                   f"outputs differing from greedy: {bad}")


if __name__ == "__main__":
    main()
