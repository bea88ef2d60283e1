"""Batched speculative decoding: B sequences, one tree each, verified in ONE target forward.

Each live sequence keeps its own drafter and policy (built by factories, the decoder's own
pair serving the first row), so its trees are what it would draft alone. The step is the
engine's own (:meth:`specframe.decode.engine.SpecDecoder._step`) over a batch KV layout: it asks the
batch allocator (:mod:`specframe.decode.allocate`) for every sequence's budget, builds the
trees, lets the allocator trim them to the batch budget, verifies them all in one forward
over the ragged batch cache (:class:`specframe.decode.kv_padded.BatchKV`), reads every verdict in one
transfer, keeps each accepted path and drops sequences that reached EOS or their token limit.
This module adds what only a batch has: rows and their slots, the allocator, batch prices
for auto-sized policies and continuous batching. Design and figure: docs/batching.md.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Sequence

import torch

from specframe.decode.allocate import BatchAllocator, StepAccount, make_allocator
from specframe.decode.kv_flat import check_layout, make_batch_kv
from specframe.decode.kv_padded import BatchKV
from specframe.decode.engine import GenerationOutput, Row, SpecDecoder, _as_prompt, _eos_set, make_plugin
from specframe.interfaces import Drafter, TreePolicy, wants_prompt_logits


@dataclass
class BatchOutput:
    """Result of one batched generation.

    Attributes:
        outputs: one :class:`GenerationOutput` per prompt, in prompt order (``wall_time`` = the
            time from the batch's start to the step that finished that sequence: its latency).
        step_times: wall time of every batch step (prefills excluded).
        wall_time: the whole call.
        joined: per prompt, seconds from the batch's start to the start of its prefill (0 for
            the first rows; later for a prompt that waited for a free row under ``max_live``).
        step_rows: per step, the rows (tokens) its forward computed: the trees' nodes in the
            flat layout, live rows x the longest tree in the padded one.

    With ``generate(arrivals=...)`` every time is on the open-loop clock: wall time, less the
    idle gaps skipped while no sequence was live and the next had not arrived.
    """

    outputs: list[GenerationOutput]
    step_times: list[float] = field(default_factory=list)
    wall_time: float = 0.0
    joined: list[float] = field(default_factory=list)
    step_rows: list[int] = field(default_factory=list)
    #: Per prompt: seconds from the start to the end of the step that emitted its first token.
    first_token: list[float] = field(default_factory=list)
    #: Per step: seconds from the start to its end, and the live sequences it decoded.
    step_at: list[float] = field(default_factory=list)
    step_live: list[int] = field(default_factory=list)
    #: Per step: the tokens it emitted over all its rows, its target forward's seconds, its rows'
    #: drafting and building seconds together, and the allocator's prediction of it (None: the
    #: allocator predicts nothing): the model's view beside the measured one (docs/load.md).
    step_tokens: list[int] = field(default_factory=list)
    step_forward: list[float] = field(default_factory=list)
    step_build: list[float] = field(default_factory=list)
    step_predicted: list[Any] = field(default_factory=list)

    @property
    def latencies(self) -> list[float]:
        """Per prompt: seconds from its prefill's start to its last token (its time in the batch)."""
        return [o.wall_time - j for o, j in zip(self.outputs, self.joined)]

    @property
    def total_tokens(self) -> int:
        """Tokens emitted over all sequences."""
        return sum(len(o.tokens) for o in self.outputs)

    @property
    def throughput(self) -> float:
        """Total tokens per second of wall time."""
        return self.total_tokens / self.wall_time if self.wall_time > 0 else 0.0


def _options_dict(options: Any) -> dict[str, Any]:
    """A plugin's options as the dict that rebuilds them (values shared, not deep-copied: a
    drafter's model instance must not be copied)."""
    return {f.name: getattr(options, f.name) for f in fields(options)} if options is not None else {}


