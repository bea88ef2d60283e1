"""Host reads per step (each one a device synchronisation on a GPU), counted on the CPU.

For every built-in policy with the ``model`` drafter on a tiny random Llama: reads inside
``policy.build`` (including the drafter's ``expand``), inside ``drafter.commit``, and made by
the engine itself on the reference and on the fast path.

    python benchmarks/host_reads.py [--tokens 32]
"""

from __future__ import annotations

import argparse
from typing import Any, Callable

import specframe
from specframe.testing.host_reads import HostReadCounter
from specframe.testing.models import tiny_model

POLICIES = ["chain", "static", "eagle", "talon", "opt-tree", "sequoia", "sampled-tree"]


def _counted(fn: Callable, counter: HostReadCounter, outer: HostReadCounter | None = None) -> Callable:
    """``fn`` counted by ``counter`` and hidden from ``outer`` (the engine's counter)."""
    def run(*args: Any, **kwargs: Any) -> Any:
        if outer is None:
            with counter:
                return fn(*args, **kwargs)
        with outer.paused(), counter:
            return fn(*args, **kwargs)
    return run


def measure(target: Any, policy: str, fast: bool, tokens: int) -> dict[str, float]:
    """Reads per step in the policy, the drafter's commit and the engine."""
    verifier = ("sampling", {"temperature": 0.8, "seed": 1}) if policy == "sampled-tree" else "greedy"
    dec = specframe.SpecDecoder.build(target=target, drafter=("model", {"model": target}), policy=policy,
                                      verifier=verifier, fast=fast)
    engine, build, commit = HostReadCounter(), HostReadCounter(), HostReadCounter()
    dec.policy.build = _counted(dec.policy.build, build, engine)
    dec.drafter.commit = _counted(dec.drafter.commit, commit, engine)
    dec._step = _counted(dec._step, engine)
    out = dec.generate([5, 6, 7], max_new_tokens=tokens, eos_token_id=None)
    n = len(out.steps)
    return {"delta": out.delta, "policy": build.total / n, "commit": commit.total / n, "engine": engine.total / n}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()
    target = tiny_model("llama", seed=3)
    print("| policy | draft forwards / step | policy + expand | drafter.commit | engine, reference | engine, fast |")
    print("|---|---|---|---|---|---|")
    for policy in POLICIES:
        ref, fast = measure(target, policy, False, args.tokens), measure(target, policy, True, args.tokens)
        print(f"| {policy} | {fast['delta']:.1f} | {fast['policy']:.1f} | {fast['commit']:.1f} | "
              f"{ref['engine']:.1f} | {fast['engine']:.1f} |")


if __name__ == "__main__":
    main()
