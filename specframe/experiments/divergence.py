"""Where a greedy arm's answer leaves the autoregressive one, and how close the target was to a tie.

Greedy speculative decoding is token-identical to greedy decoding in exact arithmetic. In float32
a tree forward adds the same numbers in another order than a one-token forward, so when the
target's two best logits are within rounding of each other the argmax can flip. The margin
(best minus second-best logit of the target at the first differing position, computed by a
plain forward over the prompt and the common prefix) tells such a tie apart from a real bug,
which shows up as a divergence at a clear margin.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

from specframe.experiments.metrics import common_prefix


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
