"""Where a greedy arm's answer leaves the autoregressive one, and how close the target was to a tie.

Greedy speculative decoding is token-identical to greedy decoding in exact arithmetic. In float32
a tree forward adds the same numbers in another order than a one-token forward, so when the
target's two best logits are within rounding of each other the argmax can flip. The margin
(best minus second-best logit of the target at the first differing position, computed by a
plain forward over the prompt and the common prefix) tells such a tie apart from a real bug,
which shows up as a divergence at a clear margin.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from specframe.experiments.config import ExperimentConfig
from specframe.experiments.data import PromptEncoder, Question
from specframe.experiments.loading import ModelPool
from specframe.experiments.metrics import common_prefix
from specframe.experiments.runs import RunDir, answer_key, read_answers


@dataclass(frozen=True)
class Divergence:
    """The first position where ``arm`` emitted another token than the autoregressive arm."""

    arm: str
    question_id: Any
    repeat: int
    turn: int
    position: int
    reference_token: int | None  # None: one of the two stopped earlier (EOS)
    arm_token: int | None
    margin: float  # target's best minus second-best logit there (small: a float tie)

    def to_dict(self) -> dict:
        """Plain JSON data."""
        return asdict(self)


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first position where the sequences differ (or one ends), None if equal."""
    return None if list(a) == list(b) else common_prefix(a, b)


def logit_margin(model: Any, context: list[int]) -> float:
    """Best minus second-best next-token logit of ``model`` after ``context`` (plain forward)."""
    device = next(model.parameters()).device
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([context], device=device)).logits[0, -1].double()
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


def find_divergence(model: Any, arm: str, question_id: Any, repeat: int, turn: int, prompt: list[int],
                    reference: list[int], answer: list[int]) -> Divergence | None:
    """The divergence of ``answer`` from ``reference`` (both after ``prompt``), if there is one."""
    pos = first_difference(reference, answer)
    if pos is None:
        return None
    at = lambda seq: seq[pos] if pos < len(seq) else None  # noqa: E731
    return Divergence(arm, question_id, repeat, turn, pos, at(reference), at(answer),
                      logit_margin(model, prompt + reference[:pos]))


def write_divergences(config: ExperimentConfig, out_dir: Path, questions: list[Question], encoder: PromptEncoder) -> None:
    """Record where greedy arms left the autoregressive answers, with the target's logit
    margin there (a float tie or a bug?); the report lists them. Loads the target only when
    there is a divergence."""
    cfg = config
    run_dir = RunDir(out_dir)
    path = run_dir.divergences
    ref_arm = next((a for a in cfg.arms if a.baseline == "autoregressive"), None)
    ref = {} if ref_arm is None else {answer_key(r["question_id"], r["repeat"]): r
                                      for r in read_answers(run_dir.answers(ref_arm.name))}
    differing = []
    for arm in cfg.arms:
        if arm is ref_arm:
            continue
        for record in read_answers(run_dir.answers(arm.name)):
            base = ref.get(answer_key(record["question_id"], record["repeat"]))
            if record.get("greedy") and base is not None and record["output_ids"] != base["output_ids"]:
                differing.append((arm.name, record, base))
    if not differing:
        path.unlink(missing_ok=True)
        return
    model = ModelPool(cfg).target()
    by_id = {json.dumps(q.question_id): q for q in questions}
    found = []
    for arm_name, record, base in differing:
        question, prompt = by_id.get(json.dumps(record["question_id"])), None
        if question is None:
            continue
        for turn, (want, got) in enumerate(zip(base["output_ids"], record["output_ids"])):
            prompt = encoder.encode(question.turns, base["output_ids"][:turn], prompt)
            div = find_divergence(model, arm_name, record["question_id"], record["repeat"], turn, prompt, want, got)
            if div is not None:
                found.append(div.to_dict())
                break
    path.write_text(json.dumps(found, indent=1) + "\n", encoding="utf-8")
