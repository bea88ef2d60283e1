"""Draw a Spec-Bench sample: N questions of each of its six tasks, seeded.

Spec-Bench (Xia et al., 2024; github.com/hemingkx/Spec-Bench, Apache-2.0) holds 480 questions:
MT-bench's 80 (its eight categories form one task) and 80 each of translation, summarization,
qa, math_reasoning and rag. The draw is seeded, so the same file and seed give the same sample.

By default each question keeps its id, gets its task as category and its first turn only, in
task then id order. ``--all-turns`` keeps the question as Spec-Bench's file has it (every turn,
its own category such as ``writing``, its other keys), so MT-bench's questions run their two
turns as Spec-Bench runs them; ``--interleave`` writes the questions round-robin over the tasks
(the leaderboard's order), so an experiment's ``[data] limit = 6 * k`` takes k of every task.
The sample shipped in examples/prompts was drawn so:

    python scripts/spec_bench_sample.py Spec-Bench/data/spec_bench/question.jsonl --per-task 8 \\
        --all-turns --interleave --out examples/prompts/spec-bench-sample.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from specframe.experiments.spec_bench.tasks import TASK_KEYS, task_of


def sample(rows: list[dict], per_task: int, seed: int, all_turns: bool = False, interleave: bool = False) -> list[dict]:
    """``per_task`` questions of every task, each task's in id order (see the module docstring
    for ``all_turns`` and ``interleave``)."""
    by_task: dict[str, list[dict]] = {}
    for row in rows:
        by_task.setdefault(task_of(row["category"]) or row["category"], []).append(row)
    rng = random.Random(seed)
    drawn: dict[str, list[dict]] = {}
    for task in sorted(by_task):  # the draw's order, whatever the output's
        picked = sorted(rng.sample(by_task[task], min(per_task, len(by_task[task]))), key=lambda r: r["question_id"])
        drawn[task] = [dict(row) if all_turns else {"question_id": row["question_id"], "category": task,
                                                     "turns": row["turns"][:1]} for row in picked]
    if not interleave:
        return [row for task in sorted(drawn) for row in drawn[task]]
    order = [t for t in TASK_KEYS if t in drawn] + sorted(t for t in drawn if t not in TASK_KEYS)
    return [drawn[t][i] for i in range(max(map(len, drawn.values()), default=0)) for t in order if i < len(drawn[t])]


def main() -> None:
    """Read the question file, draw, write the sample."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("questions", type=Path, help="Spec-Bench's data/spec_bench/question.jsonl")
    parser.add_argument("--per-task", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--all-turns", action="store_true", help="Keep every turn and the question's own category.")
    parser.add_argument("--interleave", action="store_true", help="Write the tasks round-robin.")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rows = [json.loads(line) for line in args.questions.read_text(encoding="utf-8").splitlines() if line.strip()]
    drawn = sample(rows, args.per_task, args.seed, args.all_turns, args.interleave)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in drawn), encoding="utf-8")
    print(f"{args.out}: {len(drawn)} questions, {len({task_of(r['category']) for r in drawn})} tasks")


if __name__ == "__main__":
    main()
