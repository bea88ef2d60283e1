"""Batch sweep: batched speculative decoding against batched autoregressive decoding, B = 1, 2, 4, 8.

One interleaved run: the prompts are cut into batches of B, and every arm decodes each batch in
turn (ar, equal, shared, acceptance, ar, ...), so machine drift hits all arms alike.

* ``ar``: transformers ``generate`` on the left-padded batch with its attention mask, greedy.
* ``equal``: :mod:`specframe.decode.batch` with the ``equal`` allocator; ``shared``: the ``shared``
  (ECHO-style, one gate over all trees) allocator; ``acceptance``: shares by recent accepted
  lengths. All get the same batch budget,
  ``B x --budget`` nodes per step, and each sequence's policy may build up to ``2 x --budget``
  (so the shared allocator has room to give a confident sequence more than its even share).
* ``auto``: the policy with ``budget = "auto"`` and no batch budget: each sequence sizes its
  own tree, priced with its share of the batched forward (the curve at that batch shape,
  measured or read from the cache before the clock starts; docs/batching.md).

Continuous batching (``--refill``, default on, B > 1): the arms above get a ``+refill`` twin
that decodes a window of ``--window`` prompts (default: all) with at most B sequences live,
a finished sequence's row going to the next prompt (``generate(max_live=B)``), beside
``ar-refill``, batched greedy decoding that refills the same way
(:func:`specframe.experiments.batch_baselines.autoregressive_refill`). The arms take turns per window. A
``+refill`` arm's speedup is quoted against both ``ar`` (the static baseline) and ``ar-refill``
(so what refilling alone buys is not credited to speculation); its latency is a sequence's
time in the batch (prefill to last token), not counting its wait for a row.

``--per-row-drafts`` adds a ``/per-row`` twin of every arm that builds its rows' trees one
after another, each drafting alone, beside the default lockstep builds in which a model drafter
or EAGLE head drafts a layer of every row in one forward (docs/batching.md, "Batched drafting").

Per arm and B it prints throughput (all emitted tokens / wall time), mean per-sequence latency,
mean tau (tokens per target forward of a sequence) and the speedup over ``ar`` at the same B,
and lists every sequence that differs from the single-sequence greedy decoding of its prompt,
with the target's logit margin (top-1 minus top-2) where it left it: padding changes matmul
shapes, so a near tie can flip. Examples::

    python benchmarks/batch_sweep.py --pair smollm2 --drafter ngram --threads 2   # the published sweep
    python benchmarks/batch_sweep.py --pair demo --drafter model --sizes 1 2 --limit 4 --max-new-tokens 16
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from auto_sizing import PAIRS  # noqa: E402  (the pairs of the published tables)

ALLOCATORS = ("equal", "shared", "acceptance")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pair", choices=sorted(PAIRS), default="smollm2")
    p.add_argument("--drafter", default="ngram", help="a drafter of the pair (see auto_sizing.PAIRS)")
    p.add_argument("--policy", default="talon", help="tree policy of every sequence (budget option: 2 x --budget)")
    p.add_argument("--budget", type=int, default=4, help="nodes per sequence in the batch budget")
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--limit", type=int, default=28)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--packed-linears", action=argparse.BooleanOptionalAction, default=None,
                   help="fast small-batch CPU linears for every arm, batched autoregressive included, as "
                        "[target] packed_linears = true (default: on for smollm2; without them a few-row "
                        "forward costs nearly what that many one-row forwards cost on this CPU)")
    p.add_argument("--layout", choices=("padded", "flat"), default="padded",
                   help="batch cache of every speculative arm and ar-refill: padded ([B, n_max]) or flat (the "
                        "trees' real nodes in one row)")
    p.add_argument("--per-row-drafts", action="store_true",
                   help="also run every arm drafting row by row (name/per-row), beside its batched drafting "
                        "(one draft forward per layer for the batch; it matters for the model and eagle3 drafters)")
    p.add_argument("--refill", action=argparse.BooleanOptionalAction, default=True,
                   help="also run every arm with continuous batching (and ar-refill) at each B > 1")
    p.add_argument("--window", type=int, default=None,
                   help="prompts per continuous-batching run (default: all; the arms take turns per window)")
    p.add_argument("--out", type=Path, default=None, help="write the table and raw figures here (JSON)")
    args = p.parse_args(argv)
    if args.packed_linears is None:
        args.packed_linears = args.pair == "smollm2"
    return args


def load(args: argparse.Namespace) -> tuple[Any, list[list[int]], set[int]]:
    """The target (TargetModel), the encoded prompts and the EOS ids, as an experiment loads them."""
    from specframe.experiments.config import parse_config
    from specframe.experiments.data import PromptEncoder, load_questions
    from specframe.experiments.loading import ModelPool, load_tokenizer
    from specframe.models.target import TargetModel

    pair = PAIRS[args.pair]
    raw = {"name": "batch-sweep", "max_new_tokens": args.max_new_tokens,
           "target": {"model": pair["target"], "dtype": args.dtype, "packed_linears": args.packed_linears},
           "arm": [{"baseline": "autoregressive"}],
           "data": {"path": str(ROOT / "examples" / pair["data"]), "limit": args.limit,
                    "chat_template": pair["chat_template"]}}
    if args.pair == "demo":
        raw["models"] = {"draft": {"model": "demo-draft"}}
    config = parse_config(raw, base=ROOT)
    pool = ModelPool(config)
    target = TargetModel(pool.target())
    encoder = PromptEncoder(load_tokenizer(config), config.data.chat_template)
    prompts = [encoder.encode(q.turns, [], None) for q in load_questions(config.data.path, limit=args.limit)]
    ids = target.eos_token_id
    eos = set() if ids is None else {int(ids)} if isinstance(ids, int) else {int(i) for i in ids}
    args.pool = pool
    return target, prompts, eos


def decoder(args: argparse.Namespace, target: Any, budget: int | str) -> Any:
    """A SpecDecoder of the pair's drafter and the sweep's policy with ``budget`` (greedy)."""
    from specframe.decode.engine import SpecDecoder, make_plugin

    name, options = PAIRS[args.pair]["drafters"][args.drafter]
    drafter = make_plugin("drafters", (name, args.pool.substitute(dict(options))), target)
    policy = make_plugin("policies", (args.policy, {"budget": budget}))
    return SpecDecoder(target, drafter, policy, make_plugin("verifiers", "greedy"), strict=False)


def batchers(args: argparse.Namespace, target: Any) -> dict[str, Any]:
    """One BatchDecoder per speculative arm, rows built and every code path run once, untimed.
    A ``/per-row`` twin (``--per-row-drafts``) has its own decoder, so no adaptive state is shared."""
    from specframe.decode.batch import BatchDecoder

    def arm(name: str, batch_drafts: bool) -> Any:
        if name == "auto":
            return BatchDecoder(decoder(args, target, "auto"), ("equal", {"budget": None}), layout=args.layout,
                                batch_drafts=batch_drafts)
        return BatchDecoder(decoder(args, target, 2 * args.budget), (name, {"budget": args.budget * max(args.sizes)}),
                            layout=args.layout, batch_drafts=batch_drafts)

    names = (*ALLOCATORS, "auto")
    arms = {name: arm(name, True) for name in names}
    if args.per_row_drafts:
        arms.update({f"{name}/per-row": arm(name, False) for name in names})
    for batcher in arms.values():
        batcher.prepare(max(args.sizes))
        batcher.generate(args.prompts[:2], max_new_tokens=4, eos_token_id=sorted(args.eos) or None)
    return arms


def refills(args: argparse.Namespace, size: int) -> bool:
    """Whether B = ``size`` also runs the continuous-batching arms (B = 1 has nothing to refill)."""
    return args.refill and size > 1


def autoregressive_refill(target: Any, prompts: list[list[int]], max_new: int, eos: set[int], size: int,
                          layout: str) -> list[list[int]]:
    """Batched greedy decoding with at most ``size`` rows live, refilled as rows finish."""
    from specframe.experiments.batch_baselines import autoregressive_refill as refill

    return refill(target, prompts, max_new, eos, size, layout)


def ar_batch(model: Any, prompts: list[list[int]], max_new: int, eos: set[int]) -> tuple[list[list[int]], float]:
    """Batched autoregressive decoding (:func:`specframe.decode.batch.autoregressive_batch`): (tokens, wall seconds)."""
    from specframe.experiments.batch_baselines import autoregressive_batch

    t0 = time.perf_counter()
    tokens = autoregressive_batch(model, prompts, max_new, eos)
    return tokens, time.perf_counter() - t0


@torch.inference_mode()
def margin_at(model: Any, prompt: list[int], tokens: list[int], reference: list[int]) -> tuple[int, float]:
    """Where ``tokens`` leaves ``reference`` and the target's top-1 minus top-2 logit there."""
    at = next((i for i, (a, b) in enumerate(zip(tokens, reference)) if a != b), min(len(tokens), len(reference)))
    ids = torch.tensor([prompt + reference[:at]], device=model.device)
    top = model(ids).logits[0, -1].float().topk(2).values
    return at, float(top[0] - top[1])


