"""Tree-construction latency of every registered policy at N = 60 (CPU), policy time only.

The drafter is a ``SyntheticDrafter.fixed`` table of pre-computed log-prob rows served as views,
so a "draft forward" costs nothing and what is timed is the policy's own work: top-k
selection over the vocabulary, gating / re-ranking, tree bookkeeping. Rows are Zipf-shaped
(exponent 1.0 to 3.0 per row, random token order), a mix of confident and flat drafts.
The paper reports TALON's construction 1.18-1.44x faster than EAGLE's; the goal here is
TALON / EAGLE <= 1 at both vocabulary sizes.

    python benchmarks/bench_policies.py [--vocab 32000 151936] [--repeats 30] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import specframe
from specframe.decode.engine import make_plugin
from specframe.testing.synthetic import SyntheticDrafter, make_session

BUDGET = 60


def zipf_table(vocab: int, layers: int = 6, rows: int = 60, seed: int = 0) -> torch.Tensor:
    """``[layers, rows, vocab]`` float32 log-probs: Zipf(alpha ~ U[1, 3]) over a random token order."""
    gen = torch.Generator().manual_seed(seed)
    log_rank = torch.log(torch.arange(1, vocab + 1, dtype=torch.float32))
    table = torch.empty(layers * rows, vocab)
    alphas = 1.0 + 2.0 * torch.rand(layers * rows, generator=gen)
    for i in range(layers * rows):
        table[i, torch.randperm(vocab, generator=gen)] = -alphas[i] * log_rank
    return torch.log_softmax(table, dim=-1).view(layers, rows, vocab)


def time_policy(name: str, drafter: SyntheticDrafter, repeats: int) -> dict:
    """Median / p10 / p90 policy milliseconds (draft time subtracted) and the tree's shape."""
    policy = make_plugin("policies", name)
    samples, tree, session = [], None, None
    for i in range(repeats + 3):  # 3 warm-up builds
        session = make_session(drafter, generator=torch.Generator().manual_seed(i))
        start = time.perf_counter()
        tree = policy.build(session, BUDGET)
        elapsed = time.perf_counter() - start - session.draft_time
        if i >= 3:
            samples.append(elapsed * 1e3)
    samples.sort()
    return {
        "median": statistics.median(samples),
        "p10": samples[len(samples) // 10],
        "p90": samples[(9 * len(samples)) // 10],
        "size": len(tree),
        "depth": tree.max_depth,
        "forwards": session.draft_forwards,
        "widths": tree.width_per_depth(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, nargs="+", default=[32000, 151936])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--policies", nargs="+", default=None, help="default: every registered policy")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    names = args.policies or specframe.get_registry().names("policies")
    print(f"policy construction latency, N={BUDGET}, CPU threads={args.threads}, repeats={args.repeats}")
    ratios = {}
    for vocab in args.vocab:
        drafter = SyntheticDrafter.fixed(zipf_table(vocab))
        print(f"\nV = {vocab}")
        print(f"{'policy':<14}{'median ms':>10}{'p10':>8}{'p90':>8}{'size':>6}{'depth':>7}{'fwd':>5}  widths")
        results = {}
        for name in names:
            r = results[name] = time_policy(name, drafter, args.repeats)
            print(f"{name:<14}{r['median']:>10.2f}{r['p10']:>8.2f}{r['p90']:>8.2f}{r['size']:>6}"
                  f"{r['depth']:>7}{r['forwards']:>5}  {r['widths']}")
        if "talon" in results and "eagle" in results:
            ratios[vocab] = results["talon"]["median"] / results["eagle"]["median"]
            print(f"TALON / EAGLE construction time at V={vocab}: {ratios[vocab]:.2f}"
                  f" ({'TALON faster' if ratios[vocab] < 1 else 'TALON slower'})")
    if ratios:
        print("\nsummary: " + ", ".join(f"V={v}: TALON/EAGLE = {r:.2f}" for v, r in ratios.items()))


if __name__ == "__main__":
    main()
