"""Spec-Bench's six tasks and the question categories that belong to each.

Spec-Bench's question file (``data/spec_bench/question.jsonl``) files its 80 MT-bench questions
under MT-bench's own eight categories (``writing`` ... ``humanities``) and every other question
under its task's name; ``evaluation/speed.py`` groups the eight into the task ``mt_bench``. A
question file here may use either spelling for MT-bench.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable

#: The tasks in the leaderboard's column order: (key in summary.json, column label).
TASKS: tuple[tuple[str, str], ...] = (
    ("mt_bench", "MT-bench"),
    ("translation", "Translation"),
    ("summarization", "Summarization"),
    ("qa", "QA"),
    ("math_reasoning", "Math"),
    ("rag", "RAG"),
)
TASK_KEYS: tuple[str, ...] = tuple(key for key, _ in TASKS)
#: MT-bench's categories as Spec-Bench's question file spells them (``speed.py``'s ``mt_bench_list``).
MT_BENCH_CATEGORIES: tuple[str, ...] = ("writing", "roleplay", "reasoning", "math", "coding", "extraction",
                                        "stem", "humanities")
#: Every category a question of the benchmark may carry.
VALID_CATEGORIES: tuple[str, ...] = TASK_KEYS + MT_BENCH_CATEGORIES


def task_of(category: str) -> str | None:
    """The task a question of ``category`` counts towards; None for a category not Spec-Bench's."""
    if category in MT_BENCH_CATEGORIES:
        return "mt_bench"
    return category if category in TASK_KEYS else None


def unknown_categories(categories: Iterable[str]) -> dict[str, int]:
    """``{category: questions}`` of the categories that belong to no task (empty when all do)."""
    counts = Counter(categories)
    return {c: n for c, n in sorted(counts.items()) if task_of(c) is None}


def categories_error(where: str, unknown: dict[str, int]) -> str:
    """The one-line refusal of a question file with ``unknown`` categories, naming the valid ones."""
    found = ", ".join(f"{c!r} ({n} question{'s' if n > 1 else ''})" for c, n in unknown.items())
    return (f"{where} has categories that are none of Spec-Bench's tasks: {found}; valid categories: "
            f"{', '.join(TASK_KEYS)}, or MT-bench's own {', '.join(MT_BENCH_CATEGORIES)} (counted as mt_bench)")
