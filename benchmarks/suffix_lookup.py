"""Lookup cost of the ``suffix`` drafter: seconds per expanded node on a request of N tokens.

    python benchmarks/suffix_lookup.py [--tokens 3000] [--vocab 32000] [--nodes 30] [--rounds 50]

Builds the drafter over a random request (prompt + committed output), then expands a chain of
``--nodes`` nodes ``--rounds`` times (each round a fresh step, so nothing is served from the
step's cache) and prints the median per-node time, with and without earlier outputs in the
global index.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specframe.drafters.suffix import SuffixDrafter, SuffixDrafterOptions
from specframe.options import build_options
from specframe.testing.harness import chain_tree


class _Target:
    """What a model-free drafter reads of its target: the vocabulary size."""

    def __init__(self, vocab: int) -> None:
        self.vocab_size = vocab


def per_node_seconds(tokens: int, vocab: int, nodes: int, rounds: int, earlier: int) -> float:
    """Median seconds per node of ``expand_top`` after ``earlier`` finished requests."""
    gen = torch.Generator().manual_seed(0)
    drafter = SuffixDrafter(build_options(SuffixDrafterOptions, {}, "drafter 'suffix'"), _Target(vocab))
    for _ in range(earlier):  # each begin adds the previous request's output to the global index
        seq = torch.randint(0, vocab, (tokens,), generator=gen).tolist()
        drafter.begin(torch.tensor(seq[: tokens // 2]))
        drafter.commit(torch.tensor(seq[tokens // 2 :]))
    seq = torch.randint(0, vocab, (tokens,), generator=gen).tolist()
    drafter.begin(torch.tensor(seq[: tokens // 2]))
    drafter.commit(torch.tensor(seq[tokens // 2 :]))
    tree = chain_tree(seq[-1], seq[100 : 100 + nodes])
    times = []
    for _ in range(rounds):
        drafter._reset_step()
        start = time.perf_counter()
        drafter.expand_top(tree, torch.arange(len(tree)), 4)
        times.append((time.perf_counter() - start) / len(tree))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=3000)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--nodes", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()
    torch.set_num_threads(1)
    for earlier in (0, 16):
        sec = per_node_seconds(args.tokens, args.vocab, args.nodes, args.rounds, earlier)
        print(f"{args.tokens} tokens, {earlier} earlier outputs indexed: {sec * 1e6:.1f} us per expanded node")


if __name__ == "__main__":
    main()
