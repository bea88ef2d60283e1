"""SpecDecoder: prefill -> [build trees -> verify in one target forward -> commit] loop.

:meth:`SpecDecoder._step` is the one decode step, for one sequence (``generate``, over
:class:`specframe.decode.kv_single.SingleKV`) or many (:class:`specframe.decode.batch.BatchDecoder`, over a
batch layout): the layouts differ, the step does not.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from typing import Any, Callable, Sequence

import torch

from specframe.decode.contract import (STRICT_VARIABLE, EngineError, checked_decision, checked_root_tokens,  # noqa: F401
                                       reject_tree, strict_default, tree_flag)
from specframe.interfaces import DraftSession, Drafter, StepStats, TreePolicy, Verifier, logits_keyword, wants_prompt_logits
from specframe.decode.lockstep import build_trees
from specframe.options import build_options
from specframe.plugins import SINGULAR, get_registry
from specframe.decode.clock import StepClock
from specframe.decode.kv_single import SingleKV
from specframe.decode.output import (SHARED_FIELDS, GenerationOutput, Row, StepView,  # noqa: F401 (re-exported)
                                     cut_output, negative_log_likelihood, row_share)
from specframe.decode.read import (StepRead, pack_step, packed_size, read_host_verdict, sends_lists,
                                   unpack_host_step, unpack_step)
from specframe.decode.side_rows import SideStep
from specframe.models.target import TargetModel
from specframe.tree import DraftTree

PluginSpec = Any  # "name" | ("name", {options}) | instance

def _split_spec(spec: PluginSpec) -> tuple[str, dict]:
    if isinstance(spec, str):
        return spec, {}
    if isinstance(spec, (tuple, list)) and len(spec) == 2 and isinstance(spec[0], str):
        return spec[0], dict(spec[1] or {})
    raise TypeError(f"plugin spec must be a name, (name, options) or an instance, got {spec!r}")


def make_plugin(kind: str, spec: PluginSpec, *extra: Any) -> Any:
    """Instantiate a plugin of ``kind`` from a name, ``(name, options)`` or pass an instance."""
    base = {"policies": TreePolicy, "drafters": Drafter, "verifiers": Verifier}[kind]
    if isinstance(spec, base):
        return spec
    name, values = _split_spec(spec)
    cls = get_registry().get(kind, name)
    options = build_options(cls.Options, values, f"{SINGULAR[kind]} {name!r}")
    return cls(options, *extra)


def _as_prompt(input_ids: Any) -> torch.Tensor:
    ids = torch.as_tensor(input_ids, dtype=torch.long)
    if ids.dim() == 2:
        if ids.shape[0] != 1:
            raise ValueError(f"batch size {ids.shape[0]} is not supported: pass one prompt ([1, L] or [L])")
        ids = ids[0]
    if ids.dim() != 1 or ids.numel() == 0:
        raise ValueError("prompt is empty: pass at least one token id")
    return ids


def _eos_set(eos: int | Sequence[int] | None) -> set[int]:
    if eos is None:
        return set()
    if isinstance(eos, int):
        return {eos}
    return {int(e) for e in eos}


class SpecDecoder:
    """Speculative decoding with draft trees: any drafter x policy x verifier.

    ``strict``: check every tree in full on the host (:meth:`DraftTree.check_valid`) before the
    target forward, and the verifier's decision is in range after it. It names a broken plugin
    at the step that broke it, but reads the device several times per step. Off, the engine
    still refuses every invalid tree with an :class:`EngineError` naming the invariant, from
    the tree it reads with the verdict in its one host read per step. None (default):
    on iff the ``SPECFRAME_STRICT`` environment variable is set (the pytest plugin sets it, so
    tests run strict). The output is the same either way.
    """

    def __init__(
        self, target: TargetModel, drafter: Drafter, policy: TreePolicy, verifier: Verifier,
        strict: bool | None = None,
    ) -> None:
        self.target = target
        self.drafter = drafter
        self.policy = policy
        self.verifier = verifier
        self.strict = strict_default() if strict is None else bool(strict)
        if drafter.vocab_size != target.vocab_size:
            raise ValueError(
                f"drafter {drafter.name!r} has vocabulary size {drafter.vocab_size}, the target has "
                f"{target.vocab_size}: the pair must share one tokenizer"
            )
        policy.attach(target)  # e.g. "auto" sizes read (or measure once) the cost curve

    @classmethod
    def build(
        cls,
        target: Any,
        drafter: PluginSpec = "model",
        policy: PluginSpec = "chain",
        verifier: PluginSpec = "greedy",
        strict: bool | None = None,
        compile: bool = False,
        exact: bool = False,
    ) -> "SpecDecoder":
        """Assemble a decoder from a transformers model (or TargetModel) and plugin specs.

        Each spec is a registered name, a ``(name, options_dict)`` pair or an instance.
        Options are checked before any drafter model loads. ``strict``: see
        :class:`SpecDecoder`. ``compile``: run the target's forward through ``torch.compile``
        (:meth:`TargetModel.compile`; see docs/performance.md for when it pays). KV-cache
        pre-allocation is the target's option: pass ``TargetModel(model, preallocate=...)``.
        ``exact``: run the target's exact forward (:mod:`specframe.models.exact`, in place on the
        model), so greedy output equals greedy decoding bit for bit by construction.
        """
        tgt = target if isinstance(target, TargetModel) else TargetModel(target)
        if exact and not tgt.exact:
            tgt.use_exact()
        if compile and not tgt.compiled:
            tgt.compile()
        pol = make_plugin("policies", policy)
        ver = make_plugin("verifiers", verifier)
        dra = make_plugin("drafters", drafter, tgt)
        return cls(tgt, dra, pol, ver, strict=strict)

    @property
    def _needs_hidden(self) -> bool:
        return bool(getattr(self.drafter, "needs_target_hidden", False))

    # ------------------------------------------------------------------ generation
    def generate(
        self,
        input_ids: Any,
        max_new_tokens: int = 128,
        eos_token_id: int | Sequence[int] | None = -1,
        generator: torch.Generator | None = None,
        temperature: float | None = None,
        seed: int | None = None,
        on_step: Callable[[StepView], None] | None = None,
        score: bool = False,
    ) -> GenerationOutput:
        """Generate up to ``max_new_tokens`` tokens after ``input_ids``.

        ``eos_token_id``: stop after emitting any of these ids; the default (-1) takes the
        target's ``generation_config.eos_token_id``; None disables EOS stopping.
        ``temperature``: None keeps the verifier's own setting; 0 verifies with exact greedy;
        > 0 needs a sampling verifier and overrides its temperature for this call.
        ``seed`` / ``generator``: randomness of this call for the verifier and for policies
        that sample children (the same seed gives the same output); neither = the plugins'
        own generators (their ``seed`` options) or torch's global one.
        ``on_step``: called after every verified step with a :class:`StepView` (the tree, the
        accepted path, the step's statistics); its time counts in the step's wall time, so
        keep it cheap (keep references, read later). None: nothing is built for it.
        ``score``: also give the output's negative log-likelihood under the target
        (``GenerationOutput.nll``), from the verification forwards' logits at the accepted
        nodes: no extra forward, one extra host read per generation (what the quality of a
        lossy verifier's text is measured by; docs/verifiers.md).
        """
        start = time.perf_counter()
        verifier = self._verifier_for(temperature)
        if seed is not None:
            if generator is not None:
                raise ValueError("pass either seed or generator to generate(), not both")
            generator = torch.Generator().manual_seed(int(seed))
        prompt = _as_prompt(input_ids)
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        need = len(prompt) + max_new_tokens
        if need > self.max_positions:
            whose = "target's" if self.max_positions == self.target.max_positions else "draft model's"
            raise ValueError(
                f"prompt ({len(prompt)} tokens) + max_new_tokens ({max_new_tokens}) = {need} exceeds "
                f"the {whose} {self.max_positions} positions"
            )
        eos = _eos_set(self.target.eos_token_id if eos_token_id == -1 else eos_token_id)
        out = GenerationOutput(tokens=[])
        kv = SingleKV(self.target, reserve=max_new_tokens + self.policy.max_budget + getattr(self.drafter, "max_side_rows", 0))
        row = Row(0, 0, self.drafter, self.policy, prompt.tolist(), out, generator, on_step, score)
        before = time.perf_counter()
        prefill = kv.prefill([prompt[:-1]], self._needs_hidden, wants_prompt_logits(self.drafter))
        out.prefill_time = time.perf_counter() - before
        rows = self.begin_rows(prefill, [row], [prompt])
        row.mark = time.perf_counter()
        out.setup_time = row.mark - start - out.prefill_time
        while rows:
            rows = self._step(kv, rows, verifier, max_new_tokens, eos, start, chained=True)
        return out

    def begin_rows(self, prefill: Any, rows: list[Row], prompts: Sequence[torch.Tensor]) -> list[Row]:
        """Begin each row's drafter and policy on its prompt, whose prefill outputs are row
        ``j`` of ``prefill`` (a layout's ``prefill`` or ``join``; None: one-token prompts)."""
        for j, (row, prompt) in enumerate(zip(rows, prompts)):
            n = len(prompt) - 1
            hidden = logits = None
            if n > 0 and self._needs_hidden:
                # A replayed target holds only the layers a drafter reads: the others are None.
                hidden = tuple(h if h is None else h[j : j + 1, :n] for h in prefill.hidden_states)
            if n > 0 and wants_prompt_logits(row.drafter):
                logits = prefill.logits[j, :n]
            row.drafter.begin(prompt, target_hidden=hidden, **logits_keyword(row.drafter, logits))
            row.policy.reset()
        return rows

    def _verifier_for(self, temperature: float | None) -> Verifier:
        """The verifier of one generate call: ``temperature`` 0 = exact greedy, > 0 overrides
        a sampling verifier's temperature (a shallow copy, so it shares its generator)."""
        if temperature is None:
            return self.verifier
        if not math.isfinite(temperature) or temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {temperature}")
        if temperature == 0:
            return make_plugin("verifiers", "greedy")
        name = self.verifier.name
        if not getattr(self.verifier, "sampling", False):
            raise ValueError(
                f"temperature={temperature} needs a sampling verifier, but verifier {name!r} is not "
                f"one (it is lossless for greedy decoding only): build the decoder with "
                f"verifier=('sampling', {{'temperature': {temperature}}}) or pass temperature=0"
            )
        try:
            options = dataclasses.replace(self.verifier.options, temperature=float(temperature))
        except TypeError as err:
            raise ValueError(f"verifier {name!r} has no 'temperature' option to override") from err
        verifier = copy.copy(self.verifier)
        verifier.options = options
        return verifier

    @property
    def max_positions(self) -> int:
        """The context both models hold: the target's positions, or a draft model's when fewer
        (a drafter's ``max_positions``; None means no limit of its own)."""
        own = getattr(self.drafter, "max_positions", None)
        return self.target.max_positions if own is None else min(self.target.max_positions, int(own))

    # ------------------------------------------------------------------ the step
    def _step(self, kv: Any, rows: list[Row], verifier: Verifier, max_new: int, eos: set[int], start: float,
              allocator: Any = None, lockstep: bool = True, chained: bool = False) -> list[Row]:
        """THE decode step, for one live sequence or many: build every row's tree, verify them
        all in one target forward over the KV layout ``kv``, read every verdict in one host
        transfer, keep each accepted path, commit, and record each row's :class:`StepStats`.
        Returns the rows still decoding (a row that reached EOS or ``max_new`` tokens is
        finished: its drafter's ``finish`` ran and its output has its wall time).

        ``allocator``: a batch allocator splitting the step's node budget (None: each tree up to
        its policy's budget); ``lockstep``: let batch-capable drafters draft all rows' layers
        in one forward (:mod:`specframe.decode.lockstep`); ``chained``: one sequence whose
        step starts its clock where the last ended (``Row.mark``), so nothing falls between steps.
        """
        clock = StepClock(rows[0].mark if chained else None)
        trees, sessions, limits, policy_times = self._build(rows, allocator, lockstep)
        clock.lap("other_time")  # the build, split below into its drafting and building
        clock.charge("draft_time", sum(s.draft_time for s in sessions), "other_time")
        clock.charge("policy_time", sum(policy_times), "other_time")
        side = SideStep(rows, self.max_positions, self.target.vocab_size)  # the drafters' side rows, if any
        # A row switched off (limit 1) holds the root the engine made itself: nothing to check.
        flags = [None if lim <= 1 else tree_flag(r.policy.name, t, r.committed[-1], lim, self.strict)
                 for r, t, lim in zip(rows, trees, limits)]
        tree_start = kv.width
        clock.lap("other_time")
        out = side.forward(kv, trees, self._needs_hidden)
        logits = kv.rows_of(out.logits)
        hiddens = kv.hidden_rows(out) if self._needs_hidden else [None] * len(rows)
        clock.lap("target_time")
        reads = self._verify_and_read(rows, trees, limits, flags, logits, verifier, side, side.take(kv, out.logits))
        clock.lap("verify_time")
        paths, counts = [], []
        for b, (row, tree, read, hidden, row_logits) in enumerate(zip(rows, trees, reads, hiddens, logits)):
            emitted = cut_output(read.tokens, max_new - len(row.out.tokens), eos)
            finished = len(emitted) < len(read.tokens) or len(row.out.tokens) + len(emitted) >= max_new \
                or any(t in eos for t in emitted)
            paths.append(None if finished else read.path)
            clock.lap("stop_time")
            # Every step commits, the last too (a drafter that learns from verifications sees
            # them all), with the verifier's whole decision even where the output was cut.
            row.drafter.commit(torch.tensor(read.tokens, dtype=torch.long), read.path, hidden, tree=tree,
                               **logits_keyword(row.drafter, row_logits), **side.keyword(b, row.drafter))
            clock.lap("commit_time")
            counts.append(len(emitted))
            if row.score:
                row.nll_sum = negative_log_likelihood(row_logits, read.path, read.tokens, len(emitted)) + row.nll_sum
            row.committed += emitted
            row.out.tokens += emitted
            row.out.stopped_at_eos = bool(eos) and emitted[-1] in eos
            clock.lap("emit_time")
        kv.keep(paths, tree_start, [read.contiguous for read in reads])
        clock.lap("kv_time")
        return self._record(rows, trees, reads, sessions, limits, counts, paths, policy_times, clock, start)

    def _record(self, rows: list[Row], trees: list[DraftTree], reads: list[StepRead], sessions: list,
                limits: list[int], counts: list[int], paths: list, policy_times: list[float], clock: StepClock,
                start: float) -> list[Row]:
        """Each row's :class:`StepStats` (the policy observes it and ``on_step`` sees it), a
        finished row's ``finish`` and wall time; returns the rows still decoding. The record's
        own intervals are added to the step's fields last, so they too sum to the wall time."""
        live, finished, records = [], [], []
        shared = {f: clock.spent[f] for f in SHARED_FIELDS}
        for row, tree, read, session, limit, count, path, policy_time in zip(
                rows, trees, reads, sessions, limits, counts, paths, policy_times):
            stats = StepStats(
                tree_size=len(tree), depth=len(read.widths) - 1, accepted=len(read.ranks),
                emitted=count, draft_forwards=session.draft_forwards, draft_time=session.draft_time,
                policy_time=policy_time, widths=read.widths, accepted_ranks=read.ranks,
                budget_cut=row.policy.max_budget - limit, accepted_children=read.children, **shared,
            )
            row.out.steps.append(stats)
            records.append(stats)
            clock.lap("record_time")
            if limit > 1:  # a row switched off was not built: its policy has nothing to learn
                began = clock.last
                row.policy.observe(row_share(stats, len(rows)) if row.policy.wants_batch_curve else stats)
                stats.policy_time += clock.lap("policy_time") - began  # its own policy's learning
            if row.on_step is not None:
                row.on_step(StepView(tree, read.path, stats))
                clock.lap("callback_time")
            if path is None:
                if row.score:
                    row.out.nll = float(row.nll_sum)  # the generation's one extra host read
                row.drafter.finish(torch.tensor(row.out.tokens, dtype=torch.long))
                finished.append(row)
            else:
                live.append(row)
        clock.lap("record_time")
        for stats in records:  # the record's own intervals (observe, on_step, finish), shared
            for f in ("record_time", "callback_time"):
                setattr(stats, f, clock.spent[f])
        for row in finished:
            row.out.wall_time = clock.last - start
        for row in live:
            row.mark = clock.last
        return live

    def _build(self, rows: list[Row], allocator: Any, lockstep: bool) -> tuple[list, list, list[int], list[float]]:
        """Every row's tree under its budget (``allocator``'s share of the step's, if any),
        trimmed to the batch budget; each row's session, limit and policy time (its build less
        its drafting)."""
        # The engine alone bounds a tree: the policy's largest, or the room left in the context.
        limits = [min(r.policy.max_budget, self.max_positions - (len(r.committed) - 1)) for r in rows]
        total = None
        if allocator is not None:
            caps, total = limits, allocator.total(limits)
            if total < len(rows):
                raise ValueError(f"allocator {allocator.name!r}: batch budget {total} is below the "
                                 f"{len(rows)} live sequences (each tree needs its root)")
            limits = allocator.budgets(caps, [r.out.steps for r in rows], total)
            if len(limits) != len(rows) or any(not 1 <= lim <= cap for lim, cap in zip(limits, caps)):
                raise EngineError(f"allocator {allocator.name!r} returned budgets {limits} outside [1, {caps}]")

        def new_session(b: int, cls: type[DraftSession]) -> DraftSession:
            row = rows[b]
            return cls(row.drafter, row.committed[-1], self.target.device, row.generator,
                       context_len=len(row.committed))

        trees, sessions, policy_times = build_trees([r.policy for r in rows], [r.drafter for r in rows],
                                                    new_session, limits, lockstep)
        if allocator is not None:
            trees = allocator.trim(trees, total)
            if sum(len(t) for t in trees) > total:
                raise EngineError(f"allocator {allocator.name!r} kept {sum(len(t) for t in trees)} nodes, "
                                  f"over the batch budget {total}")
        return trees, sessions, limits, policy_times

    def _verify_and_read(self, rows: list[Row], trees: list[DraftTree], limits: list[int], flags: list,
                         logits: list[torch.Tensor], verifier: Verifier, side: SideStep,
                         side_records: list[torch.Tensor]) -> list[StepRead]:
        """Verify every row (the one place a step's verdict is decided), then read all verdicts
        (and ``side_records``, the side rows' argmax, handed to ``side``) in ONE device-to-host
        transfer; an invalid tree is refused naming its policy.

        The rows switched off (their root alone) are answered together by the verifier's
        :meth:`~specframe.Verifier.root_tokens` where it has one, so a step in which no row
        speculates costs what a plain decoding step costs (docs/load.md)."""
        off = [b for b, limit in enumerate(limits) if limit <= 1]
        bonus = verifier.root_tokens(torch.stack([logits[b][0] for b in off]), [rows[b].generator for b in off]) \
            if off else None
        if bonus is not None:
            bonus = checked_root_tokens(verifier.name, bonus, len(off), trees[off[0]].device,
                                        self.target.vocab_size, self.strict)
        batched = set(off) if bonus is not None else set()
        pieces, on_host = [], set()
        for b, (row, tree, limit, ok, row_logits) in enumerate(zip(rows, trees, limits, flags, logits)):
            if b in batched:
                continue
            # A tree in host lists whose verifier decides on the host: its rows ride in the read.
            verdict_rows = verifier.verdict_rows(tree, row_logits) if sends_lists(tree, ok) else None
            if verdict_rows is not None:
                on_host.add(b)
                flat_rows = verdict_rows.dim() == 1 and verdict_rows.dtype == torch.long
                pieces.append(verdict_rows if flat_rows else verdict_rows.reshape(-1).long())
                continue
            if ok is None:  # an engine-made root, verified alone
                ok = torch.ones((), dtype=torch.bool, device=tree.device)
            try:
                last, bonus_b = checked_decision(verifier.name, tree, verifier.verify(tree, row_logits, row.generator),
                                                 self.target.vocab_size, self.strict)
            except Exception:
                # An invalid tree (not checked yet) can break a verifier: name the tree.
                reject_tree(row.policy.name, tree, row.committed[-1], limit)
                raise
            pieces += pack_step(tree, last, bonus_b, ok)
        if batched:
            pieces.append(bonus.reshape(-1).long())
        pieces += side_records
        flat = (pieces[0] if len(pieces) == 1 else torch.cat(pieces)).tolist()  # the step's one host read
        flat = side.give(flat)  # the side argmax ride at the end
        roots = iter(flat[len(flat) - len(batched):])
        reads, at = [], 0
        for b, (row, tree, limit) in enumerate(zip(rows, trees, limits)):
            if b in batched:
                reads.append(root_read(next(roots), tree.device))
                continue
            host = sends_lists(tree, flags[b])
            size = len(tree) if b in on_host else packed_size(len(tree), host)
            try:
                if b in on_host:
                    read = read_host_verdict(verifier, tree, flags[b], flat[at : at + size], row.committed[-1],
                                             self.target.vocab_size)
                elif host:
                    read = unpack_host_step(tree, flags[b], flat[at : at + size], row.committed[-1])
                else:
                    read = unpack_step(len(tree), flat[at : at + size], tree.device, row.committed[-1])
            except ValueError as err:
                raise EngineError(f"verifier {verifier.name!r} {err}: verify must return the deepest "
                                  f"accepted node and the bonus token") from err
            at += size
            if not read.ok:
                reject_tree(row.policy.name, tree, row.committed[-1], limit)  # names it as strict mode would
                raise EngineError(f"policy {row.policy.name!r} returned an invalid tree: {read.problem}")
            reads.append(read)
        return reads


def root_read(bonus: int, device: torch.device) -> StepRead:
    """The :class:`StepRead` of a root-only tree whose verifier added ``bonus`` (what
    :func:`unpack_step` parses from that tree's packed record)."""
    return StepRead(ok=True, path=torch.zeros(1, dtype=torch.long, device=device), tokens=[bonus], ranks=[],
                    widths=[1], contiguous=True, children=0)


