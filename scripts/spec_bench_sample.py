"""Draw a Spec-Bench sample: the first turns of N questions of each of its six tasks.

Spec-Bench (Xia et al., 2024; github.com/hemingkx/Spec-Bench, Apache-2.0) holds 480 questions:
MT-bench's 80 (its eight categories form one task here) and 80 each of translation,
summarization, qa, math_reasoning and rag. The draw is seeded, so the same file and seed give the
same sample; each question keeps its id and gets its task as category, one turn.

    python scripts/spec_bench_sample.py Spec-Bench/data/spec_bench/question.jsonl --per-task 4 \\
        --out runs/spec-bench-sample.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

#: MT-bench's categories, one Spec-Bench task.
MT_BENCH = {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"}


def task_of(category: str) -> str:
    """Spec-Bench's task of a question category."""
    return "mt_bench" if category in MT_BENCH else category


def sample(rows: list[dict], per_task: int, seed: int) -> list[dict]:
    """``per_task`` questions of every task, first turns only, in task then id order."""
    by_task: dict[str, list[dict]] = {}
    for row in rows:
        by_task.setdefault(task_of(row["category"]), []).append(row)
    rng = random.Random(seed)
    out = []
    for task in sorted(by_task):
        for row in sorted(rng.sample(by_task[task], min(per_task, len(by_task[task]))), key=lambda r: r["question_id"]):
            out.append({"question_id": row["question_id"], "category": task, "turns": row["turns"][:1]})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("questions", type=Path, help="Spec-Bench's data/spec_bench/question.jsonl")
    parser.add_argument("--per-task", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rows = [json.loads(line) for line in args.questions.read_text(encoding="utf-8").splitlines() if line.strip()]
    drawn = sample(rows, args.per_task, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in drawn), encoding="utf-8")
    print(f"{args.out}: {len(drawn)} questions, {len({r['category'] for r in drawn})} tasks")


if __name__ == "__main__":
    main()
