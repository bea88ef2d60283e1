"""T(n)/T(1) of a target's tree forward with each linear kernel, interleaved in one run.

A tree forward of a few tokens should cost close to one token's (the same
weights are read). Which small-batch float32 kernel gets there depends on the CPU (MKL takes
its slow paths on AMD processors), so this loads the target once per kernel (plain
``F.linear``, specframe's native small-row GEMM, oneDNN, MKL packed per row bucket) and times the same trees on the same cache
length with the kernels taking turns in every round: a change of load on a shared machine hits
them all alike, which back-to-back ``specframe profile`` runs do not guarantee.

    python benchmarks/linear_kernels.py [--model smollm2-135m-instruct] [--threads 2]

Prints ms and T(n)/T(1) per kernel, the pick of ``packed_linears = true`` (``"auto"``) on this
machine, and whether the greedy next token of a prompt agrees across kernels.

    python benchmarks/linear_kernels.py --bf16 [--contexts 128,512] [--sizes 1-64] [--threads 2]

compares float32 native against bf16 linears (:mod:`specframe.models.bf16_linear`, the path this
CPU takes) instead: T(n) for every n of ``--sizes`` at each context, the two arms taking turns in
every round, then per arm and context T(1), T(16)/T(1) and T(64)/T(1), and bf16's T(1) over
float32's, under the CPU's model name.
"""

from __future__ import annotations

import argparse
import copy
import statistics

import torch

from specframe.models.cache_keys import cpu_label
from specframe.models.linears import use_linears
from specframe.sizing import profile
from specframe.models.packed_linear import available_kernels, fastest_kernel, pack_linears
from specframe.models.target import TargetModel, load_causal_lm


def targets(model_name: str) -> dict[str, TargetModel]:
    """One TargetModel per kernel ("plain" = unchanged ``nn.Linear``)."""
    base = load_causal_lm(model_name, dtype="float32")
    out = {"plain": TargetModel(base)}
    for kernel in available_kernels():
        model = copy.deepcopy(base)
        pack_linears(model, kernel)
        out[kernel] = TargetModel(model)
    return out


def interleaved_times(tgts: dict[str, TargetModel], sizes: list[int], cache_len: int, reps: int) -> dict[str, list[float]]:
    """Median seconds per (kernel, n); every round times every kernel at every size."""
    for t in tgts.values():
        t.reset()
        t.causal_forward(torch.arange(cache_len - 1) % t.vocab_size)
    trees = [profile.balanced_tree(n, next(iter(tgts.values())).vocab_size) for n in sizes]
    runs = {k: [[] for _ in sizes] for k in tgts}
    for rep in range(reps + 1):  # round 0 warms up
        for kernel, t in tgts.items():
            # Untimed: the first forward after another kernel's model ran finds this one's
            # weights evicted, and the first size timed would pay for it.
            profile._time_tree(t, trees[0], cache_len)
            for j, tree in enumerate(trees):
                spent = profile._time_tree(t, tree, cache_len)
                if rep:
                    runs[kernel][j].append(spent)
    return {k: [statistics.median(r) for r in v] for k, v in runs.items()}


def bf16_targets(model_name: str) -> dict[str, TargetModel]:
    """float32 native and bf16 linears on one loaded model (two copies)."""
    base = load_causal_lm(model_name, dtype="float32")
    bf16 = copy.deepcopy(base)
    out = {"float32-" + pack_linears(base, "native"): TargetModel(base)}
    out[use_linears(bf16, "bf16", fallback=None)] = TargetModel(bf16)
    return out


def parse_sizes(text: str) -> list[int]:
    """``"1-64"`` or ``"1,2,4"`` (ranges and lists may mix) -> sorted sizes."""
    found: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        found.update(range(int(lo), int(hi or lo) + 1))
    return sorted(found)


def bf16_report(times: dict[int, dict[str, list[float]]], sizes: list[int], args: argparse.Namespace) -> list[str]:
    """The comparison's lines: per context and arm T(1), T(16)/T(1), T(64)/T(1), and the T(1) ratio."""
    def ratio(secs: list[float], n: int) -> str:
        return f"{secs[sizes.index(n)] / secs[0]:.2f}" if n in sizes else "-"

    lines = [f"CPU: {cpu_label()}", f"{args.model}, {args.threads} threads, median of {args.reps} interleaved rounds, "
             f"sizes {sizes[0]}..{sizes[-1]}", "",
             "| context | linears | T(1) ms | T(16)/T(1) | T(64)/T(1) |", "|---|---|---|---|---|"]
    for ctx, per_arm in times.items():
        for arm, secs in per_arm.items():
            lines.append(f"| {ctx} | {arm} | {1e3 * secs[0]:.1f} | {ratio(secs, 16)} | {ratio(secs, 64)} |")
    lines.append("")
    for ctx, per_arm in times.items():
        (f32, a), (b16, b) = list(per_arm.items())[:2]
        lines.append(f"context {ctx}: {b16} T(1) / {f32} T(1) = {b[0] / a[0]:.2f}")
    lines.append("")
    for ctx, per_arm in times.items():
        for arm, secs in per_arm.items():
            lines.append(f"T(n) ms, context {ctx}, {arm}: " + " ".join(f"{1e3 * s:.1f}" for s in secs))
    return lines


def main(argv: list[str] | None = None) -> str:
    """Run the comparison and print it; returns the printed text."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sizes", default=None, help="default 1,2,4,8,16,32 (with --bf16: 1-64)")
    parser.add_argument("--cache-len", type=int, default=200)
    parser.add_argument("--contexts", default="128,512", help="with --bf16: the contexts timed")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--bf16", action="store_true", help="float32 native against bf16 linears")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.bf16:
        sizes = parse_sizes(args.sizes or "1-64")
        tgts = bf16_targets(args.model)
        times = {c: interleaved_times(tgts, sizes, c, args.reps) for c in parse_sizes(args.contexts)}
        text = "\n".join(bf16_report(times, sizes, args))
        print(text)
        return text
    sizes = [int(s) for s in (args.sizes or "1,2,4,8,16,32").split(",")]
    tgts = targets(args.model)
    times = interleaved_times(tgts, sizes, args.cache_len, args.reps)
    lines = [f"{args.model}, float32, {args.threads} threads, cache {args.cache_len}, median of {args.reps} "
             f"interleaved rounds", "", "| kernel | " + " | ".join(f"n={n}" for n in sizes) + " | T(16)/T(1) |",
             "|---|" + "---|" * (len(sizes) + 1)]
    for kernel, secs in times.items():
        ratio16 = f"{secs[sizes.index(16)] / secs[0]:.2f}" if 16 in sizes else "-"
        lines.append(f"| {kernel} ms | " + " | ".join(f"{1e3 * s:.1f}" for s in secs) + " | |")
        lines.append(f"| {kernel} x T(1) | " + " | ".join(f"{s / secs[0]:.2f}" for s in secs) + f" | **{ratio16}** |")
    plain = times["plain"]
    lines.append("")
    lines += [f"{k}: T(1) {v[0] / plain[0]:.2f}x plain" for k, v in times.items() if k != "plain"]
    lines.append(f"packed_linears = true picks: {fastest_kernel(tgts['plain'].model)}")
    ids = torch.arange(100, 160)[None]
    with torch.no_grad():
        nexts = {k: int(t.model(ids).logits[0, -1].argmax()) for k, t in tgts.items()}
    lines.append(f"greedy next token per kernel: {nexts}")
    text = "\n".join(lines)
    print(text)
    return text


if __name__ == "__main__":
    main()
