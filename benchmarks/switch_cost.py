"""What a switched-off row costs: a speculative arm with every row off against refilling
autoregressive decoding, at a load where every row is off (docs/load.md, "A switch that stays
cheap").

Every request is present at time 0 and ``--max-live`` of them decode at once, so the live batch
stays full until the tail; the arm runs under ``threshold`` with ``disable_by_batch_size = 1``,
so no row of any step builds a tree. Arms, taking turns in every round (the order rotating) so
machine drift hits them alike:

* ``autoregressive``: the load benchmark's refilling greedy baseline
  (:func:`specframe.experiments.load.serve.serve_autoregressive`);
* ``off``: the arm, every row's root answered by the verifier's batched ``root_tokens``;
* ``off/per-row`` (``--per-row``): the same with a verifier that lacks ``root_tokens``, each
  root verified alone: what the batched answer saves.

Per arm it prints mean TPOT, the median step time at the full batch, tokens/s, its TPOT over the
autoregressive arm's of the same round (the median over rounds and the range: how noisy the
machine was) and how many requests gave the autoregressive arm's tokens::

    python benchmarks/switch_cost.py examples/load-smollm2.toml --arm fixed --rounds 10 --per-row
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch

from specframe.decode.batch import BatchDecoder
from specframe.experiments.config import load_config
from specframe.experiments.load.metrics import summarize
from specframe.experiments.load.run import LoadRun, request_prompts, rotated
from specframe.experiments.load.serve import serve_autoregressive, serve_speculative
from specframe.experiments.load.settings import LoadSettings
from specframe.models.cache_keys import cpu_name


def per_row_decoder(decoder):
    """``decoder`` with a verifier that answers no root in a batch (the default ``root_tokens``)."""
    verifier = decoder.verifier
    shim = type("PerRow" + type(verifier).__name__, (type(verifier),), {"root_tokens": lambda self, *a: None})
    twin = copy.copy(decoder)
    twin.verifier = shim(verifier.options)
    return twin


def main(argv: list[str] | None = None) -> str:
    """Run the rounds and print the table; returns it."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", type=Path, help="an experiment file with a [load] table (its target and data)")
    parser.add_argument("--arm", required=True, help="the speculative arm to switch off (an [[arm]] name)")
    parser.add_argument("--requests", type=int, default=16, help="requests per round (default 16)")
    parser.add_argument("--max-live", type=int, default=8, help="sequences decoding at once (default 8)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds, each arm once per round (default 5)")
    parser.add_argument("--per-row", action="store_true", help="add the off/per-row arm")
    args = parser.parse_args(argv)

    config = load_config(args.config)
    arms = {a.name: a for a in config.arms}
    if args.arm not in arms or arms[args.arm].baseline is not None:
        parser.error(f"--arm {args.arm!r}: not a speculative arm of {args.config}; "
                     f"choose from {[n for n, a in arms.items() if a.baseline is None]}")
    if config.threads:
        torch.set_num_threads(config.threads)
    run = LoadRun(config, LoadSettings(rates=[1.0], requests=args.requests, max_live=args.max_live),
                  Path("/nonexistent"))
    prompts = run._prompts = request_prompts(config, args.requests)
    target, eos = run._target(), run._eos()
    decoder = run._runner(arms[args.arm]).decoder
    off = ("threshold", {"disable_by_batch_size": 1})
    batchers = {"off": BatchDecoder(decoder, off)}
    if args.per_row:
        batchers["off/per-row"] = BatchDecoder(per_row_decoder(decoder), off)
    arrivals = [0.0] * len(prompts)
    new = config.max_new_tokens

    def serve(name: str):
        if name == "autoregressive":
            return serve_autoregressive(target, prompts, arrivals, args.max_live, new, eos)
        return serve_speculative(batchers[name], prompts, arrivals, args.max_live, new, eos)

    names = ["autoregressive", *batchers]
    for name in names:  # untimed: first-call costs
        serve(name)
    figures: dict[str, list[dict]] = {n: [] for n in names}
    full: dict[str, list[float]] = {n: [] for n in names}
    outputs: dict[str, list] = {}
    for r in range(args.rounds):
        for name in rotated(names, r):
            served = serve(name)
            outputs.setdefault(name, served.tokens)
            figures[name].append(summarize(served, served.tokens, None))
            full[name] += [b - a for a, b, live in zip([0.0] + served.step_at, served.step_at, served.step_live)
                           if live == args.max_live]
            assert served.speculated == 0, f"{name}: a row speculated"
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    base = outputs["autoregressive"]
    lines = [f"switch cost: {args.config} arm {args.arm!r} all off, {args.requests} requests at once, "
             f"max_live {args.max_live}, {new} tokens, {args.rounds} rounds, {torch.get_num_threads()} threads, "
             f"{cpu_name()}, {time.strftime('%Y-%m-%d')}",
             "| arm | TPOT mean (ms) | step at full batch, median (ms) | tok/s | TPOT / AR, median of rounds [min, max] | "
             "step / AR | outputs = AR's |", "|---|---|---|---|---|---|---|"]
    ar_step = statistics.median(full["autoregressive"])
    for name in names:
        # Each round's TPOT over the same round's autoregressive TPOT: the drift between rounds cancels.
        ratios = [f["tpot_mean"] / a["tpot_mean"] for f, a in zip(figures[name], figures["autoregressive"])]
        tpot = statistics.mean(f["tpot_mean"] for f in figures[name])
        step = statistics.median(full[name])
        tps = statistics.mean(f["throughput"] for f in figures[name])
        same = sum(a == b for a, b in zip(outputs[name], base))
        lines.append(f"| {name} | {tpot * 1e3:.1f} | {step * 1e3:.1f} | {tps:.1f} | {statistics.median(ratios):.3f} "
                     f"[{min(ratios):.3f}, {max(ratios):.3f}] | {step / ar_step:.3f} | {same}/{len(base)} |")
    table = "\n".join(lines)
    print(table)
    return table


if __name__ == "__main__":
    main()
