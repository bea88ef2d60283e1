"""Where a speculative step's time goes: target forward, draft forwards, everything else.

Random 4-layer d=256 Llama target and a 1-layer d=128 Llama draft (CPU, float32, vocabulary
32000), greedy verification, for chain gamma=4 and a 60-node tree built by a throw-away
width-10 policy defined below. "Everything else" is policy bookkeeping + verification +
commit/KV compaction + engine overhead; the goal is <= 15% of the step time.

Each arm runs as a strict engine on a growing cache (every tree checked on the host, KV
reallocated per step) and as the default engine on a pre-allocated cache (one host read per
step, KV compacted in place); ``--compile`` adds the latter with the target under
``torch.compile`` (minutes of compilation on a CPU).

    python benchmarks/bench_engine.py [--tokens 128] [--threads 2] [--compile]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import specframe


@dataclass
class WideOptions(specframe.BudgetOptions):
    """Options of the throw-away benchmark policy."""

    budget: int = 60
    width: int = 10


class WideTreePolicy(specframe.TreePolicy):
    """Per layer: expand the frontier, keep the `width` best children by cumulative log-prob."""

    name = "bench-wide"
    Options = WideOptions

    def build(self, session, budget):
        tree = session.new_tree()
        frontier = torch.tensor([0])
        limit = budget
        while len(tree) < limit:
            logp = session.expand(tree, frontier)
            vals, toks = logp.topk(self.options.width, dim=-1)
            scores = (tree.logp[frontier, None] + vals).flatten()
            keep = scores.topk(min(self.options.width, limit - len(tree))).indices
            parents = frontier.repeat_interleave(self.options.width)[keep]
            tree = tree.add_nodes(parents, toks.flatten()[keep], scores[keep])
            frontier = torch.arange(len(tree) - len(keep), len(tree))
        return tree


def make_models(vocab: int = 32000):
    """The benchmark's random target (4 x 256) and draft (1 x 128), float32, SDPA."""
    def llama(hidden, layers, seed):
        torch.manual_seed(seed)
        cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 3,
                          num_hidden_layers=layers, num_attention_heads=hidden // 64,
                          num_key_value_heads=hidden // 64, max_position_embeddings=4096)
        return LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa").eval()

    return llama(256, 4, 0), llama(128, 1, 1)


def run_arm(label, target, draft, policy, tokens, prompt, preallocate=False, strict=False, compile=False):
    """Generate once (warm-up) and once timed; print the mean split per step."""
    dec = specframe.SpecDecoder.build(target=specframe.TargetModel(target, preallocate=preallocate),
                                      drafter=("model", {"model": draft}), policy=policy, strict=strict,
                                      compile=compile)
    # Compiled: warm up with the timed length, so every tree and cache size has been traced.
    dec.generate(prompt, max_new_tokens=tokens if compile else 16, eos_token_id=None)
    out = dec.generate(prompt, max_new_tokens=tokens, eos_token_id=None)
    steps = out.steps
    n = len(steps)
    target_t = sum(s.target_time for s in steps) / n
    draft_t = sum(s.draft_time for s in steps) / n
    total = sum(s.total_time for s in steps) / n
    other = total - target_t - draft_t
    print(f"{label:<26} steps={n:4d} tree={sum(s.tree_size for s in steps) / n:5.1f} "
          f"step={total * 1e3:7.2f} ms  target={target_t * 1e3:7.2f}  draft={draft_t * 1e3:7.2f}  "
          f"else={other * 1e3:6.2f} ms ({100 * other / total:4.1f}% of step)  "
          f"[policy {sum(s.policy_time for s in steps) / n * 1e3:.2f}, verify "
          f"{sum(s.verify_time for s in steps) / n * 1e3:.2f}, commit+engine "
          f"{sum(s.other_time for s in steps) / n * 1e3:.2f} ms]")
    return other / total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--compile", action="store_true",
                        help="also time the pre-allocated arm with a compiled target")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, draft = make_models()
    prompt = torch.randint(0, 32000, (64,), generator=torch.Generator().manual_seed(0)).tolist()
    print(f"torch {torch.__version__}, {args.threads} threads, CPU float32, {args.tokens} new tokens")
    # Strict engine on a growing DynamicCache and default engine on a pre-allocated cache.
    for label, policy in (("chain gamma=4", ("chain", {"gamma": 4})),
                          ("60-node tree (wide)", WideTreePolicy(WideOptions()))):
        run_arm(f"{label} strict", target, draft, policy, args.tokens, prompt, preallocate=False, strict=True)
        run_arm(f"{label} prealloc", target, draft, policy, args.tokens, prompt, preallocate=True)
        if args.compile:
            run_arm(f"{label} compiled", target, draft, policy, args.tokens, prompt, preallocate=True, compile=True)


if __name__ == "__main__":
    main()
