"""``specframe record CONFIG --ray [ADDRESS] [--workers N]``: the trace recorded by Ray workers.

The workers are placed and counted as ``run --ray``'s (one GPU each where the cluster has them,
else ``threads`` CPUs; :mod:`specframe.experiments.cluster`). Each loads the target once
(:class:`~specframe.replay.record.Recorder`, the one-process recording's own code) and records
whole questions (a later turn's prompt holds the earlier turns' answers), one at a time as it
is free. The driver alone writes the trace, into a temporary directory renamed into place when
complete, as the one-process ``record`` does; a worker that dies loses only its question,
which another records. Each question is kept as it finishes (:mod:`.partial`), so a recording
that stops (a lost Ray node ends it in one line) resumes where it stopped.

What the trace holds is the one-process trace's, entry for entry: prompts, continuations,
stops, hidden-state files (byte for byte on devices of one kind) and their names; the
per-step rest is fitted over the turns in data-file order. Only times and devices differ: each
entry names the device that recorded (and timed) it, every worker measures against the one
curve the trace stores (the first worker's), and the trace says which device measured
``ar_ratio``. A trace projects one device kind (its curve's), so workers of different kinds
are refused in one line.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specframe.errors import ExperimentError
from specframe.experiments.cluster import rayrun
from specframe.experiments.device import device_kind
from specframe.experiments.cluster.driver import placement
from specframe.experiments.cluster.pool import ActorPool
from specframe.experiments.config import ExperimentConfig
from specframe.experiments.data import Question, load_questions
from specframe.replay.partial import PartialRecording
from specframe.replay.record import RecordedTurn, Recorder, assemble_trace, record_atomically
from specframe.replay.trace import Trace, encode_hidden
from specframe.sizing.profile import CostCurve

#: What a recording stopped by a lost Ray node keeps, and how it goes on.
RESUME = "The questions recorded so far are kept: run the same command again to record only the rest."


@dataclass
class RecorderInfo:
    """What a worker found when it loaded: the hidden layers to store, the trace's environment
    block, its curve (JSON; None when none could be had), its device and process id."""

    layers: list[int]
    environment: dict
    curve: str | None
    device: dict
    pid: int


class RecordWorker:
    """One Ray worker of a sharded recording (the driver wraps it with ``ray.remote``);
    ``curve`` is the trace's curve (JSON) when it is already known (a replacement worker)."""

    def __init__(self, config: ExperimentConfig, questions: list[Question], number: int,
                 curve: str | None = None) -> None:
        from specframe.experiments.device import describe_device

        if config.threads:
            torch.set_num_threads(config.threads)
        self.questions = questions
        self.recorder = Recorder(config, questions, rayrun.worker_index(number))
        if curve is not None:
            self.use_curve(curve)
        own = self.recorder.curve
        self.info = RecorderInfo(self.recorder.layers, self.recorder.environment(),
                                 None if own is None else own.to_json(),
                                 describe_device(self.recorder.target.device, self.recorder.device_index), os.getpid())

    def ready(self) -> RecorderInfo:
        """What the worker found when it loaded (:class:`RecorderInfo`)."""
        return self.info

    def use_curve(self, curve: str) -> None:
        """Measure against ``curve`` (the trace's) from now on."""
        self.recorder.curve = CostCurve.from_json(curve)

    def record(self, position: int, index: int) -> list[tuple[RecordedTurn, bytes | None]]:
        """Every turn of the question at ``position`` of the data file, its first turn being
        the trace's prompt ``index``; each with its hidden-states file's bytes (or None)."""
        files: dict[str, bytes] = {}

        def keep(at: int, layers: dict) -> tuple[str, str]:
            rel, data = encode_hidden(at, layers)
            files[rel] = data
            return rel, hashlib.sha1(data).hexdigest()

        turns = self.recorder.record_question(self.questions[position], index, keep)
        return [(t, files.get(t.entry.hidden_file or "")) for t in turns]

    def ar_ratio(self, prompts: list[list[int]]) -> tuple[float, dict]:
        """The autoregressive overhead (:meth:`Recorder.ar_ratio`) and the device that measured it."""
        return self.recorder.ar_ratio(prompts)


def one_kind(devices: list[dict]) -> str | None:
    """The one kind of ``devices``; devices of several kinds raise :class:`ExperimentError`."""
    kinds = sorted({device_kind(d) for d in devices})
    if len(kinds) > 1:
        raise ExperimentError(f"the Ray workers hold devices of {len(kinds)} kinds ({'; '.join(kinds)}): a trace "
                              "has one cost curve, so its projected times would be no device's; record on "
                              "workers of one kind")
    return kinds[0] if kinds else None


