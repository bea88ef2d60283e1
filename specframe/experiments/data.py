"""Prompts: a JSONL loader (Spec-Bench questions or plain prompts) and prompt encoding.

Accepted lines: Spec-Bench's ``{"question_id", "category", "turns": [...]}`` or a plain
``{"prompt": "..."}`` (question_id defaults to the line number, category to ``default``).
Either may carry a reference ``answer`` (a number or a string) that task accuracy is scored
against (:mod:`specframe.experiments.accuracy`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

DEFAULT_CATEGORY = "default"


class DataError(ValueError):
    """A prompts file is malformed; the message names the file and line."""


@dataclass(frozen=True)
class Question:
    """One prompt: an id, a category, one or more user turns and an optional reference answer."""

    question_id: Any
    category: str
    turns: tuple[str, ...]
    answer: Any = None  # a number or a string; None when the question has no reference


def _parse_line(obj: Any, where: str, line_no: int) -> Question:
    if not isinstance(obj, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    if "turns" in obj:
        turns = obj["turns"]
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
            raise DataError(f"{where}: 'turns' must be a non-empty list of strings")
    elif "prompt" in obj:
        if not isinstance(obj["prompt"], str):
            raise DataError(f"{where}: 'prompt' must be a string")
        turns = [obj["prompt"]]
    else:
        raise DataError(f"{where}: a line needs 'turns' (Spec-Bench format) or 'prompt'; keys found: {sorted(obj)}")
    qid = obj.get("question_id", line_no)
    if not isinstance(qid, (int, str)) or isinstance(qid, bool):
        raise DataError(f"{where}: 'question_id' must be an int or a string, got {qid!r}")
    category = obj.get("category", DEFAULT_CATEGORY)
    if not isinstance(category, str):
        raise DataError(f"{where}: 'category' must be a string, got {category!r}")
    answer = obj.get("answer")
    # bool is an int subclass, but true/false is no reference answer.
    if answer is not None and (not isinstance(answer, (int, float, str)) or isinstance(answer, bool)):
        raise DataError(f"{where}: 'answer' must be a number or a string, got {answer!r}")
    return Question(qid, category, tuple(turns), answer)


def load_questions(
    path: str | Path, category: Sequence[str] | None = None, limit: int | None = None
) -> list[Question]:
    """Questions of ``path`` in file order, filtered by ``category``, at most ``limit``.

    Blank lines are skipped; question ids must be unique (they key the results).
    """
    path = Path(path)
    out: list[Question] = []
    seen: set = set()
    with path.open(encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            where = f"{path}:{line_no}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{where}: invalid JSON: {err}") from err
            q = _parse_line(obj, where, line_no)
            if q.question_id in seen:
                raise DataError(f"{where}: question_id {q.question_id!r} appears twice")
            seen.add(q.question_id)
            if category is None or q.category in category:
                out.append(q)
    return out[:limit] if limit is not None else out


class ByteTokenizer:
    """Toy tokenizer for random models: UTF-8 bytes modulo the vocabulary size.

    Lossy on purpose (it only needs to turn text into valid ids); decoding maps ids < 256 back
    to bytes and replaces what is not valid UTF-8.
    """

    chat_template = None

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = int(vocab_size)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``."""
        return [b % self.vocab_size for b in text.encode("utf-8")]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Best-effort text of ``ids``."""
        return bytes(int(i) % 256 for i in ids).decode("utf-8", errors="replace")


class PromptEncoder:
    """Turns a question's turns (and the arm's earlier answers) into prompt token ids.

    Without a chat template, turn k's prompt is the previous context, the previous answer and
    the new turn's text, concatenated as tokens. With one, the conversation is rendered by
    ``tokenizer.apply_chat_template`` with a generation prompt.
    """

    def __init__(self, tokenizer: Any, chat_template: bool = False) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        if chat_template and not getattr(tokenizer, "chat_template", None):
            raise DataError(
                "[data] chat_template = true, but the tokenizer has no chat template; set chat_template = false"
            )

    def encode(self, turns: Sequence[str], answers: Sequence[list[int]], previous: list[int] | None) -> list[int]:
        """Prompt ids for turn ``len(answers)`` given earlier answers (token ids) and prompt."""
        k = len(answers)
        if self.chat_template:
            messages: list[dict] = []
            for i in range(k + 1):
                messages.append({"role": "user", "content": turns[i]})
                if i < k:
                    messages.append({"role": "assistant", "content": self.decode(answers[i])})
            ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            if isinstance(ids, dict) or hasattr(ids, "keys"):
                ids = ids["input_ids"]
            return [int(i) for i in ids]
        # The first turn gets the tokenizer's special tokens (BOS), as a plain generate() would.
        new = self.tokenizer.encode(turns[k], add_special_tokens=(k == 0))
        if k == 0:
            return [int(i) for i in new]
        return list(previous or []) + list(answers[-1]) + [int(i) for i in new]

    def decode(self, ids: Sequence[int]) -> str:
        """Text of generated ids (special tokens dropped)."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)
