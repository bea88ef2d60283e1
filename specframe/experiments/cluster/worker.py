"""One Ray worker of a sharded run: holds one device, the target and the arms' models, and
answers the units the driver hands it (:mod:`.driver`).

The worker is an :class:`~specframe.experiments.experiment.Experiment` of the same config, so
an answer is computed by exactly the code of a one-process run: the same prompt encoding,
seeds per (question, repeat, turn), interleaved arms and record. It loads and warms up once,
when it starts (a worker Ray restarts loads again); it writes nothing of the run: its
experiment's directory is a scratch one, and every answer goes back to the driver.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass

import torch

from specframe.experiments.cluster import rayrun
from specframe.experiments.config import ExperimentConfig
from specframe.experiments.data import Question
from specframe.experiments.batching import answer_in_batches
from specframe.experiments.experiment import Experiment
from specframe.experiments.loading import no_loading_bars
from specframe.experiments.runners import keeps_state
from specframe.experiments.runs import AnswerRecord, RunFile

#: ``(repeat, question ids as JSON)``: the questions of one unit, every arm on each.
Unit = tuple[int, tuple[str, ...]]


@dataclass
class WorkerInfo:
    """What a worker found when it loaded: per arm whether it decodes greedily, the arms whose
    drafter keeps state across requests, the questions that fit every arm's context and those
    left out (``on_overflow = "skip"``), its process id and its device."""

    greedy: dict[str, bool]
    stateful: list[str]
    kept: list[str]
    overflow: list[dict]
    pid: int
    device: dict


class ShardWorker:
    """The actor's class (the driver wraps it with ``ray.remote``)."""

    def __init__(self, config: ExperimentConfig, arm_names: list[str], questions: list[Question],
                 explored: list[str], number: int) -> None:
        self.config = config
        if config.threads:
            torch.set_num_threads(config.threads)
        self.experiment = Experiment(config, tempfile.mkdtemp(prefix="specframe-worker-"), progress=False)
        self.experiment._explored = set(explored)  # the explorer's questions keep every step's tree
        self.experiment.device_index = rayrun.worker_index(number)
        self.arms = [a for a in config.arms if a.name in arm_names]
        self.questions = list(questions)
        with no_loading_bars():
            self.encoder, self.target, self.runners, self.eos = self.experiment.prepare_arms(self.arms, self.questions)
        stateful = sorted(n for n, r in self.runners.items() if keeps_state(r))
        if self.questions and not stateful:  # a stateful arm is refused by the driver: no warm-up for it
            self.experiment.warm_up(self.arms, self.runners, self.encoder, self.questions[0], self.eos)
        self.info = WorkerInfo({n: bool(r.greedy) for n, r in self.runners.items()}, stateful,
                               [json.dumps(q.question_id) for q in self.questions],
                               RunFile(self.experiment.out_dir).read().get("overflow_skipped", []), os.getpid(),
                               self.experiment.device(self.target))

    def ready(self) -> WorkerInfo:
        """What the worker found when it loaded (:class:`WorkerInfo`)."""
        return self.info

    def answer(self, unit: Unit, wanted: list[tuple[str, str, int]]) -> list[AnswerRecord]:
        """Every wanted answer of ``unit``: ``wanted`` holds ``(arm, question id as JSON,
        repeat)``; the arms of a question run in turn, as in one process."""
        repeat, ids = unit
        by_id = {json.dumps(q.question_id): q for q in self.questions}
        arms = {a.name: a for a in self.arms}
        todo = [(r, by_id[qid], arms[name]) for name, qid, r in wanted]
        if self.config.batch_size > 1:
            sink = _Sink()
            answer_in_batches(self.experiment, todo, [by_id[i] for i in ids], self.runners, self.encoder,
                              self.target, self.eos, sink, lambda arm: None)
            return sink.records
        return [self.experiment._answer(arm, self.runners[arm.name], self.encoder, q, r, self.eos, self.target)
                for r, q, arm in todo]


class _Sink:
    """Stands for the answer store in a worker: keeps the records for the driver."""

    def __init__(self) -> None:
        self.records: list[AnswerRecord] = []

    def append(self, record: AnswerRecord) -> AnswerRecord:
        self.records.append(record)
        return record
