"""Batched speculative decoding: B sequences, one tree each, verified in ONE target forward.

Each live sequence keeps its own drafter and policy (built by factories, the decoder's own
pair serving the first row), so its trees are what it would draft alone. A step asks the
batch allocator (:mod:`specframe.batch_allocate`) for every sequence's budget, builds the
trees, lets the allocator trim them to the batch budget, verifies them all in one forward
over the ragged batch cache (:class:`specframe.batch_kv.BatchKV`), reads every verdict in one
transfer, keeps each accepted path and drops sequences that reached EOS or their token limit.
Design and figure: docs/batching.md.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Sequence

import torch

from .batch_allocate import BatchAllocator, make_allocator
from .batch_draft import build_trees
from .batch_flat import check_layout, make_batch_kv
from .batch_kv import BatchKV
from .contract import EngineError, checked_decision, reject_tree, tree_flag
from .engine import GenerationOutput, SpecDecoder, _as_prompt, _eos_set, make_plugin
from .interfaces import DraftSession, Drafter, StepStats, TreePolicy, logits_keyword, wants_prompt_logits
from .step_read import pack_step, unpack_step


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
    """

    outputs: list[GenerationOutput]
    step_times: list[float] = field(default_factory=list)
    wall_time: float = 0.0
    joined: list[float] = field(default_factory=list)
    step_rows: list[int] = field(default_factory=list)

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


@dataclass
class _Row:
    """One sequence of the batch while it decodes."""

    index: int
    slot: int
    drafter: Drafter
    policy: TreePolicy
    committed: list[int]
    out: GenerationOutput
    generator: torch.Generator | None = None