def rebuild_drafter(decoder: SpecDecoder) -> Drafter:
    """A fresh drafter like the decoder's, from its registered name and its
    :meth:`~specframe.Drafter.shared_options` (own state, shared weights)."""
    drafter = decoder.drafter
    return make_plugin("drafters", (drafter.name, _options_dict(drafter.shared_options())), decoder.target)


def rebuild_policy(decoder: SpecDecoder) -> TreePolicy:
    """A fresh policy like the decoder's (own adaptive state), attached to the target."""
    policy = make_plugin("policies", (decoder.policy.name, _options_dict(decoder.policy.options)))
    policy.attach(decoder.target)
    return policy


class BatchDecoder:
    """Batched generation over a :class:`SpecDecoder`'s target, policy, drafter and verifier.

    ``allocator``: a registered allocator name, ``(name, {options})`` or instance (``equal``
    without a ``budget`` = every sequence builds as it would alone). ``drafter_factory`` /
    ``policy_factory``: build row 2, 3, ...'s own drafter / policy from the decoder (default:
    from the registered name and the drafter's shared options, so a draft model loads once).
    ``layout``: the batch cache, ``"padded"`` (``[B, n_max]``: :class:`specframe.decode.kv_padded.BatchKV`)
    or ``"flat"`` (every tree's real nodes in one row: :class:`specframe.decode.kv_flat.FlatKV`;
    docs/batching.md says when it pays). ``batch_drafts``: build the rows' trees in lockstep so
    that a drafter with ``expand_batch`` drafts a layer of every row in one forward (False: one
    row after another, each drafting alone). ``kv_factory(target, layout, reserve=...)``: builds
    each call's KV layout (default :func:`specframe.decode.kv_flat.make_batch_kv`; a replay passes
    one that answers from its trace).
    Rows are reused across calls (each generation calls ``begin`` / ``reset``).
    """

    def __init__(
        self, decoder: SpecDecoder, allocator: Any = "equal",
        drafter_factory: Callable[[SpecDecoder], Drafter] = rebuild_drafter,
        policy_factory: Callable[[SpecDecoder], TreePolicy] = rebuild_policy, layout: str = "padded",
        batch_drafts: bool = True, kv_factory: Callable[..., Any] = make_batch_kv,
    ) -> None:
        self.decoder = decoder
        self.layout = check_layout(layout)
        self.batch_drafts = batch_drafts
        self.kv_factory = kv_factory
        self.allocator: BatchAllocator = make_allocator(allocator)
        self._drafter_factory = drafter_factory
        self._policy_factory = policy_factory
        self._drafters: list[Drafter] = [decoder.drafter]
        self._policies: list[TreePolicy] = [decoder.policy]
        self._curves: dict[int, Any] = {}  # batch size -> BatchCurves (measured or cached once)

    def prepare(self, rows: int) -> None:
        """Build the drafters and policies of ``rows`` rows now (loading a draft model or head),
        so that a timed generation does not pay for it."""
        self._slot(rows - 1)

    def forget_rows(self) -> None:
        """Drop every row's drafter and policy: the next generation builds fresh ones, so a
        drafter that keeps state across requests starts with none (call :meth:`prepare` to build
        them before a timed generation)."""
        self._drafters.clear()
        self._policies.clear()

    def _slot(self, b: int) -> tuple[Drafter, TreePolicy]:
        while len(self._drafters) <= b:
            self._drafters.append(self._drafter_factory(self.decoder))
            self._policies.append(self._policy_factory(self.decoder))
        return self._drafters[b], self._policies[b]

    # ------------------------------------------------------------------ generation
    def generate(self, prompts: Sequence[Any], max_new_tokens: int = 128,
                 eos_token_id: int | Sequence[int] | None = -1,
                 generator: torch.Generator | None = None, seeds: Sequence[Any] | None = None,
                 max_live: int | None = None, score: bool = False,
                 arrivals: Sequence[float] | None = None) -> BatchOutput:
        """Decode every prompt (token ids, lengths may differ) up to ``max_new_tokens`` tokens.

        ``eos_token_id``: as in :meth:`SpecDecoder.generate`. ``seeds``: one per prompt (an int
        or a ``torch.Generator``); row b then drafts and verifies with its own generator, so a sampled
        sequence depends only on its prompt and seed, not on its companions. ``generator``
        (instead): one stream shared by all rows; neither: the plugins' own generators.
        ``max_live``: at most this many sequences decode at once; when one finishes, the next
        prompt in order is prefilled and joins the batch (continuous batching), so the batch
        stays full instead of waiting for its slowest sequence. None: all prompts at once.
        ``score``: each output's ``nll`` as :meth:`SpecDecoder.generate` gives it.
        ``arrivals``: open-loop serving (docs/load.md): prompt b may join only once ``arrivals[b]``
        seconds (non-decreasing) have passed since the start; while no sequence is live the clock
        skips to the next arrival instead of sleeping, so every reported time is wall time less
        the idle gaps. None: every prompt is there at the start.
        """
        dec = self.decoder
        if not prompts:
            raise ValueError("prompts is empty: pass at least one prompt")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if max_live is not None and max_live < 1:
            raise ValueError(f"max_live must be >= 1 (or None: every prompt at once), got {max_live}")
        ids = [_as_prompt(p) for p in prompts]
        for b, prompt in enumerate(ids):
            need = len(prompt) + max_new_tokens
            if need > dec.max_positions:
                raise ValueError(f"prompt {b} ({len(prompt)} tokens) + max_new_tokens ({max_new_tokens}) "
                                 f"= {need} exceeds the {dec.max_positions} positions of the target and draft model")
        eos = _eos_set(dec.target.eos_token_id if eos_token_id == -1 else eos_token_id)
        generators = self._generators(len(ids), generator, seeds)
        due = self._arrivals(arrivals, len(ids))
        width = len(ids) if max_live is None else min(max_live, len(ids))
        curves = self._batch_curves(width)
        start = time.perf_counter()
        result = BatchOutput(outputs=[GenerationOutput(tokens=[]) for _ in ids], joined=[0.0] * len(ids),
                             first_token=[0.0] * len(ids))
        call = _Call(ids, generators, result, score)
        rows: list[Row] = []
        waiting = list(range(len(ids)))
        priced = 0
        kv: Any = None
        try:
            while rows or waiting:
                if not rows and (kv is None or due[waiting[0]] > time.perf_counter() - start):
                    # The start, or idle: skip the clock to the next arrival, start a fresh batch.
                    at = time.perf_counter() - start
                    if not result.step_times or due[waiting[0]] > at:
                        at = due[waiting[0]]
                        start = time.perf_counter() - at
                    kv = self.kv_factory(dec.target, self.layout, reserve=max_new_tokens + 1)
                    joining, waiting = arrived(waiting, due, width, start)
                    rows = self._begin(kv, call, joining, at)
                    priced = 0
                elif not rows:
                    # Every row finished in one step and the next have arrived: they join this
                    # batch, as in a closed-loop run (a replayed batch takes exactly these steps).
                    joining, waiting = arrived(waiting, due, width, start)
                    rows = self._join(kv, rows, joining, call, start)
                    priced = 0
                if curves is not None and len(rows) != priced:
                    priced = self._price([row.policy for row in rows], curves.row_curve(len(rows)))
                fresh = [row.index for row in rows if not row.out.tokens]
                stepping, before = rows, sum(len(row.out.tokens) for row in rows)
                t0 = time.perf_counter()
                live = len(rows)
                rows = dec._step(kv, rows, dec.verifier, max_new_tokens, eos, start, self.allocator, self.batch_drafts)
                t1 = time.perf_counter()
                self._record(result, t1 - t0, t1 - start, live, kv.last_rows, fresh)
                self._record_model(result, stepping, before)
                if rows and waiting and len(rows) < width:
                    joining, waiting = arrived(waiting, due, width - len(rows), start)
                    if joining:
                        rows += self._join(kv, rows, joining, call, start)
                        priced = 0  # the newcomers' policies (reset) are priced at the new shape
        finally:
            if curves is not None:  # back to one-row prices, as generate() alone pays
                self._price(self._policies[:width], curves.row_curve(1))
        result.wall_time = time.perf_counter() - start
        return result

    @staticmethod
    def _arrivals(arrivals: Sequence[float] | None, n: int) -> list[float]:
        """Each prompt's arrival (seconds from the start), checked; all 0 without ``arrivals``."""
        if arrivals is None:
            return [0.0] * n
        due = [float(a) for a in arrivals]
        if len(due) != n:
            raise ValueError(f"arrivals has {len(due)} entries for {n} prompts: pass one arrival time per prompt")
        if any(a < 0 for a in due) or any(b < a for a, b in zip(due, due[1:])):
            raise ValueError("arrivals must be non-negative seconds in non-decreasing order")
        return due

    @staticmethod
    def _record(result: BatchOutput, spent: float, at: float, live: int, computed: int, fresh: list[int]) -> None:
        """One step's records; ``fresh``: the prompts whose first tokens it emitted."""
        result.step_times.append(spent)
        result.step_at.append(at)
        result.step_live.append(live)
        result.step_rows.append(computed)
        for i in fresh:
            result.first_token[i] = at

    def _record_model(self, result: BatchOutput, stepped: Sequence[Row], before: int) -> None:
        """The step's measured tokens, forward and build seconds beside the allocator's
        prediction, and the measurement handed to the allocator; ``stepped``: its rows,
        ``before``: their tokens before it."""
        last = [row.out.steps[-1] for row in stepped]
        tokens = sum(len(row.out.tokens) for row in stepped) - before
        forward = last[0].target_time if last else 0.0
        build = sum(s.draft_time + s.policy_time for s in last)
        result.step_tokens.append(tokens)
        result.step_forward.append(forward)
        result.step_build.append(build)
        result.step_predicted.append(self.allocator.prediction())
        self.allocator.observe_step(StepAccount(tokens, forward, build, result.step_times[-1] - forward - build))

    def _batch_curves(self, rows: int) -> Any:
        """The target's curves up to ``rows`` rows when some row's policy prices a batch
        (:attr:`TreePolicy.wants_batch_curve`; ``budget = "auto"``), else None. Measured (or
        read from the cache) before the clock starts, once per decoder and batch size."""
        wants = self.allocator.wants_batch_curve  # a load-aware allocator prices every batch size
        if not wants and (rows == 1 or not any(self._slot(b)[1].wants_batch_curve for b in range(rows))):
            return None
        if rows not in self._curves:
            from specframe.decode.batch_curves import BatchCurves

            self._curves[rows] = BatchCurves.for_target(self.decoder.target, rows, self.layout)
        if wants:
            self.allocator.price_batch(self._curves[rows], self.layout)
        return self._curves[rows]

    @staticmethod
    def _price(policies: Sequence[TreePolicy], curve: Any) -> int:
        """Give every asking policy ``curve``; returns how many policies there are."""
        for policy in policies:
            if policy.wants_batch_curve:
                policy.price_batch(curve)
        return len(policies)

    @staticmethod
    def _generators(rows: int, generator: torch.Generator | None,
                    seeds: Sequence[Any] | None) -> list[torch.Generator | None]:
        """Each row's generator: its own from ``seeds``, else the shared ``generator`` (or None)."""
        if seeds is None:
            return [generator] * rows
        if generator is not None:
            raise ValueError("pass either seeds or generator to generate(), not both")
        if len(seeds) != rows:
            raise ValueError(f"seeds has {len(seeds)} entries for {rows} prompts: pass one seed per prompt")
        return [s if isinstance(s, torch.Generator) else torch.Generator().manual_seed(int(s)) for s in seeds]

    def _begin(self, kv: BatchKV, call: _Call, joining: list[int], at: float) -> list[Row]:
        """Prefill the prompts ``joining`` together as a new batch (in slots 0, 1, ...), joined at
        ``at`` seconds, and begin their rows' drafters and policies."""
        ids = [call.ids[i] for i in joining]
        rows = self._rows(call, joining, range(len(joining)))
        prefill = kv.prefill([p[:-1] for p in ids], hidden=self.decoder._needs_hidden,
                             logits=any(wants_prompt_logits(r.drafter) for r in rows))
        for i in joining:
            call.result.joined[i] = at
        return self.decoder.begin_rows(prefill, rows, ids)

    def _join(self, kv: BatchKV, rows: list[Row], joining: list[int], call: _Call, start: float) -> list[Row]:
        """Prefill the prompts ``joining`` (indices into ``ids``) as new last rows of the batch,
        in the slots (drafter, policy) the rows that left freed."""
        at = time.perf_counter() - start
        busy = {row.slot for row in rows}
        slots = [b for b in range(len(rows) + len(joining)) if b not in busy][: len(joining)]
        new = self._rows(call, joining, slots)
        prefill = kv.join([call.ids[i][:-1] for i in joining], hidden=self.decoder._needs_hidden,
                          logits=any(wants_prompt_logits(r.drafter) for r in new))
        for i in joining:
            call.result.joined[i] = at
        return self.decoder.begin_rows(prefill, new, [call.ids[i] for i in joining])

    def _rows(self, call: _Call, indices: Sequence[int], slots: Sequence[int]) -> list[Row]:
        """Prompt ``indices[j]``'s row on the drafter and policy of ``slots[j]``."""
        return [Row(i, slot, *self._slot(slot), call.ids[i].tolist(), call.result.outputs[i], call.generators[i],
                    score=call.score) for i, slot in zip(indices, slots)]


