"""Host reads per step (each one a device synchronisation on a GPU), counted on the CPU.

For every built-in policy with the ``model`` drafter on a tiny random Llama: reads inside
``policy.build`` (including the drafter's ``expand``), inside ``drafter.commit``, and made by
the engine itself in strict mode (every tree checked on the host) and in its default mode
(one packed read per step).

    python benchmarks/host_reads.py [--tokens 32]
"""

from __future__ import annotations

import argparse
from typing import Any

import specframe
from specframe.testing.host_reads import count_step_reads
from specframe.testing.models import tiny_model

POLICIES = ["chain", "static", "eagle", "talon", "opt-tree", "sequoia", "sampled-tree"]


def measure(target: Any, policy: str, strict: bool, tokens: int) -> dict[str, float]:
    """Reads per step in the policy, the drafter's commit and the engine."""
    verifier = ("sampling", {"temperature": 0.8, "seed": 1}) if policy == "sampled-tree" else "greedy"
    dec = specframe.SpecDecoder.build(target=target, drafter=("model", {"model": target}), policy=policy,
                                      verifier=verifier, strict=strict)
    reads = count_step_reads(dec, [5, 6, 7], tokens)
    return {k: v / reads["steps"] if k in ("policy", "commit", "engine") else v for k, v in reads.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()
    target = tiny_model("llama", seed=3)
    print("| policy | draft forwards / step | policy + expand | drafter.commit | engine, strict | engine |")
    print("|---|---|---|---|---|---|")
    for policy in POLICIES:
        strict, plain = measure(target, policy, True, args.tokens), measure(target, policy, False, args.tokens)
        print(f"| {policy} | {plain['delta']:.1f} | {plain['policy']:.1f} | {plain['commit']:.1f} | "
              f"{strict['engine']:.1f} | {plain['engine']:.1f} |")


if __name__ == "__main__":
    main()
