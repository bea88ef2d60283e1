"""Where a decoding step's time goes, per arm, and what the engine costs beside the forwards.

For each pair (``smollm2``: SmolLM2-135M-Instruct as examples/demo.toml builds it, float32 packed
linears and the exact forward, chat prompts; ``tiny``: the shipped demo pair of
examples/demo-tiny.toml) every arm answers the same prompts, round-robin (every arm answers
prompt i before any answers i + 1), after one untimed warm-up generation per arm. Per arm,
in ms per decoding step with the prefill taken out:

- the engine's fields (``StepStats``): target forward, draft time split into the time inside the
  drafter's modules' forwards (forward pre/post hooks; 0 for model-free drafters) and the rest,
  policy, verify, kv, commit, emit, stop, record, callback, other;
- engine = step - target - draft forwards; T(n) alone: the bare target tree forward of the arm's
  mean node count (a chain) at the arms' mean context (prompt + half the new tokens), median of
  repeats, every size taking turns in each round;
- prefill share and time to first token; check = |fields + prefill + set-up - wall| / wall
  (largest over the arm's generations).

Baselines have no fields. Their step is (wall - time to first token) / (forwards - 1): the
forwards after the one that held the prefill (autoregressive's first forward is its prefill;
transformers merges the prefill into its first verification, and its streamer stamps the first
token's arrival); their target (and assistant) forward times are the hooked forwards after the
first token. transformers' prompt lookup and assisted generation (peers) have no separate
prefill: for the prefill share it is timed alone (one generate with max_new_tokens = 1). No
small draft model ships for SmolLM2, so assisted generation runs on the tiny pair only.

For the tiny pair it also prints each speculative arm's break-even forward cost
T1* = (engine + draft) / (tau - r), r = T(n) / T(1): the target forward time at which the arm's
tau, tree cost and per-step overhead would tie autoregressive decoding.

    python benchmarks/step_overhead.py [--prompts 3] [--tokens 64] [--pairs smollm2,tiny] [--threads 2]
"""

from __future__ import annotations

import argparse
import datetime
import functools
import statistics
import subprocess
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
EAGLE3 = {"path": "smollm2-135m-instruct-eagle3"}
HYBRID = {"drafters": ["ngram", ["recycle", {"prompt_rows": False}]]}
PAIRS: dict[str, dict] = {
    "smollm2": {"config": "examples/demo.toml", "arms": [
        {"baseline": "autoregressive"},
        {"name": "ngram+chain-4", "drafter": "ngram", "policy": "chain", "policy_options": {"gamma": 4}},
        {"name": "eagle3+talon-auto", "drafter": "eagle3", "drafter_options": EAGLE3, "policy": "talon",
         "policy_options": {"budget": "auto", "mu": "auto"}},
        {"name": "hybrid+chain-auto", "drafter": "hybrid", "drafter_options": HYBRID, "policy": "chain",
         "policy_options": {"gamma": "auto"}},
        {"baseline": "hf-prompt-lookup"},
    ], "note": "no small draft model ships for SmolLM2: transformers' assisted generation runs on the tiny pair"},
    # None: the demo-tiny arms (autoregressive and hf-assisted among them), plus the peer below.
    "tiny": {"config": "examples/demo-tiny.toml", "arms": None, "extra": [{"baseline": "hf-prompt-lookup"}]},
}
FIELDS = ("policy", "verify", "kv", "commit", "emit", "stop", "record", "callback", "other")
COLUMNS = ("arm", "tau", "nodes/step", "step ms", "ms/token", "target", "draft fwd", "draft rest", *FIELDS,
           "engine", "T(n) alone", "prefill %", "TTFT ms", "check %")


class ForwardClock:
    """Seconds spent inside some modules' forwards (outermost calls only), as (start, end)
    intervals on ``perf_counter``'s clock.

    Each module's ``forward`` is wrapped on the instance while the clock runs, rather than hooked:
    a module with hooks takes ``nn.Module``'s slow call path, whose extra work around the hooks
    (a few microseconds a call, cold after a forward) would land outside the intervals and be
    counted as the engine's."""

    def __init__(self, modules: list[torch.nn.Module]) -> None:
        self.modules, self.intervals, self._depth = modules, [], 0
        self._saved: list[tuple[torch.nn.Module, Any]] = []

    def _wrap(self, forward: Any) -> Any:
        @functools.wraps(forward)  # transformers reads the forward's signature
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter() if self._depth == 0 else 0.0
            self._depth += 1
            try:
                return forward(*args, **kwargs)
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self.intervals.append((start, time.perf_counter()))
        return timed

    def __enter__(self) -> "ForwardClock":
        for m in self.modules:
            self._saved.append((m, m.__dict__.get("forward")))
            m.forward = self._wrap(m.forward)
        return self

    def __exit__(self, *_: Any) -> None:
        for m, own in reversed(self._saved):
            if own is None:
                del m.forward
            else:
                m.forward = own
        self._saved.clear()

    def after(self, moment: float) -> tuple[float, int]:
        """Seconds and calls of the forwards begun after ``moment``."""
        found = [e - s for s, e in self.intervals if s >= moment]
        return sum(found), len(found)


