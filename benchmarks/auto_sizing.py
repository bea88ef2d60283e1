"""Acceptance tables of the "auto" sizes: do they keep up with the best fixed size?

One table = ONE interleaved experiment (every arm on every prompt in turn, the harness of
``specframe run``), printed with its pass/fail checks:

* ``--table talon``: talon over N in {4, 8, 16, 32, 60} (with ``recycle``: {4, 8, 12, 16}) x mu in
  {0.01, 0.03, 0.1, 0.3}, plus ``budget="auto", mu="auto"``; passes when auto reaches >= 95% of
  the best fixed arm's tokens/s.
* ``--table chain``: chain gamma 2..8 plus ``gamma="auto"``; the same 95% bar.
* Both tables carry the autoregressive arm; with the ngram drafter also hf-prompt-lookup. With
  ngram the auto arm must be at least as fast as hf-prompt-lookup and never more than 3%
  slower than autoregressive.

Pairs: ``--pair smollm2`` (SmolLM2-135M-Instruct, chat prompts with the chat template; drafters
``ngram``, ``recycle`` or ``eagle3`` = the ``smollm2-135m-instruct-eagle3`` head) and ``--pair demo``
(the shipped demo pair on code prompts; drafters ``model`` = demo-draft, ``ngram``, ``recycle``,
``eagle3`` = demo-eagle). The target's cost curve is measured once (or read from the cache) before the run,
so no arm pays for it. Examples::

    python benchmarks/auto_sizing.py --pair smollm2 --drafter ngram --table talon
    python benchmarks/auto_sizing.py --pair demo --drafter model --table chain --limit 10
    python benchmarks/auto_sizing.py --smoke          # seconds: two arms per table, tiny run

Each run writes the experiment (answers, summary.json, report.md) under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TALON_N = (4, 8, 16, 32, 60)
#: Drafters swept over other sizes: Token Recycling's best fixed trees are 8-16 nodes.
TALON_N_BY_DRAFTER = {"recycle": (4, 8, 12, 16)}
TALON_MU = (0.01, 0.03, 0.1, 0.3)
CHAIN_GAMMA = tuple(range(2, 9))
BAR = 0.95  # auto must reach this fraction of the best fixed arm's tokens/s
AR_SLACK = 0.97  # ... and, with ngram, this fraction of autoregressive

PAIRS = {
    "smollm2": {"target": "smollm2-135m-instruct", "data": "prompts/chat.jsonl", "chat_template": True,
                "drafters": {"ngram": ("ngram", {}), "recycle": ("recycle", {}),
                             "eagle3": ("eagle3", {"path": "smollm2-135m-instruct-eagle3"})}},
    "demo": {"target": "demo-target", "data": "prompts/code.jsonl", "chat_template": False,
             "drafters": {"model": ("model", {"model": "draft"}), "ngram": ("ngram", {}), "recycle": ("recycle", {}),
                          "eagle3": ("eagle3", {"path": "demo-eagle"})}},
}


def fixed_arms(table: str, smoke: bool, drafter: str = "") -> list[tuple[str, str, dict]]:
    """(name, policy, options) of the fixed-size sweep (talon's sizes may depend on the drafter)."""
    if table == "talon":
        grid = [(n, mu) for n in TALON_N_BY_DRAFTER.get(drafter, TALON_N) for mu in TALON_MU]
        grid = grid[:2] if smoke else grid
        return [(f"talon-N{n}-mu{mu}", "talon", {"budget": n, "mu": mu}) for n, mu in grid]
    gammas = CHAIN_GAMMA[:2] if smoke else CHAIN_GAMMA
    return [(f"chain-g{g}", "chain", {"gamma": g}) for g in gammas]


def auto_arm(table: str) -> tuple[str, str, dict]:
    """The auto arm of a table."""
    if table == "talon":
        return ("talon-auto", "talon", {"budget": "auto", "mu": "auto"})
    return ("chain-auto", "chain", {"gamma": "auto"})


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    return repr(value)


def config_text(args: argparse.Namespace) -> str:
    """The experiment file of one table."""
    pair = PAIRS[args.pair]
    drafter, drafter_options = pair["drafters"][args.drafter]
    lines = [f"name = {_toml(f'auto-{args.pair}-{args.drafter}-{args.table}')}",
             f"max_new_tokens = {args.max_new_tokens}", f"warmup = {args.warmup}", f"repeats = {args.repeats}",
             "seed = 0"]
    if args.threads:
        lines.append(f"threads = {args.threads}")
    lines += ["", "[target]", f"model = {_toml(pair['target'])}", f"dtype = {_toml(args.dtype)}",
              f"device = {_toml(args.device)}"]
    if args.packed_linears:
        lines.append("packed_linears = true")
    if args.pair == "demo":
        lines += ["", "[models.draft]", 'model = "demo-draft"']
    lines += ["", "[drafter]", f"name = {_toml(drafter)}", f"options = {_toml(drafter_options)}"]
    lines += ["", "[[arm]]", 'baseline = "autoregressive"']
    if args.drafter == "ngram":
        lines += ["", "[[arm]]", 'baseline = "hf-prompt-lookup"']
    for name, policy, options in fixed_arms(args.table, args.smoke, args.drafter) + [auto_arm(args.table)]:
        lines += ["", "[[arm]]", f"name = {_toml(name)}", f"policy = {_toml(policy)}",
                  f"policy_options = {_toml(options)}"]
    data = (ROOT / "examples" / pair["data"]).as_posix()
    lines += ["", "[data]", f"path = {_toml(data)}", f"limit = {args.limit}",
              f"chat_template = {_toml(pair['chat_template'])}"]
    return "\n".join(lines) + "\n"


def warm_cost_curve(config: Any) -> str:
    """Measure (or read) the target's cost curve before the timed run, under the run's threads."""
    import torch

    from specframe.experiments.loading import ModelPool
    from specframe.sizing.profile import curve_for
    from specframe.models.target import TargetModel

    before = torch.get_num_threads()
    if config.threads:
        torch.set_num_threads(config.threads)
    try:
        curve = curve_for(TargetModel(ModelPool(config).target()))
    finally:
        torch.set_num_threads(before)
    return curve.key


def best_fixed(arms: dict[str, dict], table: str) -> str:
    """The fastest fixed-size arm of a table."""
    auto_name = auto_arm(table)[0]
    fixed = [k for k in arms if k.startswith(table + "-") and k != auto_name]
    return max(fixed, key=lambda k: arms[k]["tokens_per_s"])


def checks(arms: dict[str, dict], table: str, drafter: str) -> list[str]:
    """The pass/fail lines for one table (the bars of the module docstring)."""
    auto_name = auto_arm(table)[0]
    auto = arms[auto_name]["tokens_per_s"]
    best_name = best_fixed(arms, table)
    best = arms[best_name]["tokens_per_s"]
    out = [f"{auto_name}: {auto:.1f} tok/s = {auto / best:.1%} of the best fixed arm {best_name} "
           f"({best:.1f}): {'PASS' if auto >= BAR * best else 'FAIL'} (bar {BAR:.0%})"]
    ar = arms["autoregressive"]["tokens_per_s"]
    out.append(f"{auto_name} vs autoregressive: x{auto / ar:.3f}"
               + (f": {'PASS' if auto >= AR_SLACK * ar else 'FAIL'} (bar x{AR_SLACK})" if drafter == "ngram" else ""))
    if "hf-prompt-lookup" in arms:
        pl = arms["hf-prompt-lookup"]["tokens_per_s"]
        out.append(f"{auto_name} vs hf-prompt-lookup: x{auto / pl:.3f}: {'PASS' if auto >= pl else 'FAIL'}")
    return out


def same_work_groups(answers_dir: Path) -> list[list[str]]:
    """Arms that built trees of the same size and depth and accepted the same on every step of
    every answer (e.g. talon N = 4 at any mu: its one layer never meets the gate): what they
    differ by in tokens/s is the run's timing noise."""
    groups: dict[tuple, list[str]] = {}
    for path in sorted(answers_dir.glob("*.jsonl")):
        records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        if not records or not all(r.get("steps") for r in records):
            continue
        records.sort(key=lambda r: (str(r["question_id"]), int(r["repeat"])))
        work = tuple(tuple(r["steps"][k]) for r in records for k in ("tree_size", "depth", "accepted"))
        groups.setdefault(work, []).append(path.stem)
    return [names for names in groups.values() if len(names) > 1]


def noise_lines(arms: dict[str, dict], groups: list[list[str]], auto_name: str | None = None,
                best_name: str | None = None) -> list[str]:
    """One line per group of same-work arms: the spread of their tokens/s, and for the group of
    ``best_name`` (the best fixed arm) ``auto_name``'s rate against the group's mean (the best
    of many noisy arms is biased upward; a group's mean is not)."""
    out = []
    for names in groups:
        rates = [arms[n]["tokens_per_s"] for n in names if n in arms]
        if len(rates) < 2 or min(rates) <= 0:
            continue
        line = (f"noise: {', '.join(names)} built the same trees on every step; their tokens/s "
                f"spread {max(rates) / min(rates) - 1:.1%} ({min(rates):.1f}-{max(rates):.1f})")
        if auto_name in arms and best_name in names:
            mean = sum(rates) / len(rates)
            line += f"; {auto_name} = {arms[auto_name]['tokens_per_s'] / mean:.1%} of their mean ({mean:.1f})"
        out.append(line)
    return out


def table_text(summary: dict, args: argparse.Namespace, curve_key: str, wall: float,
               groups: list[list[str]] | None = None) -> str:
    """The table of one run, best tokens/s first, then the checks (and, given the groups of
    :func:`same_work_groups`, the run's noise)."""
    arms = {a["name"]: {**a["overall"], "mean_tree_size": (a.get("shapes") or {}).get("mean_tree_size")}
            for a in summary["arms"]}
    lines = [f"auto sizing: pair {args.pair}, drafter {args.drafter}, table {args.table}, "
             f"{args.limit} prompts x {args.repeats} repeat(s), {args.max_new_tokens} new tokens, "
             f"threads {args.threads or 'default'}; one interleaved run, {wall:.0f} s",
             f"cost curve: {curve_key}", "",
             f"{'arm':<22} {'tok/s':>8} {'speedup':>8} {'tau':>6} {'delta':>6} {'tree':>6} {'mism.':>6}"]
    fmt = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
    for name, m in sorted(arms.items(), key=lambda kv: -(kv[1].get("tokens_per_s") or 0.0)):
        lines.append(f"{name:<22} {fmt(m.get('tokens_per_s'), '8.1f')} {fmt(m.get('speedup'), '8.3f')} "
                     f"{fmt(m.get('tau'), '6.2f')} {fmt(m.get('delta'), '6.2f')} "
                     f"{fmt(m.get('mean_tree_size'), '6.1f')} {fmt(m.get('mismatches'), '>6')}")
    return "\n".join(lines + [""] + checks(arms, args.table, args.drafter)
                     + noise_lines(arms, groups or [], auto_arm(args.table)[0], best_fixed(arms, args.table))) + "\n"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (``--smoke`` shrinks everything to seconds on the demo pair)."""
    parser = argparse.ArgumentParser(description="acceptance tables of the auto sizes (one interleaved run per table)")
    parser.add_argument("--pair", choices=sorted(PAIRS), default="smollm2")
    drafters = "; ".join(f"{pair}: {' | '.join(sorted(spec['drafters']))}" for pair, spec in sorted(PAIRS.items()))
    parser.add_argument("--drafter", default="ngram", help=f"a drafter of the pair's PAIRS entry ({drafters})")
    parser.add_argument("--table", choices=("talon", "chain"), default="talon")
    parser.add_argument("--limit", type=int, default=20, help="prompts (default 20)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=2, help="untimed generations per arm (the auto arms learn here too)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--packed-linears", action=argparse.BooleanOptionalAction, default=None,
                        help="fast small-batch target linears, the fastest kernel here (default: on for smollm2, as examples/smollm2.toml)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "auto_sizing")
    parser.add_argument("--smoke", action="store_true", help="demo pair, 2 fixed arms, 1 prompt, 8 tokens")
    args = parser.parse_args(argv)
    if args.smoke:
        args.pair, args.limit, args.max_new_tokens, args.warmup, args.threads = "demo", 1, 8, 1, 1
        args.drafter = args.drafter if args.drafter in PAIRS["demo"]["drafters"] else "model"
    if args.packed_linears is None:
        args.packed_linears = args.pair == "smollm2" and not args.smoke
    if args.drafter not in PAIRS[args.pair]["drafters"]:
        parser.error(f"--drafter for pair {args.pair}: one of {sorted(PAIRS[args.pair]['drafters'])}")
    return args


def main(argv: list[str] | None = None) -> str:
    """Run one table and print it; returns the printed text."""
    from specframe.experiments.config import load_config
    from specframe.experiments.experiment import run_experiment
    from specframe.experiments.report import write_report

    args = parse(argv)
    out_dir = args.out / f"{args.pair}-{args.drafter}-{args.table}"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "auto_sizing.toml"
        path.write_text(config_text(args), encoding="utf-8")
        config = load_config(path)
        key = warm_cost_curve(config)
        start = time.perf_counter()
        outcome = run_experiment(config, out_dir=out_dir, fresh=True, progress=False)
    text = table_text(write_report(outcome.out_dir), args, key, time.perf_counter() - start,
                      same_work_groups(Path(outcome.out_dir) / "answers"))
    (out_dir / "auto_sizing.txt").write_text(text, encoding="utf-8")
    print(text)
    return text


if __name__ == "__main__":
    main()