def record_sharded(config: ExperimentConfig, out: str | Path, address: str | None, workers: int | None = None,
                   progress: bool = True, console: Any = None, fresh: bool = False) -> Trace:
    """Record ``config``'s trace into ``out`` with ``workers`` Ray workers (``address``:
    :data:`~specframe.experiments.cluster.rayrun.LOCAL` or a cluster's); see the module. The
    questions recorded by an earlier try that stopped are kept (:mod:`.partial`) unless ``fresh``."""
    partial = PartialRecording(Path(out), config)
    partial.discard_others(fresh)
    trace = record_atomically(out, lambda work: _ShardedRecording(config, work, address, workers, partial).record(
        progress, console))
    partial.remove()
    return trace


class _ShardedRecording:
    """One sharded recording into the temporary directory ``work``, its questions kept in ``partial``."""

    def __init__(self, config: ExperimentConfig, work: Path, address: str | None, workers: int | None,
                 partial: PartialRecording) -> None:
        self.config, self.work, self.address, self.workers, self.partial = config, work, address, workers, partial
        self.questions = load_questions(config.data.path, config.data.category, config.data.limit)
        resumed = partial.meta()
        self.curve: str | None = resumed["curve"] if resumed else None
        self.first_device: dict = resumed["device"] if resumed else {}
        self.found = partial.kept() if resumed else {}

    def record(self, progress: bool, console: Any) -> Trace:
        """Start the workers, record every question not kept yet, assemble and save the trace."""
        ray = rayrun.connect(self.address)
        needs = placement(self.config)
        per_worker = {"GPU": 1.0} if needs.get("num_gpus") else {"CPU": needs["num_cpus"]}
        todo = [at for at in range(len(self.questions)) if at not in self.found]
        count = min(rayrun.worker_count(self.workers, per_worker), max(len(todo), 1))
        actor_class = ray.remote(**needs)(RecordWorker)
        if console is not None:
            kept = f" ({len(self.found)} of {len(self.questions)} questions kept from the last try)"
            kept = kept if self.found else ""
            console.print(f"starting {count} Ray worker(s), each loading the target{kept} ...", markup=False)
        self.pool = pool = ActorPool(ray, lambda n: actor_class.remote(self.config, self.questions, n, self.curve),
                                     count, RESUME)
        try:
            infos = pool.infos("a worker, loading the target")
            self._begin(infos)
            self._record(todo, progress, console)
            turns = [t for at in range(len(self.questions)) for t in self.found[at]]
            measured: list = []
            pool.run([[t.entry.prompt for t in turns[:3]]], lambda actor, prompts: actor.ar_ratio.remote(prompts),
                     lambda _, value: measured.append(value))
        finally:
            pool.close()
        environment = dict(infos[0].environment, devices=_distinct([t.entry.device for t in turns]))
        trace = assemble_trace(self.config, environment, infos[0].layers, turns, *measured[0])
        self.partial.hand_over(self.work)
        trace.save(self.work, None if self.curve is None else CostCurve.from_json(self.curve))
        return trace

    def _begin(self, infos: list) -> None:
        """The workers' kinds checked (against the recording resumed, too); a new recording
        takes the first worker's curve, and every worker measures against the trace's one curve."""
        one_kind([i.device for i in infos] + ([self.first_device] if self.first_device else []))
        if not self.first_device:
            self.first_device, self.curve = infos[0].device, infos[0].curve
            self.partial.begin(self.curve, self.first_device)
        elif self.curve is not None:
            return  # a resumed recording's workers were started with its curve
        if self.curve is not None:
            for ref in [a.use_curve.remote(self.curve) for a in self.pool.actors]:
                rayrun.fetch(ref, "a worker, taking the trace's curve", self.pool.watch)

    def _record(self, todo: list[int], progress: bool, console: Any) -> None:
        from specframe.experiments.progress import ProgressBar

        firsts = [sum(len(q.turns) for q in self.questions[:i]) for i in range(len(self.questions))]
        total = sum(len(q.turns) for q in self.questions)
        done = sum(len(turns) for turns in self.found.values())
        with ProgressBar(total, done, enabled=progress, console=console) as advance:
            self.pool.run(todo, lambda actor, at: actor.record.remote(at, firsts[at]),
                          lambda at, turns: self._keep(at, turns, advance))

    def _keep(self, at: int, recorded: list[tuple[RecordedTurn, bytes | None]], advance: Any) -> None:
        """A question's turns: their device's kind checked (a replacement worker may sit on
        another device), then kept (hidden files and turns) before they count."""
        for turn, _ in recorded:
            one_kind([self.first_device, turn.entry.device])
        self.partial.keep(at, recorded)
        self.found[at] = [t for t, _ in recorded]
        for _ in recorded:
            advance(str(self.questions[at].question_id))


def _distinct(devices: list[dict | None]) -> list[dict]:
    """Each device once, in the order first seen."""
    out: list[dict] = []
    for device in devices:
        if device is not None and device not in out:
            out.append(device)
    return out