def hooked(roots: list[torch.nn.Module], exclude: set[int] = frozenset()) -> list[torch.nn.Module]:
    """``roots`` and their direct children (a head's ``logits`` calls its lm_head outside its
    own forward), less any module in ``exclude`` (the target's, which a head may share)."""
    out: dict[int, torch.nn.Module] = {}
    for root in roots:
        for m in (root, *root.children()):
            if id(m) not in exclude:
                out.setdefault(id(m), m)
    return list(out.values())


def draft_modules(drafter: Any, exclude: set[int]) -> list[torch.nn.Module]:
    """The nn.Modules a drafter holds (its draft model, head or a hybrid's parts'), found by
    walking its attributes; the target's modules are left out."""
    found: list[torch.nn.Module] = []
    seen: set[int] = set()

    def walk(obj: Any, depth: int) -> None:
        if id(obj) in seen or depth > 4 or isinstance(obj, (torch.Tensor, type, str, int, float)):
            return
        seen.add(id(obj))
        if isinstance(obj, torch.nn.Module):
            if id(obj) not in exclude:
                found.append(obj)
            return
        items = obj if isinstance(obj, (list, tuple)) else obj.values() if isinstance(obj, dict) else \
            vars(obj).values() if hasattr(obj, "__dict__") else ()
        for value in items:
            walk(value, depth + 1)

    walk(drafter, 0)
    return hooked(found, exclude)


@dataclass
class ArmTotals:
    """One arm's sums over its timed generations (seconds)."""

    name: str
    kind: str  # "spec", "autoregressive" or "hf"
    steps: int = 0
    tokens: int = 0
    nodes: int = 0
    wall: float = 0.0
    prefill: float = 0.0
    ttft: list[float] = field(default_factory=list)
    fields: dict[str, float] = field(default_factory=dict)
    check: float = 0.0
    context: list[int] = field(default_factory=list)

    def add(self, name: str, seconds: float) -> None:
        """Add ``seconds`` to a field."""
        self.fields[name] = self.fields.get(name, 0.0) + seconds


def timed_spec(runner: Any, prompt: list[int], tokens: int, eos: set[int], clock: ForwardClock, acc: ArmTotals) -> None:
    """One specframe generation: its fields, its draft modules' forwards after the set-up."""
    views: list = []
    start = time.perf_counter()
    out = runner.decoder.generate(torch.tensor(prompt), max_new_tokens=tokens, eos_token_id=sorted(eos) or None,
                                  on_step=views.append)
    forwards, _ = clock.after(start + out.setup_time + out.prefill_time)
    acc.steps += len(out.steps)
    acc.tokens += len(out.tokens)
    acc.nodes += sum(s.tree_size for s in out.steps)
    acc.wall += out.wall_time
    acc.prefill += out.prefill_time
    acc.ttft.append(out.time_to_first_token)
    acc.check = max(acc.check, abs(out.accounted_time - out.wall_time) / out.wall_time)
    acc.add("draft fwd", forwards)
    for f in ("target", "draft", *FIELDS):
        acc.add(f, sum(getattr(s, f"{f}_time") for s in out.steps))
    acc.add("step", sum(s.total_time for s in out.steps))


def timed_baseline(runner: Any, prompt: list[int], tokens: int, eos: set[int], target_clock: ForwardClock,
                   draft_clock: ForwardClock | None, acc: ArmTotals) -> None:
    """One baseline generation: the steps after the first token (its arrival on the host ends
    the prefill's forward, merged with the first verification in transformers), the target's
    (and the assistant's) forwards among them; transformers' prefill, which no field or
    callback separates, timed alone beforehand for the prefill share."""
    prefill = None
    if acc.kind == "hf":
        start = time.perf_counter()
        runner.generate(prompt, 1, eos)
        prefill = time.perf_counter() - start
    start = time.perf_counter()
    out = runner.generate(prompt, tokens, eos)
    wall = time.perf_counter() - start
    first = start + out.time_to_first_token
    steps = out.target_forwards - 1  # the first forward (the prefill's) yields the first token
    acc.steps += steps
    acc.tokens += len(out.tokens) - 1
    acc.nodes += steps if acc.kind == "autoregressive" else 0
    acc.wall += wall
    acc.prefill += out.prefill_time if prefill is None else prefill
    acc.ttft.append(out.time_to_first_token)
    acc.add("step", wall - out.time_to_first_token)
    acc.add("target", target_clock.after(first)[0])
    acc.add("draft fwd", draft_clock.after(first)[0] if draft_clock is not None else 0.0)


