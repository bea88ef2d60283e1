"""What the exact forward costs: T(n) with exact on and off, float32 and bf16 linears, one run.

Loads the target once per arm (float32 with the fastest small-row kernel, as ``packed_linears =
true``; float32 with the native kernel, the one the exact forward runs, when "auto" picks
another; the exact forward; bf16 linears and bf16 exact where the CPU has them), prefills each
with the same context, then
times tree forwards of n = 1, 2, 4, ..., 64 nodes (balanced trees, fan-out 4) with the four arms
taking turns inside every round, so a change of load on a shared machine hits them alike. Prints
the median ms per arm, each exact arm's ratio over each stock arm of its linears at every n and
context, and the CPU.

    python benchmarks/exact_cost.py [--model smollm2-135m-instruct] [--contexts 128,1024]
                                    [--sizes 1,2,4,8,16,32,64] [--reps 7] [--threads 2]
"""

from __future__ import annotations

import argparse
import copy
import statistics

import torch

from specframe.models.bf16_linear import select_path
from specframe.models.cache_keys import cpu_label
from specframe.models.exact import use_exact
from specframe.models.linears import apply_linears, linears_label
from specframe.models.target import TargetModel, load_causal_lm
from specframe.sizing import profile


def arms(model_name: str) -> dict[str, TargetModel]:
    """Stock and exact targets, float32 (the fastest kernel here) and bf16 where the CPU has it."""
    base = load_causal_lm(model_name, dtype="float32")
    out = {}
    linears = ["float32"] + (["bf16"] if select_path() != "float32" else [])
    for kind in linears:
        for packed, exact in ((True, False), ("native", False), (True, True)):
            model = copy.deepcopy(base)
            label = apply_linears(model, kind, packed_linears=packed)
            if exact:
                use_exact(model)
                label = linears_label(model) + " exact"
            out.setdefault(label, TargetModel(model))  # "auto" may pick native: one arm then
    return out


def measure(targets: dict[str, TargetModel], contexts: list[int], sizes: list[int], reps: int) -> dict:
    """Median seconds per (arm, context, n): every round visits every arm for each (context, n)."""
    vocab = next(iter(targets.values())).vocab_size
    times: dict = {(a, c, n): [] for a in targets for c in contexts for n in sizes}
    for context in contexts:
        prompt = torch.arange(context - 1).remainder(vocab)
        for t in targets.values():
            t.reset()
            t.causal_forward(prompt, last_logits_only=True)
        for rep in range(reps + 1):
            for n in sizes:
                tree = profile.balanced_tree(n, vocab)
                order = list(targets) if rep % 2 == 0 else list(reversed(targets))
                for arm in order:
                    spent = profile._time_tree(targets[arm], tree, context)
                    if rep:  # round 0 warms up
                        times[(arm, context, n)].append(spent)
    return {key: statistics.median(v) for key, v in times.items()}


def table(medians: dict, targets: dict, contexts: list[int], sizes: list[int]) -> str:
    """Markdown: ms per arm and exact / stock per linears kind, rows (context, n)."""
    names = list(targets)
    kind = lambda name: name.split("-")[0]  # noqa: E731  float32 / bf16
    pairs = [(a, b) for b in names if b.endswith(" exact") for a in names
             if not a.endswith(" exact") and kind(a) == kind(b)]
    head = ["context", "n"] + [f"{a} ms" for a in names] + [f"{b} / {a}" for a, b in pairs]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in contexts:
        for n in sizes:
            ms = [f"{medians[(a, c, n)] * 1e3:.2f}" for a in names]
            ratios = [f"{medians[(b, c, n)] / medians[(a, c, n)]:.3f}" for a, b in pairs]
            lines.append("| " + " | ".join([str(c), str(n)] + ms + ratios) + " |")
    return "\n".join(lines)


def main() -> None:
    """Parse the arguments, measure, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--contexts", default="128,1024")
    parser.add_argument("--sizes", default="1,2,4,8,16,32,64")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    contexts = [int(c) for c in args.contexts.split(",")]
    sizes = [int(s) for s in args.sizes.split(",")]
    targets = arms(args.model)
    medians = measure(targets, contexts, sizes, args.reps)
    print(f"{args.model}, {cpu_label()}, {args.threads} threads, torch {torch.__version__}, median of {args.reps}")
    print(table(medians, targets, contexts, sizes))


if __name__ == "__main__":
    main()