def run(args: argparse.Namespace) -> dict:
    """The interleaved sweep; returns the figures by B and arm."""
    from rich.progress import Progress

    if args.threads:
        torch.set_num_threads(args.threads)
    target, prompts, eos = load(args)
    args.prompts, args.eos = prompts, eos
    model = target.model
    solo = [ar_batch(model, [p], args.max_new_tokens, eos)[0][0] for p in prompts]
    arms = batchers(args, target)
    if args.refill:  # its code paths (join included) once, untimed, as the arms' warm-up
        autoregressive_refill(target, prompts[:3], 4, eos, 2, args.layout)
    figures: dict = {}
    with Progress() as bar:
        windows = -(-len(prompts) // (args.window or len(prompts)))
        task = bar.add_task("batch sweep", total=sum(-(-len(prompts) // b) + windows * refills(args, b)
                                                     for b in args.sizes))
        for size in args.sizes:
            for name, batcher in arms.items():
                if name.split("/")[0] in ALLOCATORS:
                    batcher.allocator.options.budget = args.budget * size
            names = ("ar", *arms) + (("ar-refill", *(f"{a}+refill" for a in arms)) if refills(args, size) else ())
            rows = {arm: {"tokens": 0, "wall": 0.0, "latency": [], "tau": [], "diverged": [],
                          "steps": 0, "nodes": 0, "padded": 0, "draft": 0.0} for arm in names}
            for start in range(0, len(prompts), size):
                chunk = list(range(start, min(start + size, len(prompts))))
                batch = [prompts[i] for i in chunk]
                outs, wall = ar_batch(model, batch, args.max_new_tokens, eos)
                record(rows["ar"], model, chunk, prompts, solo, outs, wall, [wall] * len(chunk), None)
                for name, batcher in arms.items():
                    res = batcher.generate(batch, max_new_tokens=args.max_new_tokens, eos_token_id=sorted(eos) or None)
                    record(rows[name], model, chunk, prompts, solo, [o.tokens for o in res.outputs], res.wall_time,
                           [o.wall_time for o in res.outputs], [o.tau for o in res.outputs])
                    work(rows[name], res)
                bar.advance(task)
            if refills(args, size):
                window = args.window or len(prompts)
                for start in range(0, len(prompts), window):
                    chunk = list(range(start, min(start + window, len(prompts))))
                    batch = [prompts[i] for i in chunk]
                    t0 = time.perf_counter()
                    outs = autoregressive_refill(target, batch, args.max_new_tokens, eos, size, args.layout)
                    wall = time.perf_counter() - t0
                    record(rows["ar-refill"], model, chunk, prompts, solo, outs, wall, [], None)
                    for name, batcher in arms.items():
                        res = batcher.generate(batch, max_new_tokens=args.max_new_tokens,
                                               eos_token_id=sorted(eos) or None, max_live=size)
                        record(rows[f"{name}+refill"], model, chunk, prompts, solo, [o.tokens for o in res.outputs],
                               res.wall_time, res.latencies, [o.tau for o in res.outputs])
                        work(rows[f"{name}+refill"], res)
                    bar.advance(task)
            figures[size] = rows
            write(args, figures, "partial: B = " + ", ".join(map(str, figures)))  # a crash keeps the finished B
    return figures


def write(args: argparse.Namespace, figures: dict, note: str) -> None:
    """The table so far and the raw figures to ``--out`` (if given)."""
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"table": table(figures, args) + f"\n\n{note}", "figures": figures}, indent=1))


