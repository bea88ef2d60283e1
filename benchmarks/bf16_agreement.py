"""How far bf16 linears move the model: greedy agreement and the NLL gap against float32 on an
experiment's prompts (the demo's by default).

bf16 linears (:mod:`specframe.models.bf16_linear`) make another model: speculative decoding on
it is lossless against *its* greedy decoding, not float32's. This measures the change once:

    python benchmarks/bf16_agreement.py [--config examples/demo.toml] [--tokens 64] [--limit N]

For every prompt (the chat template as the experiment applies it) it decodes greedily with the
float32 model and with the bf16 one, then prints how many answers are identical, the mean length
of the common prefix, and the NLL per token of the float32 answer under each model (the gap is
bf16's minus float32's). Accuracy, not timing: it may run on a busy machine.
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import torch

from specframe.experiments.config import load_config
from specframe.experiments.data import PromptEncoder, load_questions
from specframe.experiments.loading import load_tokenizer
from specframe.models.cache_keys import cpu_label
from specframe.models.linears import use_linears
from specframe.models.target import load_causal_lm


def greedy(model: torch.nn.Module, prompt: list[int], tokens: int, eos: int | None) -> list[int]:
    """``tokens`` greedy tokens after ``prompt`` (fewer at ``eos``)."""
    out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=tokens, eos_token_id=eos,
                         pad_token_id=eos if eos is not None else 0)
    return out[0, len(prompt):].tolist()


def nll(model: torch.nn.Module, prompt: list[int], answer: list[int]) -> float:
    """Summed negative log-likelihood (nats) of ``answer`` after ``prompt``."""
    ids = torch.tensor([prompt + answer])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0, len(prompt) - 1:-1].double(), -1)
    return float(-logp.gather(1, torch.tensor(answer)[:, None]).sum())


def common_prefix(a: list[int], b: list[int]) -> int:
    """Tokens ``a`` and ``b`` share from the start."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def main(argv: list[str] | None = None) -> str:
    """Run the comparison and print it; returns the printed text."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, default=Path("examples/demo.toml"))
    parser.add_argument("--tokens", type=int, default=None, help="default: the experiment's max_new_tokens")
    parser.add_argument("--limit", type=int, default=None, help="first N prompts only")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    cfg = load_config(args.config)
    tokens = args.tokens or cfg.max_new_tokens
    questions = load_questions(cfg.data.path, cfg.data.category, args.limit or cfg.data.limit)
    encoder = PromptEncoder(load_tokenizer(cfg), cfg.data.chat_template)
    f32 = load_causal_lm(cfg.target.model, dtype="float32")
    bf16 = copy.deepcopy(f32)
    label = use_linears(bf16, "bf16", fallback=None)
    eos = f32.generation_config.eos_token_id
    eos = eos[0] if isinstance(eos, list) else eos
    same, prefix, n_tok, gap, base = 0, 0, 0, 0.0, 0.0
    with torch.no_grad():
        for q in questions:
            prompt = encoder.encode(q.turns[:1], [], None)
            a, b = greedy(f32, prompt, tokens, eos), greedy(bf16, prompt, tokens, eos)
            same += a == b
            prefix += common_prefix(a, b)
            if a:
                n_f32 = nll(f32, prompt, a)
                base += n_f32
                gap += nll(bf16, prompt, a) - n_f32
                n_tok += len(a)
    lines = [f"CPU: {cpu_label()}; {cfg.target.model}, float32 against {label}, {len(questions)} prompts of "
             f"{args.config}, {tokens} greedy tokens (first turn)",
             f"identical greedy answers: {same}/{len(questions)}; mean common prefix {prefix / len(questions):.1f} tokens",
             f"NLL per token of float32's answers: float32 {base / max(n_tok, 1):.4f}, gap bf16 - float32 "
             f"{gap / max(n_tok, 1):+.4f} nats"]
    text = "\n".join(lines)
    print(text)
    return text


if __name__ == "__main__":
    main()
