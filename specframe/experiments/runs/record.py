"""One answer record: a Spec-Bench answer (``evaluation/speed.py`` reads it as is) plus our fields.

The fields are documented in docs/experiments.md ("Outputs"). Records are written through
:class:`AnswerRecord` (:meth:`AnswerRecord.to_dict` is the JSON line) and read back as dicts by
:func:`specframe.experiments.runs.read_answers`; :meth:`AnswerRecord.from_dict` gives the typed view.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Mapping


def answer_key(question_id: Any, repeat: int) -> tuple[str, int]:
    """``(question_id as JSON, repeat)``: what identifies an answer within an arm, and pairs arms."""
    return json.dumps(question_id), int(repeat)


def steps_columns(steps: list) -> dict[str, list]:
    """Per-step statistics (``StepStats`` dataclasses) as columns (compact JSON); times in seconds."""
    if not steps:
        return {}
    cols: dict[str, list] = {}
    for f in dataclasses.fields(steps[0]):
        values = [getattr(s, f.name) for s in steps]
        cols[f.name] = [round(v, 7) for v in values] if isinstance(values[0], float) else values
    return cols


@dataclass
class Choice:
    """Spec-Bench's ``choices[0]``: per turn text, tokens, seconds and target forwards."""

    turns: list[str]
    new_tokens: list[int]
    wall_time: list[float]
    accept_lengths: list[int]  # tokens emitted per target forward (bonus included), all turns
    decoding_steps: list[int]  # target forwards per turn
    index: int = 0

    def to_dict(self) -> dict:
        return {"index": self.index, "turns": self.turns, "new_tokens": self.new_tokens,
                "wall_time": self.wall_time, "accept_lengths": self.accept_lengths,
                "decoding_steps": self.decoding_steps}


@dataclass
class AnswerRecord:
    """One (arm, question, repeat) answer; ``steps``/``trees`` are empty for baselines."""

    question_id: Any
    category: str
    answer_id: str  # <arm slug>/<question_id>/<repeat>
    model_id: str
    arm: str
    repeat: int
    greedy: bool
    tstamp: float
    choice: Choice
    draft_forwards: list[int] = field(default_factory=list)  # per turn
    prompt_tokens: list[int] = field(default_factory=list)  # per turn
    output_ids: list[list[int]] = field(default_factory=list)  # per turn
    steps: dict[str, list] = field(default_factory=dict)  # StepStats as columns
    trees: list[dict] = field(default_factory=list)  # a few drawn trees (every step's in explorer questions)
    token_text: list[list[str]] = field(default_factory=list)  # per turn, each output token's text (explorer questions)
    # per turn, seconds (None where a turn was not measured); a record may lack them (the report shows "-")
    prefill_time: list[float | None] | None = None
    time_to_first_token: list[float | None] | None = None
    extra: dict = field(default_factory=dict)  # keys of other writers, kept as they are

    @property
    def key(self) -> tuple[str, int]:
        """``(question_id as JSON, repeat)``."""
        return answer_key(self.question_id, self.repeat)

    def to_dict(self) -> dict:
        """The JSON line (Spec-Bench's keys first)."""
        return {
            "question_id": self.question_id, "category": self.category, "answer_id": self.answer_id,
            "model_id": self.model_id, "arm": self.arm, "repeat": self.repeat, "greedy": self.greedy,
            "tstamp": self.tstamp, "choices": [self.choice.to_dict()],
            "draft_forwards": self.draft_forwards, "prompt_tokens": self.prompt_tokens,
            "output_ids": self.output_ids, "steps": self.steps, "trees": self.trees,
            **({"token_text": self.token_text} if self.token_text else {}),
            **({"prefill_time": self.prefill_time} if self.prefill_time is not None else {}),
            **({"time_to_first_token": self.time_to_first_token} if self.time_to_first_token is not None else {}),
            **self.extra,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "AnswerRecord":
        """The typed record of a JSON line; Spec-Bench answers of other tools get our defaults."""
        data = dict(data)
        choice = dict((data.pop("choices", None) or [{}])[0])
        names = {f.name for f in dataclasses.fields(Choice)}
        missing = {"turns", "new_tokens", "wall_time", "accept_lengths", "decoding_steps"} - set(choice)
        choice.update({k: [] for k in missing})
        known = {f.name for f in dataclasses.fields(cls)} - {"choice", "extra"}
        fields = {k: data.pop(k) for k in list(data) if k in known}
        fields.setdefault("category", "default")
        fields.setdefault("answer_id", "")
        fields.setdefault("model_id", "")
        fields.setdefault("arm", "")
        fields.setdefault("repeat", 0)
        fields.setdefault("greedy", False)
        fields.setdefault("tstamp", 0.0)
        return cls(choice=Choice(**{k: v for k, v in choice.items() if k in names}), extra=data, **fields)