def record(row: dict, model: Any, chunk: list[int], prompts: list, solo: list, outs: list, wall: float,
           latency: list[float], tau: list[float] | None) -> None:
    """Add one batch's figures to an arm's row, with its divergences from the solo decodes."""
    row["tokens"] += sum(len(o) for o in outs)
    row["wall"] += wall
    row["latency"] += latency
    row["tau"] += tau or []
    for i, tokens in zip(chunk, outs):
        if tokens != solo[i]:
            at, margin = margin_at(model, prompts[i], tokens, solo[i])
            row["diverged"].append({"prompt": i, "at": at, "margin": round(margin, 4)})


def work(row: dict, res: Any) -> None:
    """Add a batched run's steps, verified nodes, forward rows (what the forward computed: the nodes
    in the flat layout, live rows x the longest tree in the padded one) and draft seconds (all rows)
    to an arm's row."""
    row["steps"] += len(res.step_times)
    row["nodes"] += sum(s.tree_size for o in res.outputs for s in o.steps)
    row["padded"] += sum(res.step_rows)
    row["draft"] += sum(s.draft_time for o in res.outputs for s in o.steps)


def table(figures: dict, args: argparse.Namespace) -> str:
    """The sweep as a markdown table."""
    lines = [f"{args.pair} / {args.drafter} / {args.policy}, batch budget {args.budget} x B, "
             f"{args.limit} prompts x {args.max_new_tokens} tokens, {args.dtype}, threads {args.threads or 'default'}"
             f"{', packed linears' if args.packed_linears else ''}, layout {args.layout}",
             "", "| B | arm | tokens/s | speedup vs ar | vs ar-refill | mean latency (s) | mean tau | nodes / step | "
                 "forward rows / step | draft ms / step | diverged |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for size, rows in figures.items():
        base = rows["ar"]["tokens"] / rows["ar"]["wall"]
        refill = rows["ar-refill"]["tokens"] / rows["ar-refill"]["wall"] if "ar-refill" in rows else None
        for arm, r in rows.items():
            tps = r["tokens"] / r["wall"]
            vs_refill = f"{tps / refill:.2f}x" if refill and "refill" in arm else "-"
            latency = f"{statistics.mean(r['latency']):.2f}" if r["latency"] else "-"
            tau = f"{statistics.mean(r['tau']):.2f}" if r["tau"] else "1.00"
            div = ", ".join(f"p{d['prompt']}@{d['at']} (margin {d['margin']})" for d in r["diverged"]) or "none"
            steps = r["steps"]
            nodes = f"{r['nodes'] / steps:.1f}" if steps else str(size)
            padded = f"{r['padded'] / steps:.1f}" if steps else str(size)
            draft = f"{1e3 * r['draft'] / steps:.2f}" if steps else "0"
            lines.append(f"| {size} | {arm} | {tps:.1f} | {tps / base:.2f}x | {vs_refill} | "
                         f"{latency} | {tau} | {nodes} | {padded} | {draft} | {div} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Run the sweep and print (and optionally write) its table."""
    args = parse_args(argv)
    t0 = time.perf_counter()
    figures = run(args)
    text = table(figures, args) + f"\n\none interleaved run, {time.perf_counter() - t0:.0f} s"
    print(text)
    write(args, figures, f"one interleaved run, {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
