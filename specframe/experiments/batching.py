"""Batching windows of a run (``batch_size`` > 1): the questions in chunks, every arm decoding
each chunk in turn, each record's share of the batch's wall time (docs/batching.md).

``run`` is the :class:`~specframe.experiments.experiment.Experiment` answering them: its config,
its prompts and seeds, and its ``on_record`` hook.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from specframe.errors import ExperimentError
from specframe.experiments.baselines import ArmOutput
from specframe.experiments.config import ArmConfig
from specframe.experiments.data import PromptEncoder, Question
from specframe.experiments.loading import sync
from specframe.experiments.records import make_record
from specframe.experiments.runners import fresh_drafter, keeps_state
from specframe.experiments.runs import AnswerStore, answer_key


def answer_in_batches(run: Any, todo: list, questions: list[Question], runners: dict, encoder: PromptEncoder,
                      target: Any, eos: set[int], store: AnswerStore, advance: Callable) -> int:
    """``batch_size`` > 1: the questions in chunks of B, every arm decoding each chunk in turn.

    A record's ``wall_time`` is its share of the batch's wall time by tokens, so the report's
    tokens/s is the batch's throughput; ``extra["batch"]`` keeps the batch size, the
    sequence's latency (batch start to its last token) and the batch's wall time.
    ``batch_refill``: one chunk per repeat (all its questions), decoded with at most B
    sequences live (continuous batching), the latency being a sequence's time from its
    prefill to its last token. Chunks are cut from every question of a repeat in file order,
    so a drafter that keeps state across requests sees the same chunks before each of its
    answers whether or not the run was resumed (it decodes the earlier ones untimed).
    """
    from specframe.experiments.batch_baselines import autoregressive_batch, autoregressive_refill

    cfg = run.config
    work = {(r, answer_key(q.question_id, r), a.name) for r, q, a in todo}
    size = len(questions) if cfg.batch_refill else cfg.batch_size  # refill: one window of them all
    chunks = [(repeat, questions[i : i + size]) for repeat in sorted({r for r, _, _ in todo})
              for i in range(0, len(questions), size)]
    live = cfg.batch_size if cfg.batch_refill else None
    computed = 0
    for n, (repeat, chunk) in enumerate(chunks):
        for arm in cfg.arms:
            qs = [q for q in chunk if (repeat, answer_key(q.question_id, repeat), arm.name) in work]
            runner = runners[arm.name]
            if keeps_state(runner):
                if not _state_needed(chunks[n:], repeat, arm, work):
                    continue
                if n == 0 or chunks[n - 1][0] != repeat:
                    fresh_drafter(runner)  # a repeat starts from a fresh drafter
                qs = list(chunk)  # the whole chunk: later answers of the repeat build on it
            if not qs:
                continue
            prompts = [run.single_turn_prompt(encoder, q, target) for q in qs]
            seeds = [run.seed_generator(repeat, 0, q.question_id) for q in qs]
            if hasattr(runner, "generate_batch"):
                runner.prepare_batch(cfg, prompts, eos)  # before the clock: rows built, warmed up
            sync(target.device)
            start = time.perf_counter()
            projected = None
            if hasattr(runner, "generate_batch"):
                outs, latency, projected = runner.generate_batch(prompts, cfg, eos, seeds, live)
            elif arm.baseline == "autoregressive" and live:
                tokens = autoregressive_refill(target, prompts, cfg.max_new_tokens, eos, live)
                outs = [ArmOutput(t, len(t), 0, [1] * len(t)) for t in tokens]
                latency = None
            elif arm.baseline == "autoregressive":
                tokens = autoregressive_batch(target.model, prompts, cfg.max_new_tokens, eos)
                outs = [ArmOutput(t, len(t), 0, [1] * len(t)) for t in tokens]
                latency = None
            else:
                raise ExperimentError(f"batch_size = {cfg.batch_size}: arm {arm.name!r} does not decode "
                                      "with the engine, so it cannot batch; set batch_size = 1")
            sync(target.device)
            wall = time.perf_counter() - start if projected is None else projected
            total = max(1, sum(len(o.tokens) for o in outs))
            for i, (q, prompt, out) in enumerate(zip(qs, prompts, outs)):
                if (repeat, answer_key(q.question_id, repeat), arm.name) not in work:
                    continue  # decoded for the drafter's state only: answered by an earlier run
                share = wall * len(out.tokens) / total
                model_id = f"{Path(cfg.target.model).name}-{arm.slug}"
                record = make_record(arm, q, repeat, model_id, runner.greedy,
                                     [(prompt, out, share, encoder.decode(out.tokens))], 0)
                record.extra["batch"] = {"size": min(len(qs), cfg.batch_size), **({"refill": True} if live else {}),
                                         "latency": round(latency[i] if latency else wall, 7),
                                         "wall": round(wall, 7)}
                record.extra["device"] = run.device(target)
                store.append(record)
                computed += 1
                advance(arm.name)
                if run.on_record is not None:
                    run.on_record(arm.name, record)
    return computed


def _state_needed(rest: list, repeat: int, arm: ArmConfig, work: set) -> bool:
    """True when ``arm`` has work in this or a later chunk of ``repeat``."""
    return any((repeat, answer_key(q.question_id, repeat), arm.name) in work
               for r, chunk in rest if r == repeat for q in chunk)
