"""How faithfully an engine serves an arm: one statement, and the exported configuration.

Three levels, weakest last: **exact** (the engine does the same thing), **approximated** (it
does something close, and the statement says how), **not expressible** (it cannot, and the
statement says why). An arm is as faithful as its least faithful part (drafter, policy,
verifier), and every part that is not exact contributes its own sentence, so no option is
dropped without a word.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from typing import Any, NamedTuple

EXACT = "exact"
APPROXIMATED = "approximated"
NOT_EXPRESSIBLE = "not expressible"
#: Levels from most to least faithful.
LEVELS = (EXACT, APPROXIMATED, NOT_EXPRESSIBLE)


class Ref(NamedTuple):
    """A plugin name and its options, as an import maps an engine key to them (the experiment
    file checks them against the plugin like any arm's)."""

    name: str
    options: dict


class EngineError(ValueError):
    """An engine configuration specframe cannot import (an unknown key or value); one line,
    naming the key and what is supported."""


@dataclass
class Fidelity:
    """A level and the sentences that justify it (empty for an exact mapping)."""

    level: str = EXACT
    reasons: list[str] = field(default_factory=list)

    def add(self, level: str, reason: str) -> None:
        """Lower the level to ``level`` (never raise it) and record why."""
        if LEVELS.index(level) > LEVELS.index(self.level):
            self.level = level
        if reason not in self.reasons:
            self.reasons.append(reason)

    def merge(self, other: "Fidelity") -> None:
        """Fold another part's statement into this one."""
        for reason in other.reasons:
            self.add(other.level, reason)
        if LEVELS.index(other.level) > LEVELS.index(self.level):
            self.level = other.level

    @property
    def statement(self) -> str:
        """The one plain statement: ``exact``, or the level and its reasons."""
        if not self.reasons:
            return self.level
        return f"{self.level}: " + "; ".join(self.reasons)


@dataclass
class Export:
    """An arm in one engine's vocabulary.

    Attributes:
        engine: ``vllm``, ``sglang``, ``hf`` or ``llamacpp``.
        settings: the configuration as keys and values in the engine's own names (vLLM's
            ``speculative_config`` fields, SGLang's server arguments, transformers'
            ``generate`` keyword arguments, llama.cpp's long flags without dashes).
        fidelity: how faithful it is.
        needs: what the engine needs besides the settings (a checkpoint layout, a sampling
            parameter of each request, a GGUF conversion).
        source: where the engine's names were read (repository, path, commit).
    """

    engine: str
    settings: dict[str, Any]
    fidelity: Fidelity
    needs: list[str] = field(default_factory=list)
    source: str = ""

    def render(self) -> str:
        """The engine's own form: a JSON object (vLLM's ``--speculative-config``, transformers'
        ``generate`` keyword arguments) or command-line flags (SGLang, llama.cpp)."""
        if self.engine in ("vllm", "hf"):
            return json.dumps(self.settings, indent=1)
        return flags(self.settings)

    def report(self) -> str:
        """The fidelity statement, what the engine needs and where its names were read."""
        lines = [f"fidelity: {self.fidelity.statement}"]
        lines += [f"needs: {n}" for n in self.needs]
        if self.source:
            lines.append(f"names read from: {self.source}")
        return "\n".join(lines)


def flags(settings: dict[str, Any]) -> str:
    """``--key value`` for each setting (``key_name`` -> ``--key-name``; True -> a bare flag)."""
    out = []
    for key, value in settings.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is not False and value is not None:
            out.append(f"{flag} {shlex.quote(str(value))}")
    return " ".join(out)


def parse_flags(text: str) -> dict[str, Any]:
    """The inverse of :func:`flags`: ``--key-name value`` -> ``{"key_name": value}`` (a value that
    spells a number is that number; a flag without a value is True)."""
    words = shlex.split(text)
    out: dict[str, Any] = {}
    i = 0
    while i < len(words):
        word = words[i]
        if not word.startswith("--"):
            raise EngineError(f"{word!r} is not a --flag (flags are written as --name value)")
        key = word[2:].replace("-", "_")
        if i + 1 < len(words) and not words[i + 1].startswith("--"):
            out[key] = _number(words[i + 1])
            i += 2
        else:
            out[key] = True
            i += 1
    return out


def _number(text: str) -> Any:
    """``text`` as the int or float it spells, else unchanged (command lines carry text)."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text
