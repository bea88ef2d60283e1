"""The leaderboard's numbers, from answer records only, by Spec-Bench's rules.

- **Speed** (``evaluation/speed.py``): per answer, its new tokens over its wall time, both
  summed over the answer's turns; per task, the mean of the arm's speeds over the mean of the
  baseline's speeds. With several repeats that ratio is taken per repeat and averaged, as
  ``get_mean_speedup`` averages its runs. **Overall** pools every question of the six tasks.
- **Mean accepted tokens** (#MAT): the mean of the answers' ``accept_lengths`` (tokens emitted
  per target forward, the bonus token included), pooled over the task's answers and repeats.
- **Mismatches** (``evaluation/equal.py``): answers whose tokens differ from the baseline's
  answer to the same question and repeat.

Where specframe departs from ``speed.py``: the baseline's tokens are its recorded new tokens,
as the arms' are, not its decoded text tokenized again (which counts what the tokenizer makes of
the text, less one BOS, and can differ from what was generated); and both sides are taken over
the answers both have (a complete run has all of them, so this changes nothing there).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable

import numpy as np

from specframe.experiments.metrics import answer_key, mismatches, tokens_of, wall_of
from specframe.experiments.spec_bench.tasks import TASK_KEYS, task_of

#: The key of the pooled task in summary.json.
OVERALL = "overall"


def speed(record: dict) -> float:
    """Tokens per second of one answer: new tokens over wall time, both summed over its turns."""
    wall = wall_of(record)
    if wall <= 0:
        raise ValueError(f"answer {record.get('answer_id', record.get('question_id'))!r} has no wall time")
    return tokens_of(record) / wall


def _by_repeat(records: Iterable[dict]) -> dict[int, dict[tuple, dict]]:
    out: dict[int, dict[tuple, dict]] = defaultdict(dict)
    for r in records:
        out[int(r.get("repeat", 0))][answer_key(r)] = r
    return out


def speedup(records: list[dict], base: list[dict]) -> dict:
    """``{"speedup", "speedup_repeats", "tokens_per_second", "baseline_tokens_per_second"}``:
    per repeat, the mean speed of ``records`` over the mean speed of ``base`` on the answers
    both have, then the mean over repeats (None where they share no answer)."""
    mine, theirs = _by_repeat(records), _by_repeat(base)
    ratios, fast, slow = [], [], []
    for repeat in sorted(set(mine) & set(theirs)):
        common = sorted(set(mine[repeat]) & set(theirs[repeat]))
        if not common:
            continue
        a = float(np.mean([speed(mine[repeat][k]) for k in common]))
        b = float(np.mean([speed(theirs[repeat][k]) for k in common]))
        ratios.append(a / b)
        fast.append(a)
        slow.append(b)
    if not ratios:
        return {"speedup": None, "speedup_repeats": [], "tokens_per_second": None, "baseline_tokens_per_second": None}
    return {"speedup": float(np.mean(ratios)), "speedup_repeats": ratios,
            "tokens_per_second": float(np.mean(fast)), "baseline_tokens_per_second": float(np.mean(slow))}


def mean_accepted_tokens(records: Iterable[dict]) -> float | None:
    """The mean of every answer's ``accept_lengths``, pooled (None when none is recorded)."""
    lengths = [a for r in records for a in r["choices"][0].get("accept_lengths", [])]
    return float(np.mean(lengths)) if lengths else None


def by_task(records: Iterable[dict]) -> dict[str, list[dict]]:
    """``{task: records}`` for the tasks present, in the leaderboard's order, then ``overall``
    (every answer of a task); an answer of a category that is no task's is left out."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        task = task_of(str(r.get("category", "")))
        if task is not None:
            groups[task].append(r)
    out = {t: groups[t] for t in TASK_KEYS if groups.get(t)}
    out[OVERALL] = [r for t in TASK_KEYS for r in groups.get(t, [])]
    return out


def cell(records: list[dict], base: list[dict]) -> dict:
    """One arm's numbers on one task: speedup, mean accepted tokens, mismatches and counts."""
    equal = mismatches(records, base)
    return {**speedup(records, base), "mean_accepted_tokens": mean_accepted_tokens(records),
            "mismatches": equal["mismatches"], "compared": equal["compared"], "answers": len(records)}


def arm_row(name: str, records: list[dict], base: list[dict], greedy: bool) -> dict:
    """One arm's row of summary.json: overall numbers at the top, each task's under ``tasks``."""
    mine, theirs = by_task(records), by_task(base)
    cells = {task: cell(recs, theirs.get(task, [])) for task, recs in mine.items()}
    overall = cells.pop(OVERALL)
    return {"arm": name, "greedy": greedy, "speedup": overall["speedup"],
            "mean_accepted_tokens": overall["mean_accepted_tokens"], "mismatches": overall["mismatches"],
            "compared": overall["compared"], "answers": overall["answers"],
            "tokens_per_second": overall["tokens_per_second"], "tasks": cells}


def sort_rows(rows: list[dict]) -> list[dict]:
    """Rows by overall speedup, fastest first (rows without one last, in their given order)."""
    return sorted(rows, key=lambda r: (r["speedup"] is None, -(r["speedup"] or 0.0)))


def leaderboard(arms: dict[str, list[dict]], baseline: str, greedy: dict[str, bool],
                keep: set[tuple[str, int]] | None = None) -> dict:
    """The leaderboard of ``arms`` (name -> answer records, in the experiment's order) against
    the arm ``baseline``; ``keep``: the answer keys that count (the experiment's questions and
    repeats), so answers an earlier, larger run left in the directory never enter it."""
    if baseline not in arms:
        raise ValueError(f"the baseline arm {baseline!r} has no answers")
    if keep is not None:
        arms = {name: [r for r in recs if answer_key(r) in keep] for name, recs in arms.items()}
    base = arms[baseline]
    rows = [arm_row(name, recs, base, bool(greedy.get(name, False))) for name, recs in arms.items()]
    tasks = [t for t in TASK_KEYS if any(t in row["tasks"] for row in rows)]
    return {"benchmark": "Spec-Bench", "baseline": baseline, "tasks": tasks, "arms": sort_rows(rows)}