def chain_forwards_ms(target: Any, sizes: set[int], context: int, reps: int) -> dict[int, float]:
    """Median ms of the bare target forward of an ``n``-node chain, for each ``n`` of ``sizes``,
    whose root sits at position ``context - 1`` (the cache cut back after each). The sizes take
    turns in every round, so a change of load hits them alike (their ratios stay comparable)."""
    from specframe.sizing.profile import balanced_tree

    device = target.device
    trees = {n: balanced_tree(max(1, n), target.vocab_size, fanout=1) for n in sorted(sizes)}
    inputs = {n: (t.tokens.to(device), t.positions(context).to(device), t.ancestor_mask().to(device), len(t))
              for n, t in trees.items()}
    target.reset()
    target.causal_forward(torch.arange(context - 1, device=device) % target.vocab_size)
    times: dict[int, list[float]] = {n: [] for n in inputs}
    for rep in range(reps + 1):  # round 0 is a warm-up
        for n, (tokens, positions, mask, size) in inputs.items():
            start = time.perf_counter()
            target.tree_forward(tokens, positions, mask, max_position=context - 2 + size)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if rep:
                times[n].append(time.perf_counter() - start)
            target.keep(context - 1, torch.empty(0, dtype=torch.long), contiguous=True)
    target.reset()
    return {n: statistics.median(t) * 1e3 for n, t in times.items()}


def load_pair(pair: str, prompts: int, tokens: int, threads: int) -> tuple[Any, ...]:
    """The pair's config (its arms replaced as :data:`PAIRS` says), target, runners, prompts and EOS."""
    from specframe.experiments.config import parse_config
    from specframe.experiments.data import PromptEncoder, load_questions
    from specframe.experiments.loading import ModelPool, load_tokenizer, no_loading_bars, stop_tokens
    from specframe.experiments.runners import build_runner
    from specframe.models.target import TargetModel

    spec = PAIRS[pair]
    path = ROOT / spec["config"]
    raw = tomllib.loads(path.read_text())
    raw.update(max_new_tokens=tokens, threads=threads, warmup=0)
    raw["arm"] = (spec["arms"] or raw["arm"]) + spec.get("extra", [])
    raw["data"]["limit"] = prompts
    cfg = parse_config(raw, base=path.parent, source=path)
    pool = ModelPool(cfg)
    with no_loading_bars():
        target = TargetModel(pool.target())
        runners = {arm.name: build_runner(arm, pool, target, cfg) for arm in cfg.arms}
    encoder = PromptEncoder(load_tokenizer(cfg), cfg.data.chat_template)
    ids = [encoder.encode(q.turns[:1], [], None) for q in load_questions(cfg.data.path, cfg.data.category, prompts)]
    return cfg, target, runners, ids, stop_tokens(cfg, target)


