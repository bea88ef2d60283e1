"""``run.json``: what a run directory holds answers of, so a resume never mixes experiments.

The fingerprint (settings shared by every arm: models, lengths, seed, data file, batching, and
for a replayed run the trace's and the cost curve's identity), each arm's definition and a
digest of every question's inputs (its text and its tokenized first prompt) are recorded on the
first run. One rule applies to a later run into the same directory: it may add arms, questions
and repeats, and anything that changed or removed what existing answers were computed from is
refused in one line naming it, with ``--fresh`` (discard them) as the way out. Live and replayed
answers never share a directory (the replay identity is part of the fingerprint). The file
also keeps which arms decode greedily, which prompts ``[data] on_overflow = "skip"`` left out
and blocks other writers add (a replay's ``replay`` block), through every rewrite.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Iterable

from specframe.errors import ExperimentError
from specframe.experiments.runs.layout import RunDir, slugify, write_json

#: How a refusal ends: the two ways out.
WAY_OUT = "use another output directory (--out), or --fresh to discard its answers"


def question_digest(question_id: Any, category: str, turns: list[str], prompt_ids: list[int]) -> str:
    """A digest of what a question's answers are computed from: its text and its prompt ids."""
    text = json.dumps([question_id, category, list(turns), [int(i) for i in prompt_ids]])
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:16]


class RunFile:
    """The run file of a run directory."""

    def __init__(self, out_dir: str | Path) -> None:
        self.out_dir = Path(out_dir)
        self.path = RunDir(out_dir).run_file

    def read(self) -> dict:
        """The file's contents (empty when there is none yet)."""
        return json.loads(self.path.read_text(encoding="utf-8")) if self.path.exists() else {}

    def write(self, meta: dict) -> None:
        """Replace the file atomically."""
        write_json(self.path, meta)

    def check(self, name: str, fingerprint: dict, arms: dict[str, dict], inputs: dict[str, str] | None = None,
              **settings: Any) -> None:
        """Refuse to mix answers of a different experiment; record this one's settings.

        ``fingerprint``: settings that make old answers incomparable when they change;
        ``arms``: name -> plain-data definition; ``inputs``: question id (as JSON) -> digest of
        its inputs (:func:`question_digest`); ``settings``: informative (target, repeats, ...).
        """
        old = self.read()
        arms = dict(arms)
        known_inputs = dict(inputs or {})
        if self.path.exists():
            self._check_fingerprint(old.get("fingerprint", {}), fingerprint)
            self._check_arms(old.get("arms", {}), arms)
            self._check_inputs(old.get("inputs"), known_inputs)
            for arm, desc in old.get("arms", {}).items():
                arms.setdefault(arm, desc)
            known_inputs = {**old.get("inputs", {}), **known_inputs}
        meta = {**old, "name": name, "fingerprint": fingerprint, "arms": arms, "inputs": known_inputs, **settings,
                "greedy": old.get("greedy", {}), "overflow_skipped": old.get("overflow_skipped", [])}
        self.write(meta)

    def _check_fingerprint(self, old: dict, new: dict) -> None:
        """Every key of either fingerprint must agree (a key only one side has differs too)."""
        diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
        if not diff:
            return
        if "replay" in diff:
            raise ExperimentError(f"{self.out_dir} holds {_replay_change(old.get('replay'), new.get('replay'))}: {WAY_OUT}")
        raise ExperimentError(f"{self.out_dir} holds answers of a different experiment (differs in: {', '.join(diff)}); "
                              f"{WAY_OUT}")

    def _check_arms(self, old: dict[str, dict], new: dict[str, dict]) -> None:
        """A changed arm, or a new arm whose file name clashes with an old one's, is refused."""
        for arm, desc in old.items():
            if arm in new and new[arm] != desc:
                files = _changed_files(desc.get("artifacts", {}), new[arm].get("artifacts", {}))
                if files and {k: v for k, v in desc.items() if k != "artifacts"} == \
                        {k: v for k, v in new[arm].items() if k != "artifacts"}:
                    raise ExperimentError(f"arm {arm!r}: the files its option {files} names changed since its answers "
                                          f"in {self.out_dir} were written; {WAY_OUT}")
                raise ExperimentError(f"arm {arm!r} changed since its answers in {self.out_dir} were written; "
                                      f"rename it, or {WAY_OUT}")
        files = {slugify(a).casefold(): a for a in old}
        for arm in new:
            clash = files.get(slugify(arm).casefold())
            if clash is not None and clash != arm:
                raise ExperimentError(f"arm {arm!r} would share the answers file of arm {clash!r} already in "
                                      f"{self.out_dir} (file names ignore case and punctuation); rename it")

    def _check_inputs(self, old: dict[str, str] | None, new: dict[str, str]) -> None:
        """Questions may be added; one edited or removed since its answers were written is refused."""
        if old is None:
            if new and RunDir(self.out_dir).answers_dir.is_dir():
                raise ExperimentError(f"{self.out_dir} holds answers whose inputs were not recorded, so they cannot "
                                      f"be checked against this data: {WAY_OUT}")
            return
        edited = [q for q in old if q in new and new[q] != old[q]]
        removed = [q for q in old if q not in new]
        if edited or removed:
            parts = ([f"edited: questions {_ids(edited)}"] if edited else []) + (
                [f"no longer in the data: questions {_ids(removed)}"] if removed else [])
            raise ExperimentError(f"{self.out_dir} holds answers computed from other inputs ({'; '.join(parts)}): "
                                  f"{WAY_OUT}")

    def record_greedy(self, flags: dict[str, bool]) -> None:
        """Note which arms decode greedily (their answers are compared with autoregressive's)."""
        meta = self.read()
        meta.setdefault("greedy", {}).update(flags)
        self.write(meta)

    def update(self, **blocks: Any) -> None:
        """Set top-level blocks (e.g. ``replay``, ``protocol``), keeping everything else."""
        self.write({**self.read(), **blocks})

    def add_overflow_skipped(self, skipped: list[dict]) -> None:
        """List prompts left out because they do not fit the target's context (each once)."""
        meta = self.read()
        have = {json.dumps(s["question_id"]) for s in meta.get("overflow_skipped", [])}
        meta["overflow_skipped"] = meta.get("overflow_skipped", []) + [
            s for s in skipped if json.dumps(s["question_id"]) not in have]
        self.write(meta)

    def overflow_skipped_ids(self) -> set[str]:
        """Question ids (as JSON) an earlier run of this directory skipped as too long."""
        return {json.dumps(s["question_id"]) for s in self.read().get("overflow_skipped", [])}


def _changed_files(old: dict[str, str], new: dict[str, str]) -> str:
    """The options (``drafter.datastore``) whose files' digests differ, comma-separated."""
    return ", ".join(sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k)))


def _ids(keys: Iterable[str], shown: int = 5) -> str:
    keys = list(keys)
    text = ", ".join(keys[:shown])
    return text + (f" and {len(keys) - shown} more" if len(keys) > shown else "")


def _replay_change(old: dict | None, new: dict | None) -> str:
    """What makes a directory's answers another replay's, or another kind's, in words."""
    if not old:
        return "live answers (measured times); this run replays a trace (projected times)"
    if not new:
        return "replayed answers (projected times); this run is live (measured times)"
    changed = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    return f"answers replayed with another {' and another '.join(changed)} (its identity differs)"