class BatchDecoder:
    """Batched generation over a :class:`SpecDecoder`'s target, policy, drafter and verifier.

    ``allocator``: a registered allocator name, ``(name, {options})`` or instance (``equal``
    without a ``budget`` = every sequence builds as it would alone). ``drafter_factory`` /
    ``policy_factory``: build row 2, 3, ...'s own drafter / policy from the decoder (default:
    from the registered name and the drafter's shared options, so a draft model loads once).
    ``layout``: the batch cache, ``"padded"`` (``[B, n_max]``: :class:`specframe.batch_kv.BatchKV`)
    or ``"flat"`` (every tree's real nodes in one row: :class:`specframe.batch_flat.FlatKV`;
    docs/batching.md says when it pays). ``batch_drafts``: build the rows' trees in lockstep so
    that a drafter with ``expand_batch`` drafts a layer of every row in one forward (False: one
    row after another, each drafting alone).
    Rows are reused across calls (each generation calls ``begin`` / ``reset``).
    """

    def __init__(
        self, decoder: SpecDecoder, allocator: Any = "equal",
        drafter_factory: Callable[[SpecDecoder], Drafter] = rebuild_drafter,
        policy_factory: Callable[[SpecDecoder], TreePolicy] = rebuild_policy, layout: str = "padded",
        batch_drafts: bool = True,
    ) -> None:
        self.decoder = decoder
        self.layout = check_layout(layout)
        self.batch_drafts = batch_drafts
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
                 max_live: int | None = None) -> BatchOutput:
        """Decode every prompt (token ids, lengths may differ) up to ``max_new_tokens`` tokens.

        ``eos_token_id``: as in :meth:`SpecDecoder.generate`. ``seeds``: one per prompt (an int
        or a ``torch.Generator``); row b then drafts and verifies with its own generator, so a sampled
        sequence depends only on its prompt and seed, not on its companions. ``generator``
        (instead): one stream shared by all rows; neither: the plugins' own generators.
        ``max_live``: at most this many sequences decode at once; when one finishes, the next
        prompt in order is prefilled and joins the batch (continuous batching), so the batch
        stays full instead of waiting for its slowest sequence. None: all prompts at once.
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
        width = len(ids) if max_live is None else min(max_live, len(ids))
        curves = self._batch_curves(width)
        start = time.perf_counter()
        kv = make_batch_kv(dec.target, self.layout, reserve=max_new_tokens + 1)
        result = BatchOutput(outputs=[GenerationOutput(tokens=[]) for _ in ids], joined=[0.0] * len(ids))
        rows = self._begin(kv, ids[:width], generators, result)
        waiting = list(range(width, len(ids)))
        priced = 0
        try:
            while rows:
                if curves is not None and len(rows) != priced:
                    priced = self._price([row.policy for row in rows], curves.row_curve(len(rows)))
                t0 = time.perf_counter()
                rows = self._step(kv, rows, max_new_tokens, eos, start)
                result.step_times.append(time.perf_counter() - t0)
                result.step_rows.append(kv.last_rows)
                if waiting and len(rows) < width:
                    joining, waiting = waiting[: width - len(rows)], waiting[width - len(rows) :]
                    rows += self._join(kv, rows, joining, ids, generators, result, start)
                    priced = 0  # the newcomers' policies (reset) are priced at the new shape
        finally:
            if curves is not None:  # back to one-row prices, as generate() alone pays
                self._price(self._policies[:width], curves.row_curve(1))
        result.wall_time = time.perf_counter() - start
        return result

    def _batch_curves(self, rows: int) -> Any:
        """The target's curves up to ``rows`` rows when some row's policy prices a batch
        (:attr:`TreePolicy.wants_batch_curve`; ``budget = "auto"``), else None. Measured (or
        read from the cache) before the clock starts, once per decoder and batch size."""
        if rows == 1 or not any(self._slot(b)[1].wants_batch_curve for b in range(rows)):
            return None
        if rows not in self._curves:
            from .batch_profile import BatchCurves

            self._curves[rows] = BatchCurves.for_target(self.decoder.target, rows, self.layout)
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

    def _begin(self, kv: BatchKV, ids: list[torch.Tensor], generators: list, result: BatchOutput) -> list[_Row]:
        """Prefill the first prompts together and begin their rows' drafters and policies."""
        first = list(range(len(ids)))  # prompt b in slot b
        prompt_logits = any(wants_prompt_logits(self._slot(b)[0]) for b in first)
        prefill = kv.prefill([p[:-1] for p in ids], hidden=self.decoder._needs_hidden, logits=prompt_logits)
        return self._start_rows(prefill, first, first, ids, generators, result)

    def _join(self, kv: BatchKV, rows: list[_Row], joining: list[int], ids: list[torch.Tensor],
              generators: list, result: BatchOutput, start: float) -> list[_Row]:
        """Prefill the prompts ``joining`` (indices into ``ids``) as new last rows of the batch,
        in the slots (drafter, policy) the rows that left freed."""
        at = time.perf_counter() - start
        busy = {row.slot for row in rows}
        slots = [b for b in range(len(rows) + len(joining)) if b not in busy][: len(joining)]
        prompt_logits = any(wants_prompt_logits(self._slot(b)[0]) for b in slots)
        prefill = kv.join([ids[i][:-1] for i in joining], hidden=self.decoder._needs_hidden, logits=prompt_logits)
        for i in joining:
            result.joined[i] = at
        return self._start_rows(prefill, joining, slots, ids, generators, result)

    def _start_rows(self, prefill: Any, indices: list[int], slots: list[int], ids: list[torch.Tensor],
                    generators: list, result: BatchOutput) -> list[_Row]:
        """Begin the drafter and policy of ``slots[j]`` on prompt ``indices[j]``, whose prefill
        outputs are row ``j`` of ``prefill``."""
        needs_hidden = self.decoder._needs_hidden
        rows = []
        for j, (i, slot) in enumerate(zip(indices, slots)):
            drafter, policy = self._slot(slot)
            prompt = ids[i]
            n = len(prompt) - 1
            hidden = logits = None
            if n > 0 and needs_hidden:
                hidden = tuple(h[j : j + 1, :n] for h in prefill.hidden_states)
            if n > 0 and wants_prompt_logits(drafter):
                logits = prefill.logits[j, :n]
            drafter.begin(prompt, target_hidden=hidden, **logits_keyword(drafter, logits))
            policy.reset()
            rows.append(_Row(i, slot, drafter, policy, prompt.tolist(), result.outputs[i], generators[i]))
        return rows

    def _build(self, rows: list[_Row]) -> tuple[list, list, list[int], list[float]]:
        """Every row's tree under the allocator's budgets, trimmed to the batch budget; and each
        row's policy time (its build less its drafting)."""
        dec = self.decoder
        caps = [min(r.policy.max_budget, dec.max_positions - (len(r.committed) - 1)) for r in rows]
        total = self.allocator.total(caps)
        if total < len(rows):
            raise ValueError(f"allocator {self.allocator.name!r}: batch budget {total} is below the "
                             f"{len(rows)} live sequences (each tree needs its root)")
        limits = self.allocator.budgets(caps, [r.out.steps for r in rows], total)
        if len(limits) != len(rows) or any(not 1 <= lim <= cap for lim, cap in zip(limits, caps)):
            raise EngineError(f"allocator {self.allocator.name!r} returned budgets {limits} outside [1, {caps}]")
        # Rows whose drafters batch build in lockstep, one draft forward per layer for them all
        # (specframe.batch_draft); the others, and a lone row, one after another.
        def new_session(b: int, cls: type[DraftSession]) -> DraftSession:
            row = rows[b]
            return cls(row.drafter, row.committed[-1], dec.target.device, row.generator,
                       context_len=len(row.committed))

        trees, sessions, policy_times = build_trees([r.policy for r in rows], [r.drafter for r in rows],
                                                    new_session, limits, self.batch_drafts)
        trees = self.allocator.trim(trees, total)
        if sum(len(t) for t in trees) > total:
            raise EngineError(f"allocator {self.allocator.name!r} kept {sum(len(t) for t in trees)} nodes, "
                              f"over the batch budget {total}")
        return trees, sessions, limits, policy_times

    def _step(self, kv: BatchKV, rows: list[_Row], max_new: int, eos: set[int], start: float) -> list[_Row]:
        """One batched step; returns the rows still decoding."""
        dec = self.decoder
        trees, sessions, limits, policy_times = self._build(rows)
        flags = [tree_flag(r.policy.name, t, r.committed[-1], lim, dec.strict)
                 for r, t, lim in zip(rows, trees, limits)]
        t1 = time.perf_counter()
        tree_start = kv.width
        out = kv.tree_forward(trees, hidden=dec._needs_hidden)
        logits = kv.rows_of(out.logits)
        hiddens = list(zip(*(kv.rows_of(h) for h in out.hidden_states))) if dec._needs_hidden else None
        t2 = time.perf_counter()
        reads = self._verify_and_read(rows, trees, limits, flags, logits)
        t3 = time.perf_counter()
        paths: list[torch.Tensor | None] = []
        counts: list[int] = []
        for b, (row, tree, read) in enumerate(zip(rows, trees, reads)):
            emitted = self._cut(read.tokens, max_new - len(row.out.tokens), eos)
            finished = len(emitted) < len(read.tokens) or len(row.out.tokens) + len(emitted) >= max_new \
                or any(t in eos for t in emitted)
            paths.append(None if finished else read.path)
            hidden = tuple(h[None] for h in hiddens[b]) if hiddens is not None else None
            row.drafter.commit(torch.tensor(read.tokens, dtype=torch.long), read.path, hidden, tree=tree,
                               **logits_keyword(row.drafter, logits[b]))
            counts.append(len(emitted))
            row.committed += emitted
            row.out.tokens += emitted
            row.out.stopped_at_eos = bool(eos) and emitted[-1] in eos
        kv.keep(paths, tree_start)
        t4 = time.perf_counter()
        live = []
        for row, tree, read, session, limit, count, path, policy_time in zip(
                rows, trees, reads, sessions, limits, counts, paths, policy_times):
            stats = StepStats(
                tree_size=len(tree), depth=len(read.widths) - 1, accepted=len(read.ranks),
                emitted=count, draft_forwards=session.draft_forwards, draft_time=session.draft_time,
                policy_time=policy_time, target_time=t2 - t1, verify_time=t3 - t2,
                other_time=t4 - t3, widths=read.widths, accepted_ranks=read.ranks,
                budget_cut=row.policy.max_budget - limit,
            )
            row.out.steps.append(stats)
            priced = row.policy.wants_batch_curve
            row.policy.observe(self._row_share(stats, len(rows)) if priced else stats)
            if path is None:
                row.drafter.finish(torch.tensor(row.out.tokens, dtype=torch.long))
                row.out.wall_time = time.perf_counter() - start
            else:
                live.append(row)
        return live

    @staticmethod
    def _row_share(stats: StepStats, live: int) -> StepStats:
        """What a batch-priced policy learns from: its own drafting and building, and
        ``1 / live`` of the batch's forward, verification and bookkeeping (the step's cost spread
        over its rows, as its row curve spreads the forward). The recorded step keeps the whole
        batch's times, since the sequence waited for them."""
        if live == 1:
            return stats
        return replace(stats, target_time=stats.target_time / live, verify_time=stats.verify_time / live,
                       other_time=stats.other_time / live)

    def _verify_and_read(self, rows, trees, limits, flags, logits) -> list:
        """Verify every row, then read all verdicts in ONE device-to-host transfer."""
        dec = self.decoder
        records, paths = [], []
        for b, (row, tree, limit, ok) in enumerate(zip(rows, trees, limits, flags)):
            try:
                last, bonus = checked_decision(dec.verifier.name, tree,
                                               dec.verifier.verify(tree, logits[b], row.generator),
                                               dec.target.vocab_size, dec.strict)
            except Exception:
                reject_tree(row.policy.name, tree, row.committed[-1], limit)
                raise
            packed, path = pack_step(tree, last, bonus, ok)
            records.append(packed)
            paths.append(path)
        flat = torch.cat(records).tolist()  # the step's one host read
        reads, at = [], 0
        for row, tree, limit, path in zip(rows, trees, limits, paths):
            size = 2 + 4 * len(tree)
            read = unpack_step(len(tree), flat[at : at + size], path)
            at += size
            if not read.ok:
                reject_tree(row.policy.name, tree, row.committed[-1], limit)
                raise EngineError(f"policy {row.policy.name!r} returned an invalid tree")
            reads.append(read)
        return reads

    @staticmethod
    def _cut(tokens: list[int], remaining: int, eos: set[int]) -> list[int]:
        """The tokens a row emits: at most ``remaining``, ending at its first EOS."""
        emitted = tokens[:remaining]
        for i, tok in enumerate(emitted):
            if tok in eos:
                return emitted[: i + 1]
        return emitted


def generate_batch(decoder: SpecDecoder, prompts: Sequence[Any], max_new_tokens: int = 128,
                   eos_token_id: int | Sequence[int] | None = -1, allocator: Any = "equal",
                   generator: torch.Generator | None = None, seeds: Sequence[Any] | None = None,
                   max_live: int | None = None) -> BatchOutput:
    """Decode ``prompts`` together with ``decoder``'s plugins (see :class:`BatchDecoder`;
    ``max_live``: continuous batching, at most that many sequences at once).

    A :class:`BatchDecoder` kept on the decoder per allocator spec reuses its rows' drafters
    and policies across calls (the engine module does not import this one: layer rules).
    """
    cache = decoder.__dict__.setdefault("_batch_decoders", {})
    key = repr(allocator)
    if key not in cache:
        cache[key] = BatchDecoder(decoder, allocator)
    return cache[key].generate(prompts, max_new_tokens, eos_token_id, generator, seeds, max_live)