@dataclass
class _Call:
    """What one :meth:`BatchDecoder.generate` call gives every row it starts: the prompts, their
    generators, the output being filled and whether answers are scored."""

    ids: list[torch.Tensor]
    generators: list[torch.Generator | None]
    result: BatchOutput
    score: bool


def arrived(waiting: list[int], due: Sequence[float], room: int, start: float) -> tuple[list[int], list[int]]:
    """The first ``room`` of the ``waiting`` prompts (indices into ``due``, their arrival seconds
    after ``start``) that have arrived by now, and those still waiting; open-loop batching's
    admission rule (shared by :class:`BatchDecoder` and the load benchmark's baseline)."""
    now = time.perf_counter() - start
    count = 0
    while count < min(room, len(waiting)) and due[waiting[count]] <= now:
        count += 1
    return waiting[:count], waiting[count:]


def generate_batch(decoder: SpecDecoder, prompts: Sequence[Any], max_new_tokens: int = 128,
                   eos_token_id: int | Sequence[int] | None = -1, allocator: Any = "equal",
                   generator: torch.Generator | None = None, seeds: Sequence[Any] | None = None,
                   max_live: int | None = None, score: bool = False,
                   arrivals: Sequence[float] | None = None) -> BatchOutput:
    """Decode ``prompts`` together with ``decoder``'s plugins (see :class:`BatchDecoder`;
    ``max_live``: continuous batching, at most that many sequences at once; ``score`` and
    ``arrivals`` as :meth:`BatchDecoder.generate` takes them).

    A :class:`BatchDecoder` kept on the decoder per allocator spec reuses its rows' drafters
    and policies across calls (the engine module does not import this one: layer rules).
    """
    cache = decoder.__dict__.setdefault("_batch_decoders", {})
    key = repr(allocator)
    if key not in cache:
        cache[key] = BatchDecoder(decoder, allocator)
    return cache[key].generate(prompts, max_new_tokens, eos_token_id, generator, seeds, max_live, score=score,
                               arrivals=arrivals)
