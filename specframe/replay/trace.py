"""A trace directory: the target's greedy continuation of every prompt, what the drafters need
from it, the target's cost curve and the environment it was recorded in.

Layout::

    TRACE_DIR/trace.json          environment, settings, per prompt: ids, continuation, stop
    TRACE_DIR/curve.json          the target's cost curve T(n, L) (specframe.sizing.profile.CostCurve)
    TRACE_DIR/hidden/<k>.safetensors   hidden states of prompt k (only when a drafter needs them)

Hidden states are stored in the target's dtype (no rounding beyond the forward's own), one
tensor per stored layer index ``"layer<i>"`` of shape ``[positions, hidden]`` over prompt +
recorded continuation.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from specframe.sizing.profile import CostCurve

TRACE_FILE = "trace.json"
CURVE_FILE = "curve.json"
HIDDEN_DIR = "hidden"
FORMAT = 2


class TraceError(ValueError):
    """A trace is missing, damaged, or does not match the experiment; the message names why."""


@dataclass
class PromptTrace:
    """One recorded turn: its prompt ids, the target's greedy continuation and where it stops.

    Attributes:
        key: ``json(question_id)/turn`` (what an experiment looks a prompt up by).
        prompt: prompt token ids.
        continuation: greedy tokens after the prompt, recorded past the stop (EOS ignored) by
            ``extra`` tokens so trees that run past the end are verified as live.
        stop: tokens the run emits (EOS and max_new_tokens honoured): ``continuation[:stop]``.
        prefill_seconds: the live prefill's wall time when recorded.
        hidden_file: safetensors file of its hidden states (relative), or None.
        hidden_sha1: that file's content hash (checked when it is read).
        device: the device that recorded it, and so timed ``prefill_seconds`` and the steps
            the trace's overhead is fitted from (``specframe.experiments.device``);
            None in traces recorded before devices were kept.
    """

    key: str
    prompt: list[int]
    continuation: list[int]
    stop: int
    prefill_seconds: float = 0.0
    hidden_file: str | None = None
    hidden_sha1: str | None = None
    device: dict | None = None


@dataclass
class Trace:
    """Everything in ``trace.json`` (plus the curve); see the module docstring."""

    environment: dict
    settings: dict
    prompts: dict[str, PromptTrace]
    overhead: dict = field(default_factory=dict)
    hidden_layers: list[int] = field(default_factory=list)
    path: Path | None = None

    # ------------------------------------------------------------------ files
    def save(self, out: str | Path, curve: CostCurve | None) -> Path:
        """Write ``trace.json`` (and ``curve.json``) under ``out``."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        data = {"format": FORMAT, "environment": self.environment, "settings": self.settings,
                "overhead": self.overhead, "hidden_layers": self.hidden_layers,
                "prompts": [asdict(p) for p in self.prompts.values()]}
        tmp = out / (TRACE_FILE + ".tmp")
        tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        tmp.replace(out / TRACE_FILE)
        if curve is not None:
            (out / CURVE_FILE).write_text(curve.to_json(), encoding="utf-8")
        self.path = out
        return out

    @classmethod
    def load(cls, path: str | Path) -> "Trace":
        """Read a trace directory; a missing or damaged one raises :class:`TraceError`."""
        path = Path(path)
        file = path / TRACE_FILE
        if not file.is_file():
            raise TraceError(f"{path} is not a trace directory (no {TRACE_FILE}); write one with `specframe record`")
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
            prompts = {p["key"]: PromptTrace(**p) for p in data["prompts"]}
        except (ValueError, KeyError, TypeError) as err:
            raise TraceError(f"{file} is damaged: {err}") from err
        if data.get("format") != FORMAT:
            raise TraceError(f"{file} has format {data.get('format')!r}, this specframe reads {FORMAT}: record it again")
        trace = cls(data["environment"], data["settings"], prompts, data.get("overhead", {}),
                    data.get("hidden_layers", []), path)
        trace._digest = hashlib.sha1(file.read_bytes()).hexdigest()[:16]
        for prompt in prompts.values():
            trace.check_hidden_shapes(prompt)
        return trace

    def identity(self) -> dict:
        """The trace's content hash: trace.json's, which holds every hidden file's hash, so a
        re-recorded trace (new times, new states) has another identity."""
        digest = getattr(self, "_digest", None)
        if digest is None and self.path is not None and (self.path / TRACE_FILE).is_file():
            digest = self._digest = hashlib.sha1((self.path / TRACE_FILE).read_bytes()).hexdigest()[:16]
        return {"sha1": digest}

    def curve_text(self) -> str | None:
        """The recorded cost curve's JSON (None when the trace holds none)."""
        file = None if self.path is None else self.path / CURVE_FILE
        if file is None or not file.is_file():
            return None
        return file.read_text(encoding="utf-8")

    def curve(self) -> CostCurve | None:
        """The recorded cost curve (None when the trace holds none)."""
        text = self.curve_text()
        return None if text is None else CostCurve.from_json(text)

    def check_hidden_shapes(self, prompt: PromptTrace) -> None:
        """Refuse a hidden file whose layers are not the recorded ones or whose rows are not one
        per position of prompt + continuation (read from its header; no tensor is loaded)."""
        if prompt.hidden_file is None or self.path is None:
            return
        from safetensors import safe_open

        file = self.path / prompt.hidden_file
        if not file.is_file():
            raise TraceError(f"trace {self.path}: hidden states {prompt.hidden_file} of prompt {prompt.key!r} are "
                             "missing: record the trace again")
        with safe_open(str(file), framework="pt") as fh:
            shapes = {name: fh.get_slice(name).get_shape() for name in fh.keys()}
        want = {f"layer{i}" for i in self.hidden_layers}
        rows = len(prompt.prompt) + len(prompt.continuation)
        bad = [f"{n} {s}" for n, s in shapes.items() if len(s) != 2 or s[0] != rows]
        if set(shapes) != want or bad:
            raise TraceError(f"trace {self.path}: hidden states {prompt.hidden_file} of prompt {prompt.key!r} do not "
                             f"match it (layers {sorted(shapes)}, expected {sorted(want)}; {rows} positions expected"
                             + (f", got {', '.join(bad)}" if bad else "") + "): record the trace again")

    def hidden(self, prompt: PromptTrace, device: torch.device) -> dict[int, torch.Tensor]:
        """``{layer index: [positions, hidden]}`` of ``prompt`` (empty when none were stored);
        a file whose content is not the recorded one is refused."""
        if prompt.hidden_file is None or self.path is None:
            return {}
        from safetensors.torch import load

        data = (self.path / prompt.hidden_file).read_bytes()
        if prompt.hidden_sha1 is not None and hashlib.sha1(data).hexdigest() != prompt.hidden_sha1:
            raise TraceError(f"trace {self.path}: {prompt.hidden_file} is not the file recorded with trace.json "
                             "(its hash differs): record the trace again")
        tensors = load(data)
        return {int(name[len("layer"):]): t.to(device) for name, t in tensors.items()}

    # ------------------------------------------------------------------ matching
    def check_matches(self, settings: dict) -> None:
        """Refuse an experiment whose model, prompts or lengths differ from the recorded ones,
        in one line naming the first difference."""
        for key in ("target_model", "target_dtype", "max_new_tokens", "stop_at_eos", "data", "chat_template"):
            want, got = self.settings.get(key), settings.get(key)
            if want != got:
                raise TraceError(f"trace {self.path} was recorded with {key} = {want!r}, the experiment has {got!r}: "
                                 "record a trace for this experiment (`specframe record`)")

    def prompt_for(self, key: str, prompt: list[int]) -> PromptTrace:
        """The recorded turn ``key``; its prompt ids must equal ``prompt``."""
        found = self.prompts.get(key)
        if found is None:
            raise TraceError(f"trace {self.path} holds no prompt {key!r} (recorded: {len(self.prompts)} prompts): "
                             "the experiment's prompts differ from the trace's")
        if found.prompt != list(prompt):
            first = next((i for i, (a, b) in enumerate(zip(found.prompt, prompt)) if a != b),
                         min(len(found.prompt), len(prompt)))
            raise TraceError(f"prompt {key!r} differs from the trace's at token {first} "
                             f"({len(prompt)} tokens vs {len(found.prompt)} recorded): record the trace again")
        return found


def prompt_key(question_id: Any, turn: int) -> str:
    """The key of one turn of one question in a trace."""
    return f"{json.dumps(question_id)}/{turn}"


def save_hidden(out: Path, index: int, layers: dict[int, torch.Tensor]) -> tuple[str, str]:
    """Write one prompt's hidden states; returns the path relative to the trace directory
    and the file's content hash."""
    rel, data = encode_hidden(index, layers)
    return write_hidden(out, rel, data)


def encode_hidden(index: int, layers: dict[int, torch.Tensor]) -> tuple[str, bytes]:
    """One prompt's hidden states as a safetensors file's bytes, and its path in a trace."""
    from safetensors.torch import save

    return f"{HIDDEN_DIR}/{index}.safetensors", save({f"layer{i}": t.contiguous().cpu() for i, t in layers.items()})


def write_hidden(out: Path, rel: str, data: bytes) -> tuple[str, str]:
    """Write a hidden-states file (``rel`` under ``out``); returns ``rel`` and its content hash."""
    (out / HIDDEN_DIR).mkdir(parents=True, exist_ok=True)
    (out / rel).write_bytes(data)
    return rel, hashlib.sha1(data).hexdigest()
