"""What a step's small operations cost on this CPU: warm, right after the target's forward, and
after the core sat idle as long as a forward takes.

The engine's own time per step (``step_overhead.py``) is a few dozen small tensor operations and
a few hundred lines of Python between forwards. Timed back to back they take microseconds; a
step runs each once, right after a forward that streamed the target's weights through the
caches (SmolLM2-135M in float32: about 0.5 GB), so each runs cold. This prints, per operation,
the median of: ``warm`` (the operation repeated back to back), ``after fwd`` (the first run after
the target's 6-node tree forward, the KV cache cut back after each) and ``after idle`` (after a
sleep as long as that forward: the core is handed to others meanwhile, and comes back cold too).
The operations are the ones an eagle3 + TALON step runs outside the forwards (``drafters/eagle.py``,
``specframe/decode/read.py``) and a stand-in of its Python bookkeeping.

    python benchmarks/cold_ops.py [--pair smollm2] [--reps 40] [--threads 2]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch

from specframe.selection import top_host_indices

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_overhead import header, load_pair  # noqa: E402  (a sibling script)


def bookkeeping(values: list[float], scores: list[float]) -> list[int]:
    """A stand-in for a TALON layer's host work (``strategies/talon.py``'s ``grow_on_host``):
    score, gate and rank a few dozen candidates."""
    cand = [s + min(v, 0.0) for s in scores for v in values]
    gate = max(cand) + math.log(0.03)
    cand = [c if c >= gate else -math.inf for c in cand]
    return sorted(top_host_indices(cand, 6))


def operations(hidden: int, vocab: int) -> dict[str, Callable[[], object]]:
    """The timed operations, on inputs of an eagle3 + TALON step's shapes."""
    row = torch.randn(1, vocab)
    layers = [torch.randn(1, 6, hidden) for _ in range(3)]
    path = torch.tensor([0, 1, 3])
    values, scores = [-0.1 * i for i in range(10)], [0.0, -0.5, -1.0]
    return {
        "torch.tensor(3 ints)": lambda: torch.tensor([0, 1, 3]),
        "view x[-1:]": lambda: layers[0][0, -1:],
        "log_softmax [1, 8192]": lambda: torch.log_softmax(row, dim=-1),
        "topk(7) + 2 tolist": lambda: (lambda t: (t.values.tolist(), t.indices.tolist()))(torch.topk(row, 7)),
        "cat 3 + index_select": lambda: torch.index_select(torch.cat(layers, dim=-1), 1, path),
        "Python layer bookkeeping": lambda: bookkeeping(values, scores),
    }


def measure(pair: str, reps: int, threads: int) -> list[tuple[str, float, float, float]]:
    """``(operation, warm us, after-forward us, after-idle us)`` medians, around the target of
    ``pair`` (``step_overhead.py``'s pairs: ``smollm2`` or ``tiny``)."""
    torch.set_num_threads(threads)
    _, target, _, _, _ = load_pair(pair, 1, 8, threads)
    from specframe.sizing.profile import balanced_tree

    tree = balanced_tree(6, target.vocab_size, fanout=1)
    context = 200
    inputs = (tree.tokens, tree.positions(context), tree.ancestor_mask())
    target.reset()
    target.causal_forward(torch.arange(context - 1) % target.vocab_size)

    def forward() -> float:
        start = time.perf_counter()
        target.tree_forward(*inputs, max_position=context - 2 + len(tree))
        target.keep(context - 1, torch.empty(0, dtype=torch.long), contiguous=True)
        return time.perf_counter() - start

    ops = operations(target.model.config.hidden_size, 8192)
    samples: dict[str, dict[str, list[float]]] = {name: {"warm": [], "fwd": [], "idle": []} for name in ops}
    gap = statistics.median(forward() for _ in range(5))
    with torch.inference_mode():
        for rep in range(reps + 2):  # two warm-up rounds
            for name, op in ops.items():
                for kind in ("fwd", "idle", "warm"):
                    if kind == "fwd":
                        forward()
                    elif kind == "idle":
                        time.sleep(gap)
                    else:
                        op()  # the same operation just before: warm
                    start = time.perf_counter()
                    op()
                    if rep >= 2:
                        samples[name][kind].append(time.perf_counter() - start)
    med = lambda xs: statistics.median(xs) * 1e6  # noqa: E731
    return [(name, med(s["warm"]), med(s["fwd"]), med(s["idle"])) for name, s in samples.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="smollm2", choices=("smollm2", "tiny"))
    parser.add_argument("--reps", type=int, default=40)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    print(header(args.threads))
    rows = measure(args.pair, args.reps, args.threads)
    print(f"{'operation':26s} {'warm us':>8s} {'after fwd':>10s} {'after idle':>11s} {'fwd/warm':>9s}")
    for name, warm, fwd, idle in rows:
        print(f"{name:26s} {warm:8.1f} {fwd:10.1f} {idle:11.1f} {fwd / warm:8.1f}x")
    total = [sum(r[i] for r in rows) for i in (1, 2, 3)]
    print(f"{'sum':26s} {total[0]:8.1f} {total[1]:10.1f} {total[2]:11.1f} {total[1] / total[0]:8.1f}x")


if __name__ == "__main__":
    main()
