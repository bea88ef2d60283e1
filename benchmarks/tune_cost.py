"""What a tune costs, and what it finds against a grid of the same number of evaluations.

For one arm of an experiment and its trace: runs ``specframe tune`` with ``--trials N`` (TPE,
pruning) into ``OUT/tune`` and prints its trials per minute (wall time of the study, the model
load excluded); then evaluates a grid of at most N points over the same declared space (every
dimension at evenly spaced levels, as many levels as N allows, held at the arm's own value
where the grid has no room) on the same searched questions, and prints both bests on the
searched and the confirmation questions.

    python benchmarks/tune_cost.py examples/smollm2-suffix.toml --trace runs/suffix-trace \\
        --arm suffix+chain-auto --trials 40 --objective tau --out runs/tune-cost
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import time
from pathlib import Path

from specframe.experiments.config import load_config
from specframe.search_space import Dimension
from specframe.tuning.evaluate import Evaluator
from specframe.tuning.space import arm_space, tuned_arm
from specframe.tuning.study import TuneSettings
from specframe.tuning.tune import run_tune


def levels(dim: Dimension, k: int) -> list:
    """``k`` evenly spaced values of a dimension (log-spaced for a log range; its choices, at
    most ``k``)."""
    if dim.kind == "choice":
        return list(dim.choices[:k])
    if k == 1:
        return [dim.low]
    if dim.log:
        values = [math.exp(math.log(dim.low) + i * (math.log(dim.high) - math.log(dim.low)) / (k - 1)) for i in range(k)]
    else:
        values = [dim.low + i * (dim.high - dim.low) / (k - 1) for i in range(k)]
    if dim.kind == "int":
        return sorted({int(round(v)) for v in values})
    return [float(v) for v in values]


def grid(space: dict[str, Dimension], budget: int) -> list[dict]:
    """At most ``budget`` points: k levels of every unconditioned dimension for the largest k
    that fits (when 2 levels of all do not, 2 levels of the first dimensions, the rest held at
    the arm's values)."""
    dims = [(key, dim) for key, dim in space.items() if not dim.when]
    for k in range(max(2, budget), 1, -1):
        axes = [(key, levels(dim, k)) for key, dim in dims]
        if math.prod(len(values) for _, values in axes) <= budget:
            break
    else:  # even 2 levels of every dimension exceed the budget: vary the first ones only
        axes, size = [], 1
        for key, dim in dims:
            values = levels(dim, 2)
            if size * len(values) > budget:
                break
            axes.append((key, values))
            size *= len(values)
    return [dict(zip([k for k, _ in axes], combo)) for combo in itertools.product(*(v for _, v in axes))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", type=Path)
    parser.add_argument("--trace", type=Path, required=True)
    parser.add_argument("--arm", required=True)
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--objective", choices=["speedup", "tau"], default="speedup")
    parser.add_argument("--split", type=float, default=0.5)
    parser.add_argument("--space", default="all")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    settings = TuneSettings(args.trials, args.objective, args.split, args.space, args.seed)
    start = time.perf_counter()
    (result,) = run_tune(args.config, args.trace, args.out / "tune", settings, [args.arm], fresh=True)
    wall = time.perf_counter() - start
    trials = sum(result.trials.values())
    per_minute = trials / (result.seconds / 60) if result.seconds else float("nan")
    print(f"tune: {trials} trials ({result.trials}) in {result.seconds:.1f} s of trials, {wall:.1f} s in all "
          f"(model load, confirmation and report included): {per_minute:.1f} trials per minute")

    config = load_config(args.config)
    arm = next(a for a in config.arms if a.name == args.arm)
    space = arm_space(arm, args.space)
    points = grid(space, args.trials)
    evaluator = Evaluator(config, [arm], args.trace, None, args.split, args.out / "grid-replay", threads=config.threads)
    start = time.perf_counter()
    scored = []
    for point in points:
        try:
            candidate = tuned_arm(arm, point, name=arm.name)
        except ValueError:
            continue  # a combination the plugins refuse
        scored.append((evaluator.evaluate(candidate, evaluator.searched).value(args.objective), point))
    grid_seconds = time.perf_counter() - start
    best_value, best_point = max(scored, key=lambda s: s[0])
    grid_arm = tuned_arm(arm, best_point, name=f"{arm.name}-grid")
    grid_confirm = evaluator.evaluate(grid_arm, evaluator.confirmation).value(args.objective)
    default_confirm = evaluator.evaluate(arm, evaluator.confirmation).value(args.objective)
    print(f"grid: {len(scored)} points ({len(points)} drawn) in {grid_seconds:.1f} s: "
          f"{len(scored) / (grid_seconds / 60):.1f} evaluations per minute")
    obj = args.objective
    rows = [("default", (result.default["searched"] or {}).get(obj), default_confirm),
            ("tune best", result.best["searched"][obj], result.best["confirmation"][obj]),
            ("grid best", best_value, grid_confirm)]
    print(f"{'':10} {obj + ' searched':>16} {obj + ' confirmation':>20}")
    for label, searched, confirm in rows:
        print(f"{label:10} {searched:16.3f} {confirm:20.3f}")
    print("tune best options:", json.dumps(result.best_options))
    print("grid best options:", json.dumps(best_point))


if __name__ == "__main__":
    main()
