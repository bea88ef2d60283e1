"""Batched drafting: the rows' policies build their trees in lockstep, so that their draft calls
meet and a drafter that can (:attr:`Drafter.expand_batch`) answers all of a layer's calls in ONE
draft forward for the whole batch (docs/batching.md, "Batched drafting").

Policies keep their API: each row's ``policy.build(session, limit)`` runs on a worker thread
(kept in a pool across steps) whose :class:`LockstepSession` posts every ``expand`` /
``expand_top`` as a :class:`DraftCall` and waits. The threads only take turns: a baton passes
from row to row, one thread runs at a time, so a build runs exactly the code it runs alone, in
a fixed order, and its policy time is its own. Once every unfinished build waits on a call,
the coordinator answers them all at once (one ``expand_batch`` per drafter class; a drafter
without it answers its calls one by one) and passes the baton round again. The n-gram drafter
has no ``expand_batch``: a batch of such rows builds one tree after another as before, without
threads.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from specframe.decode.kv_padded import batch_attention_mask, pad_columns
from specframe.interfaces import DraftSession, Drafter, TreePolicy
from specframe.models.target import TargetModel
from specframe.tree import DraftTree

#: How long a cancelled build may take to unwind before the coordinator gives up on it (its
#: thread is a daemon, so a policy that swallows the cancellation cannot hang the process).
CANCEL_WAIT_S = 10.0


@dataclass
class DraftCall:
    """One row's pending draft call: ``expand(tree, nodes)`` when ``k`` is None, else
    ``expand_top(tree, nodes, k)``, of ``drafter``."""

    drafter: Drafter
    tree: DraftTree
    nodes: torch.Tensor
    k: int | None = None

    def run(self) -> Any:
        """The call answered by its own drafter alone."""
        if self.k is None:
            return self.drafter.expand(self.tree, self.nodes)
        return self.drafter.expand_top(self.tree, self.nodes, self.k)


class DraftBuildError(RuntimeError):
    """A row's tree could not be built in a batch: its policy or its drafter raised (the
    original exception is the ``__cause__``)."""


class _Cancelled(BaseException):
    """Raised inside a waiting build when another row failed (a BaseException, so that a
    policy's ``except Exception`` does not swallow it)."""


def batch_capable(drafter: Drafter) -> bool:
    """Whether ``drafter``'s class answers several rows' calls at once (``expand_batch``)."""
    return getattr(type(drafter), "expand_batch", None) is not None


def answer_calls(calls: Sequence[DraftCall]) -> tuple[list[Any], list[float]]:
    """Every call's answer, and each call's share of the draft time.

    Calls whose drafters share a class with ``expand_batch`` go to it together (one draft
    forward per layer for them all) and split its time evenly; the others run alone.
    """
    answers: list[Any] = [None] * len(calls)
    shares = [0.0] * len(calls)
    groups: dict[type, list[int]] = {}
    for i, call in enumerate(calls):
        if batch_capable(call.drafter):
            groups.setdefault(type(call.drafter), []).append(i)
        else:
            groups.setdefault(object, []).append(i)  # never batched: answered one by one below
    for cls, members in groups.items():
        if cls is object or len(members) == 1:
            for i in members:
                start = time.perf_counter()
                answers[i] = calls[i].run()
                shares[i] = time.perf_counter() - start
            continue
        start = time.perf_counter()
        out = cls.expand_batch([calls[i] for i in members])
        share = (time.perf_counter() - start) / len(members)
        for i, answer in zip(members, out):
            answers[i], shares[i] = answer, share
    return answers, shares


class _Worker:
    """A daemon thread kept for later steps (starting a thread costs about a round trip of the
    baton): it runs the builds handed to it, one at a time. ``go`` wakes it, both to start a
    build and to return from a draft call."""

    def __init__(self) -> None:
        self.go = threading.Semaphore(0)
        self.build: _Build | None = None
        threading.Thread(target=self._loop, name="specframe-build", daemon=True).start()

    def _loop(self) -> None:
        while True:
            self.go.acquire()
            build, self.build = self.build, None
            if build is not None:
                build.run()


_IDLE: list[_Worker] = []
_IDLE_LOCK = threading.Lock()


def _take_workers(n: int) -> list[_Worker]:
    with _IDLE_LOCK:
        taken = [_IDLE.pop() for _ in range(min(n, len(_IDLE)))]
    return taken + [_Worker() for _ in range(n - len(taken))]


def _give_back(workers: Sequence[_Worker]) -> None:
    with _IDLE_LOCK:
        _IDLE.extend(workers)


class _Build:
    """One row's ``policy.build`` on a worker thread, run one segment at a time: from a wake
    to its next draft call (or its end), after which it wakes ``then`` (the next build of the
    round, or the coordinator): the baton passes along the rows, one thread runs at a time."""

    def __init__(self, row: int, policy: TreePolicy, session: "LockstepSession", limit: int,
                 worker: _Worker) -> None:
        self.row, self.policy, self.session, self.limit, self.worker = row, policy, session, limit, worker
        self.call: DraftCall | None = None
        self.answer: Any = None
        self.tree: DraftTree | None = None
        self.error: BaseException | None = None
        self.done = False
        self.active = 0.0  # seconds this build ran: its policy time
        self.then: threading.Semaphore | None = None
        self.cancelled = False
        self._since = 0.0  # when this build's current segment began
        # Grad and inference modes are per thread: the build runs under the caller's.
        self._modes = (torch.is_grad_enabled(), torch.is_inference_mode_enabled())
        session.build = self
        worker.build = self

    def run(self) -> None:
        """(Worker thread, first wake.) The whole build; hands the baton on at its end."""
        self._since = time.perf_counter()
        try:
            if not self.cancelled:
                grad, inference = self._modes
                with torch.inference_mode(inference), torch.set_grad_enabled(grad):
                    self.tree = self.policy.build(self.session, self.limit)
        except _Cancelled:
            pass
        except BaseException as err:  # handed to the coordinator, which raises it naming the row
            self.error = err
        self.active += time.perf_counter() - self._since
        self.done = True
        self.then.release()

    def post(self, call: DraftCall) -> Any:
        """(Worker thread.) Hand ``call`` on with the baton and wait for its answer."""
        if self.cancelled:
            raise _Cancelled()
        self.call = call
        self.active += time.perf_counter() - self._since
        self.then.release()
        self.worker.go.acquire()
        self._since = time.perf_counter()
        if self.cancelled:
            raise _Cancelled()
        answer, self.answer = self.answer, None
        return answer

    def wake(self, answer: Any, then: threading.Semaphore) -> None:
        """(Coordinator.) Set what the build gets on its next wake and whom it wakes after."""
        self.call, self.answer, self.then = None, answer, then


class LockstepSession(DraftSession):
    """A :class:`DraftSession` whose draft calls wait for the coordinator: it answers them
    together with the other rows' calls of the same layer, then adds this row's share of the
    call's time to ``draft_time`` and one draft forward to ``draft_forwards``."""

    build: _Build

    def expand(self, tree: DraftTree, nodes: torch.Tensor | list[int]) -> torch.Tensor:
        """Draft log-probs ``[len(nodes), V]`` for ``nodes`` of ``tree``: one (batched) draft forward."""
        return self.build.post(DraftCall(self.drafter, tree, _as_nodes(tree, nodes)))

    def expand_top(self, tree: DraftTree, nodes: torch.Tensor | list[int],
                   k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The top ``k`` children of each of ``nodes`` (see :meth:`DraftSession.expand_top`)."""
        return self.build.post(DraftCall(self.drafter, tree, _as_nodes(tree, nodes), int(k)))


def _as_nodes(tree: DraftTree, nodes: torch.Tensor | list[int]) -> torch.Tensor:
    return torch.as_tensor(nodes, dtype=torch.long, device=tree.device)


def lockstep_wanted(drafters: Sequence[Drafter]) -> bool:
    """Whether building in lockstep can save draft forwards: two rows at least whose drafters
    batch (a lone row, or drafters without ``expand_batch``, build one after another)."""
    return sum(batch_capable(d) for d in drafters) >= 2


def build_lockstep(policies: Sequence[TreePolicy], sessions: Sequence[LockstepSession],
                   limits: Sequence[int]) -> tuple[list[DraftTree], list[float]]:
    """Every row's ``policy.build(session, limit)`` in lockstep; returns the trees and each
    row's policy time (the time its build ran, draft calls excluded).

    Raises :class:`DraftBuildError` naming the first failing row's policy (or the rows of a
    failing drafter call), after unwinding every other build.
    """
    workers = _take_workers(len(policies))
    builds = [_Build(b, p, s, lim, w) for b, (p, s, lim, w) in enumerate(zip(policies, sessions, limits, workers))]
    back = threading.Semaphore(0)
    try:
        _round(builds, [None] * len(builds), back)
        while True:
            _raise_failed(builds)
            waiting = [b for b in builds if not b.done]
            if not waiting:
                break
            _round(waiting, _answer_or_raise(waiting), back)
    finally:
        _cancel(builds, back)
        _give_back([b.worker for b in builds if b.done])  # a build that never unwound keeps its thread
    return [b.tree for b in builds], [b.active for b in builds]


def _round(builds: Sequence[_Build], answers: Sequence[Any], back: threading.Semaphore) -> None:
    """Wake the builds one after another (each wakes the next), until the last hands back."""
    for i, (build, answer) in enumerate(zip(builds, answers)):
        build.wake(answer, builds[i + 1].worker.go if i + 1 < len(builds) else back)
    builds[0].worker.go.release()
    back.acquire()


def _cancel(builds: Sequence[_Build], back: threading.Semaphore) -> None:
    """Unwind every unfinished build, one at a time; never blocks for long."""
    for build in builds:
        if build.done:
            continue
        build.cancelled = True
        build.then = back
        build.worker.go.release()
        back.acquire(timeout=CANCEL_WAIT_S)


def _raise_failed(builds: Sequence[_Build]) -> None:
    for build in builds:
        if build.error is not None:
            err = build.error
            raise DraftBuildError(f"row {build.row}: policy {build.policy.name!r} raised "
                                  f"{type(err).__name__} while building its tree: {err}") from err


def _answer_or_raise(waiting: Sequence[_Build]) -> list[Any]:
    """The answers to the waiting builds' calls, each session charged its share."""
    calls = [b.call for b in waiting]
    try:
        answers, shares = answer_calls(calls)
    except Exception as err:
        rows = ", ".join(f"row {b.row} ({b.session.drafter.name!r})" for b in waiting)
        raise DraftBuildError(f"a batched draft call of {rows} raised {type(err).__name__}: {err}") from err
    for build, share in zip(waiting, shares):
        build.session.draft_time += share
        build.session.draft_forwards += 1
    return answers


def build_trees(policies: Sequence[TreePolicy], drafters: Sequence[Drafter],
                new_session: Callable[[int, type[DraftSession]], DraftSession],
                limits: Sequence[int], lockstep: bool = True) -> tuple[list[DraftTree], list[DraftSession], list[float]]:
    """Every row's tree, its session and its policy time: in lockstep when two rows' drafters
    batch (:func:`lockstep_wanted`) and ``lockstep`` allows it, else one row after another (as
    a lone sequence builds).

    ``new_session(b, cls)``: row ``b``'s session of class ``cls``.

    A row whose limit is 1 (its speculation switched off, e.g. by a load-aware allocator) gets
    its root alone without a build: its policy is not called and its drafter drafts nothing,
    so it costs what a plain decoding step costs (docs/load.md, "A switch that stays cheap").
    """
    off = [b for b, limit in enumerate(limits) if limit <= 1]
    if not off:
        return _build_all(policies, drafters, new_session, limits, lockstep)
    on = [b for b in range(len(limits)) if limits[b] > 1]
    trees: list[Any] = [None] * len(limits)
    sessions: list[Any] = [None] * len(limits)
    times = [0.0] * len(limits)
    for b in off:
        sessions[b] = new_session(b, DraftSession)
        trees[b] = sessions[b].new_tree()
    if on:
        built = _build_all([policies[b] for b in on], [drafters[b] for b in on],
                           lambda j, cls: new_session(on[j], cls), [limits[b] for b in on], lockstep)
        for j, b in enumerate(on):
            trees[b], sessions[b], times[b] = built[0][j], built[1][j], built[2][j]
    return trees, sessions, times


def _build_all(policies: Sequence[TreePolicy], drafters: Sequence[Drafter],
               new_session: Callable[[int, type[DraftSession]], DraftSession],
               limits: Sequence[int], lockstep: bool) -> tuple[list[DraftTree], list[DraftSession], list[float]]:
    """:func:`build_trees` for rows that all build (every limit above 1)."""
    if not (lockstep and lockstep_wanted(drafters)):
        trees, sessions, times = [], [], []
        for b, (policy, limit) in enumerate(zip(policies, limits)):
            start = time.perf_counter()
            session = new_session(b, DraftSession)
            sessions.append(session)
            trees.append(policy.build(session, limit))
            times.append(time.perf_counter() - start - session.draft_time)
        return trees, sessions, times
    sessions = [new_session(b, LockstepSession) for b in range(len(policies))]
    trees, times = build_lockstep(policies, sessions, limits)
    return trees, sessions, times


# ---------------------------------------------------------------------- packed draft forward
@dataclass
class RowInputs:
    """One row's draft forward, as :meth:`TargetModel.forward` takes it: ``tokens`` ``[q]`` at
    ``positions`` ``[q]``, ``mask`` bool ``[q, t + q]`` over the last ``t`` cache entries and the
    new tokens (every earlier cache entry visible), ``top`` = the largest position."""

    tokens: torch.Tensor
    positions: torch.Tensor
    mask: torch.Tensor
    top: int


def forward_rows(lms: Sequence[TargetModel], rows: Sequence[RowInputs]) -> list[torch.Tensor]:
    """Each row's forward on its own model wrapper's cache, appending to it as
    :meth:`TargetModel.forward` does; returns each row's logits ``[q_b, V]``.

    Wrappers of ONE model (so one set of weights) share ONE forward: the rows' caches stacked
    zero-padded to ``[B, H, S_max, D]`` (a row's columns past its ``cache_len`` masked), queries
    packed ``[B, q_max]`` with per-row positions (a padding query sees only itself), and each
    row's new keys and values appended to its own cache after. A lone row, or a model with
    sliding-window layers (its per-row window mask is not built), runs alone.
    """
    model = lms[0].model
    if any(lm.model is not model for lm in lms):
        raise ValueError("forward_rows: the rows' wrappers must share one model (one set of weights)")
    if len(lms) == 1 or lms[0].sliding_window is not None:
        return [lm.forward(r.tokens, r.positions, r.mask, max_position=r.top).logits[0] for lm, r in zip(lms, rows)]
    with torch.inference_mode():
        return _packed_forward(lms, rows)


def _packed_forward(lms: Sequence[TargetModel], rows: Sequence[RowInputs]) -> list[torch.Tensor]:
    lead = lms[0]
    for lm, r in zip(lms, rows):
        if r.top >= lm.max_positions:
            raise ValueError(f"position {r.top} is beyond the model's {lm.max_positions} positions")
        if lm.cache is None:
            lm.reset()
    sizes = [int(r.tokens.shape[0]) for r in rows]
    lengths = [lm.cache_len for lm in lms]
    width, q_max, dev = max(lengths), max(sizes), lead.device
    tokens = torch.zeros(len(rows), q_max, dtype=torch.long, device=dev)
    positions = torch.zeros(len(rows), q_max, dtype=torch.long, device=dev)
    for b, (r, q) in enumerate(zip(rows, sizes)):
        tokens[b, :q] = r.tokens.to(dev)
        positions[b, :q] = r.positions.to(dev)
        positions[b, q:] = r.top  # padding: any position in range (its output is never read)
    cache = _stacked_cache(lms, width)
    out = lead._call(input_ids=tokens, position_ids=positions,
                     attention_mask=batch_attention_mask(lead, row_visibility(rows, lengths, width, q_max).to(dev)),
                     use_cache=True, **{lead._cache_kw: cache})
    for b, (lm, q) in enumerate(zip(lms, sizes)):
        for i, layer in enumerate(cache.layers):
            lm.cache.update(layer.keys[b : b + 1, :, width : width + q], layer.values[b : b + 1, :, width : width + q], i)
        lm.cache_len += q
    return [out.logits[b, :q] for b, q in enumerate(sizes)]


def row_visibility(rows: Sequence[Any], lengths: Sequence[int], width: int, q_max: int) -> torch.Tensor:
    """Bool ``[B, q_max, width + q_max]`` of rows packed over their caches stacked to ``width``
    columns: row b's query i sees its cache prefix (``lengths[b]`` entries; the last ones as
    its ``mask`` says), and its new tokens as its ``mask`` says; padding sees itself. A row is
    anything with ``tokens`` ``[q]`` and a bool ``mask`` ``[q, t + q]`` over its last ``t``
    cache entries and its new tokens (:class:`RowInputs`, an EAGLE head's job)."""
    dev = rows[0].mask.device
    visible = torch.zeros(len(rows), q_max, width + q_max, dtype=torch.bool, device=dev)
    visible[:, :, width:] = torch.eye(q_max, dtype=torch.bool, device=dev)
    for b, (r, length) in enumerate(zip(rows, lengths)):
        q = int(r.tokens.shape[0])
        tail = r.mask.shape[1] - q  # cache entries the row's mask covers (its tree slots)
        visible[b, :q, : length - tail] = True
        visible[b, :q, length - tail : length] = r.mask[:, :tail]
        visible[b, :q, width : width + q] = r.mask[:, tail:]
    return visible


def _stacked_cache(lms: Sequence[TargetModel], width: int) -> Any:
    """A transformers cache holding every row's keys and values, zero-padded to ``width``."""
    from transformers import DynamicCache

    cache = DynamicCache()
    if width == 0:
        return cache
    template = next(lm.cache for lm in lms if lm.cache_len > 0)
    for i, layer in enumerate(template.layers):
        keys = [pad_columns(_own(lm.cache, i, "keys"), layer.keys, width) for lm in lms]
        values = [pad_columns(_own(lm.cache, i, "values"), layer.values, width) for lm in lms]
        cache.update(torch.cat(keys), torch.cat(values), i)
    return cache


def _own(cache: Any, i: int, name: str) -> torch.Tensor | None:
    """Layer ``i``'s ``name`` tensor of one row's cache, or None where it holds nothing yet."""
    layers = getattr(cache, "layers", None) or []
    own = getattr(layers[i], name, None) if i < len(layers) else None
    return own if own is not None and own.dim() == 4 and own.shape[-2] else None
