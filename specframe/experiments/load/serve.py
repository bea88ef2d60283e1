"""One cell of the load benchmark: every request of one arm, served open-loop at one rate.

A speculative arm runs :meth:`BatchDecoder.generate` with ``arrivals`` (its allocator, e.g. a
load-aware one, deciding each step's trees); the autoregressive arm runs the same refilling
loop as :func:`~specframe.experiments.batch_baselines.autoregressive_refill` on the same open-loop
clock: wall time while some request is live, the idle gaps skipped.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import torch

from specframe.decode.batch import BatchDecoder, BatchOutput, arrived
from specframe.decode.engine import GenerationOutput
from specframe.decode.kv_flat import make_batch_kv
from specframe.tree import DraftTree


@dataclass
class Served:
    """What a cell measured, every time in seconds on the open-loop clock.

    Attributes:
        arrivals, joined, first_token, finish: per request: when it arrived, when its prefill
            began, when its first token and its last token were emitted.
        tokens: per request, its output tokens.
        step_at, step_live: per step, when it ended and how many sequences it decoded.
        row_steps, speculated: sequence-steps in all, and those that verified a tree of more than
            its root.
        step_times, step_tokens, step_forward, step_build: per step, its seconds, the tokens it
            emitted, its target forward's seconds and its drafting and building seconds.
        step_predicted: per step, the allocator's prediction of it
            (:class:`~specframe.decode.allocate.StepAccount` as a dict) or None.
    """

    arrivals: list[float]
    joined: list[float]
    first_token: list[float]
    finish: list[float]
    tokens: list[list[int]]
    step_at: list[float] = field(default_factory=list)
    step_live: list[int] = field(default_factory=list)
    row_steps: int = 0
    speculated: int = 0
    step_times: list[float] = field(default_factory=list)
    step_tokens: list[int] = field(default_factory=list)
    step_forward: list[float] = field(default_factory=list)
    step_build: list[float] = field(default_factory=list)
    step_predicted: list[dict | None] = field(default_factory=list)


def from_batch(out: BatchOutput, arrivals: Sequence[float]) -> Served:
    """A :class:`BatchOutput` of an open-loop generation as a cell's measurements."""
    steps = [s for o in out.outputs for s in o.steps]
    return Served(list(arrivals), list(out.joined), list(out.first_token), [o.wall_time for o in out.outputs],
                  [list(o.tokens) for o in out.outputs], list(out.step_at), list(out.step_live),
                  row_steps=len(steps), speculated=sum(1 for s in steps if s.tree_size > 1),
                  step_times=list(out.step_times), step_tokens=list(out.step_tokens),
                  step_forward=list(out.step_forward), step_build=list(out.step_build),
                  step_predicted=[None if p is None else asdict(p) for p in out.step_predicted])


def serve_speculative(batcher: BatchDecoder, prompts: Sequence[Sequence[int]], arrivals: Sequence[float],
                      max_live: int, max_new_tokens: int, eos: set[int]) -> Served:
    """``prompts`` served by ``batcher`` (its allocator deciding each step), fresh rows first."""
    batcher.forget_rows()
    batcher.prepare(max_live)
    out = batcher.generate([list(p) for p in prompts], max_new_tokens, sorted(eos) or None, max_live=max_live,
                           arrivals=arrivals)
    return from_batch(out, arrivals)


@torch.inference_mode()
def serve_autoregressive(target: Any, prompts: Sequence[Sequence[int]], arrivals: Sequence[float], max_live: int,
                         max_new_tokens: int, eos: set[int], layout: str = "padded") -> Served:
    """Refilling greedy decoding of ``prompts`` arriving at ``arrivals``: each step one forward of
    every live row's last token and one host read, a finished row replaced by the next arrived
    request (``target``: a ``TargetModel``)."""
    ids = [list(map(int, p)) for p in prompts]
    out = BatchOutput(outputs=[GenerationOutput(tokens=[]) for _ in ids], joined=[0.0] * len(ids),
                      first_token=[0.0] * len(ids))
    waiting, live, last = list(range(len(ids))), [], []
    kv: Any = None
    start = time.perf_counter()
    while live or waiting:
        if not live:  # idle: the clock skips to the next arrival; a fresh batch starts
            at = time.perf_counter() - start
            if not out.step_times or arrivals[waiting[0]] > at:
                at = arrivals[waiting[0]]
                start = time.perf_counter() - at
            kv = make_batch_kv(target, layout, reserve=max_new_tokens + 1)
            live, waiting = arrived(waiting, arrivals, max_live, start)
            kv.prefill([torch.tensor(ids[i][:-1], dtype=torch.long) for i in live])
            for i in live:
                out.joined[i] = at
            last = [ids[i][-1] for i in live]
        t0 = time.perf_counter()
        width = kv.width
        logits = kv.tree_forward([DraftTree.root(t, device=target.device) for t in last]).logits
        nexts = torch.cat(kv.rows_of(logits)).argmax(-1).tolist()  # the step's one host read
        now = time.perf_counter() - start
        paths, still, kept = [], [], []
        for i, tok in zip(live, nexts):
            tokens = out.outputs[i].tokens
            if not tokens:
                out.first_token[i] = now
            tokens.append(tok)
            done = tok in eos or len(tokens) >= max_new_tokens
            paths.append(None if done else torch.zeros(1, dtype=torch.long))
            if done:
                out.outputs[i].wall_time = now
            else:
                still.append(i)
                kept.append(tok)
        kv.keep(paths, width)
        spent = time.perf_counter() - t0
        out.step_times.append(spent)
        out.step_tokens.append(len(nexts))  # one token per row; the forward is the whole step
        out.step_forward.append(spent)
        out.step_build.append(0.0)
        out.step_predicted.append(None)
        out.step_at.append(now)
        out.step_live.append(len(live))
        live, last = still, kept
        if live and waiting and len(live) < max_live:
            joining, waiting = arrived(waiting, arrivals, max_live - len(live), start)
            if joining:
                at = time.perf_counter() - start
                kv.join([torch.tensor(ids[i][:-1], dtype=torch.long) for i in joining])
                for i in joining:
                    out.joined[i] = at
                live += joining
                last += [ids[i][-1] for i in joining]
    out.wall_time = time.perf_counter() - start
    return from_batch(out, arrivals)
