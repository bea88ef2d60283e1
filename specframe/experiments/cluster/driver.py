"""A run sharded over Ray workers: ``specframe run CONFIG --ray [ADDRESS] [--workers N]``.

The driver is the one-process run (:class:`~specframe.experiments.experiment.Experiment`) with
its computing step handed to Ray: it holds the directory's lock, checks run.json, finds the
missing answers, and alone writes the answer store, so the rules of a run directory hold as
they are (atomic appends, resume, never stale). What changes is who computes:

- ``N`` actors (:class:`~specframe.experiments.cluster.worker.ShardWorker`), each holding one
  device (one GPU where the cluster has them, else ``threads`` CPUs), load the target and the
  arms' models once and warm up;
- the driver hands out units, one at a time to each free actor: one question (every arm on it,
  interleaved as in one process), or one window of a batched run (``batch_size`` questions, or
  a repeat's questions with ``batch_refill``);
- each unit's answers come back and are appended at once; an actor that dies loses only its
  unit, which goes to another actor (a new one starts when none is left), and an answer already
  written is never written again;
- a node lost mid-run (:mod:`.nodes`) stops it within seconds of the cluster marking it dead,
  in one line naming the node; the answers written are kept, and the same command resumes.

A drafter that keeps state across requests answers each question from what the questions
before it left, in data-file order: such an arm is refused (run it without ``--ray``).
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from specframe.errors import ExperimentError
from specframe.experiments.cluster import rayrun
from specframe.experiments.cluster.pool import ActorPool
from specframe.experiments.config import ExperimentConfig
from specframe.experiments.data import Question
from specframe.experiments.experiment import Experiment
from specframe.experiments.runs import AnswerStore, RunFile, answer_key

def placement(config: ExperimentConfig) -> dict[str, float]:
    """What one worker holds: one GPU (and a CPU) where the target may run on CUDA and the
    cluster has GPUs, else ``threads`` CPUs (1 when unset)."""
    ray = rayrun.ray_module()
    wants_gpu = config.target.device in (None, "auto") or str(config.target.device).startswith("cuda")
    if wants_gpu and ray.cluster_resources().get("GPU", 0) >= 1:
        return {"num_gpus": 1, "num_cpus": 1}
    return {"num_cpus": float(config.threads or 1)}


def units(config: ExperimentConfig, todo: list, questions: list[Question]) -> list[tuple[tuple, list]]:
    """``[((repeat, question ids), wanted)]``: one question per unit, or one window of a batched
    run; ``wanted`` holds the unit's missing ``(arm, question id, repeat)`` in run order."""
    size = 1 if config.batch_size <= 1 else len(questions) if config.batch_refill else config.batch_size
    ids = [json.dumps(q.question_id) for q in questions]
    missing = {(r, json.dumps(q.question_id)) for r, q, _ in todo}
    out = []
    for repeat in sorted({r for r, _, _ in todo}):
        for i in range(0, len(ids), size):
            window = tuple(ids[i:i + size])
            if not any((repeat, qid) in missing for qid in window):
                continue
            wanted = [(a.name, json.dumps(q.question_id), r) for r, q, a in todo
                      if r == repeat and json.dumps(q.question_id) in window]
            out.append(((repeat, window), wanted))
    return out


class ShardedExperiment(Experiment):
    """An :class:`Experiment` whose missing answers are computed by Ray actors (module docstring)."""

    def __init__(self, config: ExperimentConfig, out_dir: Any = None, address: str | None = None,
                 workers: int | None = None, **kwargs: Any) -> None:
        super().__init__(config, out_dir, **kwargs)
        self.address, self.workers = address, workers

    def _compute(self, todo: list, questions: list[Question], store: AnswerStore, skipped: int) -> int:
        ray = rayrun.connect(self.address)
        from specframe.experiments.cluster.worker import ShardWorker

        needs = placement(self.config)
        per_worker = {"GPU": 1.0} if needs.get("num_gpus") else {"CPU": needs["num_cpus"]}
        count = rayrun.worker_count(self.workers, per_worker)
        arms = sorted({a.name for _, _, a in todo})
        actor_class = ray.remote(**needs)(ShardWorker)
        start = lambda number: actor_class.remote(self.config, arms, questions, sorted(self._explored), number)  # noqa: E731
        self._say(f"starting {count} Ray worker(s), each loading the target and {len(arms)} arm(s) ...")
        resume = (f"Every answer written so far is kept in {self.out_dir}: run the same command again to compute "
                  "only the missing ones")
        self.pool = pool = ActorPool(ray, start, count, resume + ".")
        try:
            info = pool.infos("a worker, loading the target and the arms")[0]
            todo = self._after_loading(info, todo, questions)
            if not todo:
                return 0
            with self._progress(total=skipped + len(todo), completed=skipped) as advance:
                return self._hand_out(units(self.config, todo, questions), store, advance)
        finally:
            pool.close()

    def _hand_out(self, work: list, store: AnswerStore, advance: Any) -> int:
        """Each unit to a free worker; its answers appended once each. Returns how many."""
        written: set[tuple] = set()

        def keep(unit: Any, records: list) -> None:
            for record in records:
                key = (record.arm, *answer_key(record.question_id, record.repeat))
                if key in written:  # a unit handed out again after its worker died
                    continue
                written.add(key)
                store.append(record)
                advance(record.arm)
                if self.on_record is not None:
                    self.on_record(record.arm, record)

        self.pool.run(work, lambda actor, item: actor.answer.remote(*item), keep)
        return len(written)

    def _after_loading(self, info: Any, todo: list, questions: list[Question]) -> list:
        """What the one-process run does once the arms are built, with what a worker found:
        refuse stateful arms, record the overflowing questions, the greedy arms and the
        protocol; returns the work on the questions that fit."""
        if info.stateful:
            raise ExperimentError(f"arm {info.stateful[0]!r}: its drafter keeps state across requests (each answer "
                                  "builds on the questions before it in data-file order), so its run cannot be "
                                  "sharded: run it without --ray")
        if info.overflow:
            RunFile(self.out_dir).add_overflow_skipped(info.overflow)
        kept = set(info.kept)
        questions[:] = [q for q in questions if json.dumps(q.question_id) in kept]
        self._record_greedy({n: SimpleNamespace(greedy=g) for n, g in info.greedy.items()})
        return [t for t in todo if json.dumps(t[1].question_id) in kept]


def run_sharded(config: ExperimentConfig, out_dir: Any, address: str | None, workers: int | None = None,
                fresh: bool = False, progress: bool = True, console: Any = None) -> Any:
    """:func:`~specframe.experiments.experiment.run_experiment` with its answers computed by
    ``workers`` Ray actors (``address``: :data:`~specframe.experiments.cluster.rayrun.LOCAL` or
    a cluster's); returns the run's :class:`~specframe.experiments.experiment.RunOutcome`."""
    return ShardedExperiment(config, out_dir, address, workers, progress=progress, console=console, fresh=fresh).run()
