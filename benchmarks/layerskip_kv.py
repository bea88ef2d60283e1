"""What the ``layerskip`` drafter's KV scheme costs, on a tiny random Llama (CPU, seconds).

For one committed context of ``--context`` tokens it times, interleaved over ``--rounds``:

- ``full``: one target forward of one token over the context (the unit a draft saves against);
- ``shared``: one draft forward of one token reading the target's context K/V (the default,
  ``kv = "auto"``), which concatenates the context with the step's scratch rows per kept layer;
- ``own-catch-up``: the full-model catch-up forward a drafter without a shareable target cache
  (``kv = "own"``, replay) pays per step for ``--accepted`` newly committed tokens.

Run only on the tiny model (the lead measures real models):

    python benchmarks/layerskip_kv.py --layers 8 --context 256 --rounds 30
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specframe.decode.engine import make_plugin
from specframe.models.target import TargetModel
from specframe.testing.harness import begin_generation
from specframe.testing.models import tiny_model
from specframe.tree import DraftTree


def main() -> None:
    """Print one row per measured call: median and spread of its time in ms."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--accepted", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--preset", default="odd")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = tiny_model("llama", seed=0, vocab_size=256, hidden=args.hidden, layers=args.layers, dtype=torch.float32)
    committed = [int(t) for t in torch.randint(0, 256, (args.context,), generator=torch.Generator().manual_seed(0))]
    target = TargetModel(model)
    shared = make_plugin("drafters", ("layerskip", {"preset": args.preset}), target)
    begin_generation(shared, target, committed)
    own_target = TargetModel(model)
    own = make_plugin("drafters", ("layerskip", {"preset": args.preset, "kv": "own"}), own_target)
    tree = DraftTree.root(committed[-1])
    times: dict[str, list[float]] = {"full": [], "shared": [], "own-catch-up": []}
    for _ in range(args.rounds):
        start = time.perf_counter()
        target.forward(torch.tensor([committed[-1]]), torch.tensor([len(committed) - 1]),
                       torch.ones(1, 1, dtype=torch.bool))
        times["full"].append(time.perf_counter() - start)
        target.keep(len(committed) - 1, torch.zeros(0, dtype=torch.long), contiguous=True)
        shared._new_step()
        start = time.perf_counter()
        shared.expand(tree, torch.tensor([0]))
        times["shared"].append(time.perf_counter() - start)
        own.begin(torch.tensor(committed))
        own._catch_up(len(committed) - 1 - args.accepted)
        start = time.perf_counter()
        own._catch_up(len(committed) - 1)
        times["own-catch-up"].append(time.perf_counter() - start)
    kept = shared.plan.kept_layers(args.layers)
    print(f"tiny Llama, {args.layers} layers (preset {args.preset}: {kept} with a kept sublayer), hidden "
          f"{args.hidden}, context {args.context}, {args.rounds} rounds, 1 thread")
    for name, values in times.items():
        ms = [v * 1e3 for v in values]
        print(f"{name:14s} {statistics.median(ms):8.3f} ms  (p10 {sorted(ms)[len(ms) // 10]:.3f}, "
              f"p90 {sorted(ms)[9 * len(ms) // 10]:.3f})")


if __name__ == "__main__":
    main()