def measure_pair(pair: str, prompts: int, tokens: int, threads: int, reps: int = 15) -> tuple[list[dict], list[str]]:
    """Every arm of ``pair`` on ``prompts`` prompts x ``tokens`` tokens, interleaved: one table
    row per arm (ms per step) and the notes to print under it."""
    torch.set_num_threads(threads)
    cfg, target, runners, ids, eos = load_pair(pair, prompts, tokens, threads)
    exclude = {id(m) for m in target.model.modules()}
    target_clock = ForwardClock(hooked([target.model]))
    clocks, accs = {}, {}
    for arm in cfg.arms:
        runner = runners[arm.name]
        kind = "spec" if arm.baseline is None else "autoregressive" if arm.baseline == "autoregressive" else "hf"
        assistant = getattr(runner, "assistant", None)
        draft = draft_modules(runner.decoder.drafter, exclude) if kind == "spec" else \
            hooked([assistant], exclude) if assistant is not None else []
        clocks[arm.name] = ForwardClock(draft) if draft else None
        accs[arm.name] = ArmTotals(arm.name, kind)
    for timed, i in [(False, 0)] + [(True, i) for i in range(len(ids))]:  # a warm-up round first
        for arm in cfg.arms:
            acc = accs[arm.name] if timed else ArmTotals(arm.name, accs[arm.name].kind)
            clock = clocks[arm.name] or ForwardClock([])
            clock.intervals.clear()
            target_clock.intervals.clear()
            with clock:
                if acc.kind == "spec":
                    timed_spec(runners[arm.name], ids[i], tokens, eos, clock, acc)
                else:  # the target's forwards are hooked for the baselines only (no field times them)
                    with target_clock:
                        timed_baseline(runners[arm.name], ids[i], tokens, eos, target_clock, clocks[arm.name], acc)
            acc.context.append(len(ids[i]) + tokens // 2)
    context = round(statistics.mean(c for acc in accs.values() for c in acc.context))
    sizes = {1} | {round(acc.nodes / max(1, acc.steps)) for acc in accs.values() if acc.kind != "hf"}
    forward = chain_forwards_ms(target, sizes, context, reps)
    rows = [row_of(acc, forward) for acc in accs.values()]
    return rows, [PAIRS[pair]["note"]] if "note" in PAIRS[pair] else []


def row_of(acc: ArmTotals, forward: dict[int, float]) -> dict:
    """The table row of one arm: ms per step, shares, and T(n) alone (``forward``: ms by size)."""
    per = lambda f: acc.fields.get(f, 0.0) / max(1, acc.steps) * 1e3  # noqa: E731
    step = per("step")
    row: dict[str, Any] = {"arm": acc.name, "kind": acc.kind, "tau": acc.tokens / max(1, acc.steps), "step ms": step,
                           "target": per("target"), "draft fwd": per("draft fwd"),
                           "prefill %": 100 * acc.prefill / acc.wall if acc.wall else None,
                           "TTFT ms": statistics.mean(acc.ttft) * 1e3 if acc.ttft else None,
                           "check %": 100 * acc.check if acc.kind == "spec" else None}
    row["ms/token"] = step / row["tau"] if row["tau"] else None
    row["engine"] = step - row["target"] - row["draft fwd"]
    if acc.kind == "spec":
        row["draft rest"] = per("draft") - row["draft fwd"]
        row.update({f: per(f) for f in FIELDS})
    if acc.kind != "hf":
        row["nodes/step"] = acc.nodes / max(1, acc.steps)
        row["T(n) alone"] = forward[round(row["nodes/step"])]
        row["T(1) alone"] = forward[1]
    return row


def break_even(rows: list[dict]) -> list[str]:
    """Per speculative arm: T1* = (engine + draft) / (tau - r), the target forward time at
    which it would tie autoregressive decoding (a note where tau <= r: it cannot pay)."""
    lines = []
    for r in rows:
        if r["kind"] != "spec":
            continue
        ratio = r["T(n) alone"] / r["T(1) alone"]
        overhead = r["step ms"] - r["target"]  # engine + every draft ms
        if r["tau"] <= ratio:
            lines.append(f"  {r['arm']}: tau {r['tau']:.2f} <= r {ratio:.2f}: never pays at this tree size")
        else:
            lines.append(f"  {r['arm']}: T1* = {overhead:.2f} / ({r['tau']:.2f} - {ratio:.2f}) = "
                         f"{overhead / (r['tau'] - ratio):.2f} ms (T(1) here: {r['T(1) alone']:.2f} ms)")
    return lines


def format_table(rows: list[dict]) -> str:
    """The rows as an aligned text table ("-": not measured for that arm)."""
    def cell(value: Any) -> str:
        return "-" if value is None else value if isinstance(value, str) else f"{value:.2f}"

    cells = [[cell(r.get(c)) for c in COLUMNS] for r in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(COLUMNS)]
    line = lambda vals: "  ".join(v.ljust(w) if i == 0 else v.rjust(w)  # noqa: E731
                                  for i, (v, w) in enumerate(zip(vals, widths)))
    return "\n".join([line(COLUMNS), *(line(r) for r in cells)])


def header(threads: int) -> str:
    """CPU model, torch threads, git commit and date."""
    cpu = next((l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                if l.startswith("model name")), "unknown") if Path("/proc/cpuinfo").exists() else "unknown"
    commit = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True,
                            text=True).stdout.strip() or "unknown"
    return (f"CPU {cpu}; torch {torch.__version__}, {threads} threads; commit {commit}; "
            f"{datetime.datetime.now().isoformat(timespec='seconds')}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--pairs", default="smollm2,tiny")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    print(header(args.threads))
    print("ms per decoding step, prefill taken out; engine = step - target - draft fwd; check = |fields + prefill + "
          "set-up - wall| / wall")
    for pair in args.pairs.split(","):
        rows, notes = measure_pair(pair, args.prompts, args.tokens, args.threads)
        print(f"\n== {pair}: {args.prompts} prompts x {args.tokens} tokens ==")
        print(format_table(rows))
        for note in notes:
            print(f"note: {note}")
        if pair == "tiny":
            print("break-even target forward T1* (the arm ties autoregressive decoding at that forward cost):")
            print("\n".join(break_even(rows)))


if __name__ == "__main__":
    main()
