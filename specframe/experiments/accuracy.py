"""Task accuracy: the final answer of a generated text, scored against a reference.

The rule follows GSM8K evaluations:

- the final answer is the number after the last ``####`` when one follows it, else the last
  number anywhere in the text;
- a number may carry a leading ``-`` or ``$``, thousands commas and decimals; commas, ``$`` and
  a sentence's trailing ``.`` are dropped, and numbers compare by value (``12.0`` == ``12``,
  ``1,000`` == ``1000``);
- a numeric reference (or a string that reads as a number) is correct when the extracted
  answer has the same value; any other string reference is compared, case-insensitively and
  without surrounding whitespace or a trailing ``.``, with the text after the last ``####`` (or
  the last non-empty line when there is none).

Pure functions only: nothing here reads files or models.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

MARKER = "####"
# A minus sign counts only where no word character precedes it ("3-4" is a range, not -4).
_NUMBER = re.compile(r"(?:(?<!\w)-)?\$?\d[\d,]*(?:\.\d+)?")


def normalize_number(text: str) -> str | None:
    """The canonical text of a number (``"$1,200.50"`` -> ``"1200.5"``), None if it is not one."""
    cleaned = text.strip().replace(",", "").replace("$", "").rstrip(".")
    try:
        value = Decimal(cleaned)
    except InvalidOperation:
        return None
    if not value.is_finite():
        return None
    if value == 0:  # "-0" and "0.00" are 0
        return "0"
    # normalize() drops trailing zeros; "f" keeps 1E+3 as "1000".
    return format(value.normalize(), "f")


def _numbers(text: str) -> list[str]:
    """Every number of ``text``, normalised, in order."""
    found = (normalize_number(m) for m in _NUMBER.findall(text))
    return [n for n in found if n is not None]


def extract_answer(text: str) -> str | None:
    """The final numeric answer of ``text`` (normalised, see the module's rule), or None."""
    if MARKER in text:
        after = _numbers(text.rsplit(MARKER, 1)[1])
        if after:
            return after[0]
    found = _numbers(text)
    return found[-1] if found else None


def _final_text(text: str) -> str:
    """What a non-numeric reference is compared with: after the last marker, else the last line."""
    if MARKER in text:
        tail = text.rsplit(MARKER, 1)[1]
    else:
        lines = [line for line in text.splitlines() if line.strip()]
        tail = lines[-1] if lines else ""
    return tail.strip().rstrip(".").strip().casefold()


def is_correct(generated: str, reference: Any) -> bool:
    """Whether ``generated`` text ends with the ``reference`` answer (a number or a string)."""
    if reference is None or isinstance(reference, bool):
        return False
    ref = str(reference)
    ref_number = normalize_number(ref)
    if ref_number is not None:
        return extract_answer(generated) == ref_number
    return _final_text(generated) == ref.strip().rstrip(".").strip().casefold()


def score(pairs: list[tuple[str, Any]]) -> dict | None:
    """``{"accuracy", "correct", "scored"}`` over ``(generated, reference)`` pairs; None if empty.

    Pairs whose reference is None are not scored (their question has no reference).
    """
    scored = [(g, r) for g, r in pairs if r is not None]
    if not scored:
        return None
    correct = sum(is_correct(g, r) for g, r in scored)
    return {"accuracy": correct / len(scored), "correct": correct, "scored": len(scored)}
