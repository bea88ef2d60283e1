"""One prepared benchmark for a GPU machine (sized for one H200 and 15 minutes of device time).

Full mode finishes in under 8 minutes and writes ONE JSON file plus a short text summary:

1. verification latency T(n) of a Llama-3-8B-shaped target (random weights, bf16, SDPA, no
   download) for tree sizes n = 1, 2, 4, ..., 128 at prefix 512 and 2048;
2. per-step time split (target, draft, policy, other) for chain, eagle and talon with the 8B
   target and a 1-layer EAGLE-shaped draft (one Llama decoder layer of the target's width with
   the target's vocabulary, run through the ``model`` drafter: the same compute as an EAGLE-1
   head minus its fc layer; random weights, so the split, not tau, is the result);
3. the demo pair end to end (all arms of examples/demo-tiny.toml, greedy, float32 and bf16) with
   speedups vs the autoregressive arm;
4. projected speedup per policy for the 8B shape: tau and delta measured on the demo pair
   combined with the measured T(n) and draft step time (a PROJECTION, labelled as such);
5. engine paths: talon step time on the 8B shape with the reference set-up (strict engine:
   every tree checked on the host; growing KV cache) vs the fast one (one host read per step,
   pre-allocated KV cache), and the demo target eager vs ``torch.compile``d (compile time,
   ms per generated token, whether the tokens agree);
6. hardware-aware sizes: the cost curve ``specframe profile`` measures for the demo
   target on this device, and the ``gamma="auto"`` / ``budget="auto", mu="auto"`` arms, which
   also run in sections 2 (8B shape, random draft: nothing to accept, so auto should send
   plain steps) and 3 (demo pair: a flat GPU curve should give larger trees than on a CPU),
   with the mean tree size each arm kept.

``--smoke`` runs the same code on tiny shapes on the CPU in seconds (CI runs it).

    python benchmarks/gpu_suite.py --out benchmarks/results            # on the GPU
    python benchmarks/gpu_suite.py --smoke --out /tmp/gpu-smoke          # anywhere
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

import specframe
from specframe.models.target import TargetModel

ROOT = Path(__file__).resolve().parent.parent
POLICIES = {"chain": ("chain", {"gamma": 4}), "eagle": ("eagle", {}), "talon": ("talon", {}),
            "chain-auto": ("chain", {"gamma": "auto"}), "talon-auto": ("talon", {"budget": "auto", "mu": "auto"})}
#: Arms added to examples/demo-tiny.toml in section 3 (names match POLICIES for the projection).
AUTO_ARMS = {"chain-auto": POLICIES["chain-auto"], "talon-auto": POLICIES["talon-auto"]}

# Llama-3-8B's shape (random weights: shapes decide latency, values do not).
LLAMA3_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                 num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                 rope_theta=500000.0)
SMOKE_SHAPE = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)


@dataclasses.dataclass
class Plan:
    """What one mode measures."""

    device: torch.device
    dtype: torch.dtype
    shape: dict
    sizes: list[int]
    prefixes: list[int]
    reps: int
    step_tokens: int
    demo_dtypes: list[str]
    demo_limit: int | None
    demo_tokens: int | None
    curve_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)


def plan_for(smoke: bool) -> Plan:
    """Full plan on CUDA, tiny plan on CPU for --smoke."""
    if smoke:
        return Plan(torch.device("cpu"), torch.float32, SMOKE_SHAPE, [1, 2, 4, 8], [16, 32], 2, 8,
                    ["float32"], 1, 8, (1, 2, 4))
    if not torch.cuda.is_available():
        raise SystemExit("full mode needs a CUDA GPU; use --smoke on a CPU")
    return Plan(torch.device("cuda"), torch.bfloat16, LLAMA3_8B, [2 ** i for i in range(8)], [512, 2048],
                10, 64, ["float32", "bfloat16"], None, None)


def sync(device: torch.device) -> None:
    """Wait for queued GPU work so host timers measure it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device: torch.device, reps: int) -> float:
    """Median wall time of ``fn`` in seconds over ``reps`` runs after one warm-up."""
    fn()
    times = []
    for _ in range(reps):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def llama(shape: dict, layers: int | None, plan: Plan, seed: int) -> Any:
    """A randomly initialised Llama of ``shape`` built directly on the plan's device."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**{**shape, **({"num_hidden_layers": layers} if layers else {})})
    torch.manual_seed(seed)
    with plan.device:
        model = LlamaForCausalLM._from_config(cfg, dtype=plan.dtype, attn_implementation="sdpa")
    return model.eval()


def balanced_tree(n: int, vocab: int) -> specframe.DraftTree:
    """An n-node tree of fan-out 4 (breadth first): a typical verification workload."""
    tree = specframe.DraftTree.root(1)
    for i in range(1, n):
        parent = (i - 1) // 4
        tree = tree.add_nodes(torch.tensor([parent]), torch.tensor([(7 * i) % vocab]), torch.tensor([-1.0]))
    return tree


def latency_curve(target: TargetModel, plan: Plan) -> dict:
    """T(n) in ms per prefix length: one tree forward on top of a prefilled cache."""
    curve: dict[str, dict[str, float]] = {}
    vocab = target.vocab_size
    for prefix in plan.prefixes:
        target.reset()
        target.causal_forward(torch.randint(0, vocab, (prefix - 1,), device=plan.device))
        row = {}
        for n in plan.sizes:
            tree = balanced_tree(n, vocab)
            tokens, mask = tree.tokens.to(plan.device), tree.ancestor_mask().to(plan.device)
            positions = tree.positions(prefix).to(plan.device)

            def verify() -> None:
                target.tree_forward(tokens, positions, mask)
                target.keep(prefix - 1, torch.empty(0, dtype=torch.long))  # back to the prefix

            row[str(n)] = 1e3 * timed(verify, plan.device, plan.reps)
        curve[str(prefix)] = row
    return curve


def warm_run(target_model: Any, draft_model: Any, policy: Any, plan: Plan, fast: bool = True) -> Any:
    """One short warm-up generation, then the measured one (``plan.step_tokens`` tokens).

    ``fast``: the default engine on a pre-allocated KV cache; False: a strict engine on a
    growing cache (the reference set-up)."""
    prompt = torch.randint(0, plan.shape["vocab_size"], (plan.prefixes[0],), generator=torch.Generator().manual_seed(0))
    dec = specframe.SpecDecoder.build(target=TargetModel(target_model, preallocate=fast),
                                      drafter=("model", {"model": draft_model}), policy=policy, strict=not fast)
    dec.generate(prompt, max_new_tokens=4, eos_token_id=None)
    sync(plan.device)
    return dec.generate(prompt, max_new_tokens=plan.step_tokens, eos_token_id=None)


def step_split(target_model: Any, draft_model: Any, plan: Plan) -> dict:
    """Mean per-step time split in ms for chain, eagle and talon on the big target (fast path)."""
    out = {}
    for label, policy in POLICIES.items():
        res = warm_run(target_model, draft_model, policy, plan)
        n = len(res.steps)

        def mean(attr: str, steps=res.steps, n=n) -> float:
            return 1e3 * sum(getattr(s, attr) for s in steps) / n

        out[label] = {
            "steps": n, "tree_size": sum(s.tree_size for s in res.steps) / n,
            "draft_forwards": res.delta, "target_ms": mean("target_time"), "draft_ms": mean("draft_time"),
            "policy_ms": mean("policy_time"), "verify_ms": mean("verify_time"), "other_ms": mean("other_time"),
            "step_ms": 1e3 * sum(s.total_time for s in res.steps) / n,
            "tokens_per_s": len(res.tokens) / res.wall_time,
            "draft_ms_per_forward": mean("draft_time") / max(res.delta, 1e-9),
        }
    return out


def demo_end_to_end(plan: Plan, out_dir: Path) -> dict:
    """All arms of examples/demo-tiny.toml (the tiny code pair) plus the auto arms, per dtype;
    returns {dtype: {arm: metrics}}."""
    from specframe.experiments.config import ArmConfig, PluginRef, load_config
    from specframe.experiments.experiment import run_experiment
    from specframe.experiments.report import write_report

    results = {}
    for dtype in plan.demo_dtypes:
        config = load_config(ROOT / "examples" / "demo-tiny.toml")
        base = next(a for a in config.arms if a.policy is not None)
        config.arms = list(config.arms) + [
            ArmConfig(name=label, policy=PluginRef(name, dict(options)), drafter=base.drafter, verifier=base.verifier)
            for label, (name, options) in AUTO_ARMS.items()]
        device = plan.device.type
        config.target = dataclasses.replace(config.target, dtype=dtype, device=device)
        config.models = {k: dataclasses.replace(v, dtype=dtype, device=device) for k, v in config.models.items()}
        if plan.demo_limit:
            config.data = dataclasses.replace(config.data, limit=plan.demo_limit)
        if plan.demo_tokens:
            config.max_new_tokens = plan.demo_tokens
        if device == "cuda":
            config.threads = None
        outcome = run_experiment(config, out_dir=out_dir / f"demo-{dtype}", fresh=True, progress=False)
        # Smoke mode (CI) leaves the figures out: drawing them was a fifth of its run.
        summary = write_report(outcome.out_dir, plots=device == "cuda")
        results[dtype] = {
            arm["name"]: {**{k: arm["overall"].get(k) for k in
                             ("tau", "delta", "tokens_per_s", "speedup", "speedup_std", "mismatches")},
                          "mean_tree_size": (arm.get("shapes") or {}).get("mean_tree_size")}
            for arm in summary["arms"]
        }
    return results


def projection(curve: dict, split: dict, demo: dict) -> dict:
    """Projected 8B speedup per policy: tau * T(1) / (T(n_policy) + delta * t_draft + policy).

    tau and delta come from the demo pair (float32), T(n) from the latency curve at the first
    prefix, the draft step time and policy time from the step split. A projection, not a
    measurement: the demo pair's acceptance stands in for a real 8B pair's.
    """
    prefix = min(curve, key=int)
    t = {int(n): ms for n, ms in curve[prefix].items()}
    demo_arms = next(iter(demo.values())) if demo else {}
    out = {}
    for label, meas in split.items():
        arm = demo_arms.get(label)
        # An auto arm's size depends on the pair's acceptance: the random 8B pair's sizes say
        # nothing about what it would keep with the demo pair's, so it is not projected.
        if not arm or arm.get("tau") is None or label.endswith("-auto"):
            continue
        size = min(t, key=lambda n: abs(n - meas["tree_size"]))
        cost = t[size] + arm["delta"] * meas["draft_ms_per_forward"] + meas["policy_ms"] + meas["verify_ms"]
        out[label] = {"tau_demo": arm["tau"], "delta_demo": arm["delta"], "T1_ms": t[1],
                      f"T{size}_ms": t[size], "projected_speedup": arm["tau"] * t[1] / cost,
                      "label": "projection: demo-pair tau x measured 8B-shaped latencies"}
    return out


def engine_paths(target_model: Any, draft_model: Any, plan: Plan, split: dict) -> dict:
    """Talon step time (ms) on the big target: the reference path, measured here, against the
    fast path measured by :func:`step_split`."""
    res = warm_run(target_model, draft_model, POLICIES["talon"], plan, fast=False)
    fast = split["talon"]
    return {"reference": {"step_ms": 1e3 * sum(s.total_time for s in res.steps) / len(res.steps),
                          "tokens_per_s": len(res.tokens) / res.wall_time},
            "fast": {"step_ms": fast["step_ms"], "tokens_per_s": fast["tokens_per_s"]}}


def compile_check(plan: Plan) -> dict:
    """Eager vs ``torch.compile`` target (talon, fast path): compile time and ms per token.

    Full mode uses the demo pair (a launch-bound 2M target, where compilation could pay);
    smoke mode a tiny random Llama.
    """
    if plan.device.type == "cuda":
        from specframe.models.target import load_causal_lm

        target_model = load_causal_lm("demo-target", dtype="float32", device="cuda")
        draft_model = load_causal_lm("demo-draft", dtype="float32", device="cuda")
    else:
        target_model, draft_model = llama(plan.shape, None, plan, seed=2), llama(plan.shape, 1, plan, seed=3)
    vocab = target_model.config.vocab_size
    prompt = torch.randint(0, vocab, (32,), generator=torch.Generator().manual_seed(1))
    tokens = plan.step_tokens
    out: dict[str, Any] = {}
    for label, compiled in (("eager", False), ("compiled", True)):
        dec = specframe.SpecDecoder.build(target=TargetModel(target_model, preallocate=True),
                                          drafter=("model", {"model": draft_model}), policy="talon",
                                          strict=False, compile=compiled)
        sync(plan.device)
        start = time.perf_counter()
        dec.generate(prompt, max_new_tokens=tokens, eos_token_id=None)  # warm-up traces every shape
        sync(plan.device)
        warm = time.perf_counter() - start
        res = dec.generate(prompt, max_new_tokens=tokens, eos_token_id=None)
        out[label] = {"warmup_s": warm, "ms_per_token": 1e3 * res.wall_time / len(res.tokens),
                      "target_ms_per_step": 1e3 * sum(s.target_time for s in res.steps) / len(res.steps),
                      "tokens": res.tokens}
    out["same_tokens"] = out["eager"].pop("tokens") == out["compiled"].pop("tokens")
    out["compiled_over_eager"] = out["compiled"]["ms_per_token"] / out["eager"]["ms_per_token"]
    return out


def demo_cost_curve(plan: Plan) -> dict:
    """The quick cost curve of the demo target on this device (what an auto arm uses), as ms
    and T(n)/T(1) per cache length."""
    from specframe.sizing.profile import measure
    from specframe.models.target import load_causal_lm

    target = TargetModel(load_causal_lm("demo-target", dtype="float32", device=plan.device.type))
    curve = measure(target, sizes=tuple(plan.curve_sizes), reps=plan.reps)
    return {"key": curve.key, "sizes": curve.sizes,
            "ms": {str(c): [1e3 * t for t in row] for c, row in zip(curve.cache_lens, curve.seconds)},
            "ratio": {str(c): curve.ratios(c) for c in curve.cache_lens}}


def summary_text(result: dict) -> str:
    """A short human-readable summary of the JSON result."""
    lines = [f"specframe gpu_suite ({result['mode']}) on {result['machine']['device_name']}, "
             f"torch {result['machine']['torch']}, transformers {result['machine']['transformers']}",
             f"total wall time {result['wall_s']:.0f} s", "", "1. verification latency T(n), ms"]
    for prefix, row in result["latency_ms"].items():
        lines.append(f"  prefix {prefix:>5}: " + "  ".join(f"n={n}:{ms:.2f}" for n, ms in row.items()))
    lines += ["", "2. per-step split, ms (target / draft / policy / verify / other; tree size; draft fwd)"]
    for label, s in result["step_split_ms"].items():
        lines.append(f"  {label:<10} {s['target_ms']:.2f} / {s['draft_ms']:.2f} / {s['policy_ms']:.2f} / "
                     f"{s['verify_ms']:.2f} / {s['other_ms']:.2f}; n={s['tree_size']:.1f}; "
                     f"delta={s['draft_forwards']:.1f}")
    lines += ["", "3. demo pair end to end (tau, delta, speedup vs autoregressive, greedy mismatches)"]
    for dtype, arms in result["demo"].items():
        lines.append(f"  {dtype}:")
        for name, m in arms.items():
            fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
            lines.append(f"    {name:<16} tau {fmt(m['tau'])}  delta {fmt(m['delta'])}  "
                         f"speedup {fmt(m['speedup'])}  tree {fmt(m.get('mean_tree_size'))}  "
                         f"mismatches {m.get('mismatches')}")
    lines += ["", "4. PROJECTED 8B speedup (demo-pair tau x measured 8B latencies; not a measurement)"]
    for label, p in result["projection"].items():
        lines.append(f"  {label:<6} {p['projected_speedup']:.2f}x (tau {p['tau_demo']:.2f}, delta {p['delta_demo']:.2f})")
    paths = result.get("engine_paths", {})
    if paths:
        lines += ["", "5. engine paths (talon, 8B shape): step ms reference -> fast: "
                  f"{paths['reference']['step_ms']:.2f} -> {paths['fast']['step_ms']:.2f}"]
    curve = result.get("demo_cost_curve")
    if curve:
        lines += ["", f"6. demo target cost curve T(n)/T(1) ({curve['key']}); auto arms' tree sizes are in 2 and 3"]
        for cache_len, ratios in curve["ratio"].items():
            lines.append(f"  cache {cache_len:>4}: " + "  ".join(f"n={n}:{r:.2f}" for n, r in zip(curve["sizes"], ratios)))
    comp = result.get("compile", {})
    if "error" in comp:
        lines.append(f"   torch.compile: failed ({comp['error']})")
    elif comp:
        lines.append(f"   torch.compile target: {comp['eager']['ms_per_token']:.2f} -> "
                     f"{comp['compiled']['ms_per_token']:.2f} ms/token (x{comp['compiled_over_eager']:.2f}), "
                     f"warm-up {comp['compiled']['warmup_s']:.0f} s, same tokens: {comp['same_tokens']}")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description="specframe GPU benchmark suite")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU, seconds")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--skip-demo", action="store_true", help="skip section 3 (and 4)")
    parser.add_argument("--skip-compile", action="store_true", help="skip the torch.compile check of section 5")
    args = parser.parse_args()
    plan = plan_for(args.smoke)
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    import transformers

    result: dict[str, Any] = {"mode": "smoke" if args.smoke else "full", "machine": {
        "device_name": torch.cuda.get_device_name(0) if plan.device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version()}}
    target_model = llama(plan.shape, None, plan, seed=0)
    target = TargetModel(target_model)
    result["latency_ms"] = latency_curve(target, plan)
    print("1. latency curve done", flush=True)
    draft_model = llama(plan.shape, 1, plan, seed=1)
    result["step_split_ms"] = step_split(target_model, draft_model, plan)
    print("2. step split done", flush=True)
    result["engine_paths"] = engine_paths(target_model, draft_model, plan, result["step_split_ms"])
    print("5a. engine paths done", flush=True)
    del target_model, draft_model, target
    if plan.device.type == "cuda":
        torch.cuda.empty_cache()
    with tempfile.TemporaryDirectory() as tmp:
        result["demo"] = {} if args.skip_demo else demo_end_to_end(plan, Path(tmp))
    print("3. demo pair done", flush=True)
    result["demo_cost_curve"] = demo_cost_curve(plan)
    print("6. demo cost curve done", flush=True)
    result["projection"] = projection(result["latency_ms"], result["step_split_ms"], result["demo"])
    try:  # compilation is the least predictable part: a failure must not lose the rest
        result["compile"] = {} if args.skip_compile else compile_check(plan)
    except Exception as err:  # noqa: BLE001 - recorded in the result, not hidden
        result["compile"] = {"error": f"{type(err).__name__}: {err}"[:500]}
    print("5b. compile check done", flush=True)
    result["wall_s"] = time.perf_counter() - start
    stem = "gpu_suite_smoke" if args.smoke else "gpu_suite"
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=2))
    text = summary_text(result)
    (args.out / f"{stem}.txt").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
