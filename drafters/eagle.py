"""Drafter ``eagle``: an EAGLE-1/2 feature-level head (``eagle3`` subclasses it).

Alignment (SafeAILab/EAGLE ``topK_genrate``): the head consumes pairs (f_t, x_{t+1}) where f_t
is the target's feature at position t; the pair sits at head position t and predicts x_{t+2}.
With L committed tokens (root = x_{L-1} included) the target has run on x_0..x_{L-2} only, so the
tree root is drafted from the pair (f_{L-2}, x_{L-1}); a tree node u of depth d >= 1 is the pair
(h(parent(u)), token(u)) at position L-2+d, where h is the head's own output feature.

Head KV cache: committed pairs (all target features) followed by this step's tree nodes. Each
expand forwards one tree layer in one batch with tree attention (committed pairs + the node's
ancestors + itself). At commit the tree entries are dropped and the accepted path comes back as
new committed pairs built from the TARGET's features of the verified tree (as EAGLE does: the
head's own guesses for those rows are replaced by the real features).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Generator, Sequence

import torch

from specframe.decode.lockstep import DraftCall, row_visibility
from specframe.decode.kv_padded import pad_columns
from specframe.interfaces import Drafter
from specframe.options import OptionError, require
from specframe.models.linears import linears_label, use_linears
from specframe.models.packed_linear import linear_kernel, pack_linears
from specframe.selection import topk_per_row
from specframe.models.target import TargetModel
from specframe.tree import DraftTree, HostLists

from .eagle_checkpoint import load_head
from .eagle_head import EagleHead


@dataclass
class EagleOptions:
    """Options of the ``eagle`` / ``eagle3`` drafters.

    Attributes:
        path: checkpoint directory in the published EAGLE layout, or a shipped name
            (``demo-eagle``).
        head: an already built :class:`EagleHead` instance (instead of ``path``).
        allow_pickle: allow loading ``pytorch_model.bin`` (a pickle) when no safetensors exist.
        dtype: dtype to run the head in (default: the target's).
    """

    path: Any = None
    head: Any = None
    allow_pickle: bool = False
    dtype: str | None = None

    def __post_init__(self) -> None:
        require((self.path is None) != (self.head is None), "path",
                "or option 'head' is required, not both (a checkpoint directory / shipped name, or an EagleHead)")
        if self.dtype is not None:
            require(isinstance(getattr(torch, self.dtype, None), torch.dtype), "dtype",
                    f"must name a torch dtype (e.g. float32, bfloat16), got {self.dtype!r}")


class EagleDrafter(Drafter):
    """EAGLE-1/2 head drafter: one batched head forward per tree layer, over its own KV cache."""

    name: ClassVar[str] = "eagle"
    kind: ClassVar[str] = "eagle"
    Options = EagleOptions
    needs_target_hidden = True
    # Replay feeds hidden states of one full forward, equal to the tree forward's up to the last bits.
    replay = "approximate"

    def __init__(self, options: EagleOptions, target: TargetModel) -> None:
        super().__init__(options, target)
        dtype = getattr(torch, options.dtype) if options.dtype else target.dtype
        if options.head is not None:
            if not isinstance(options.head, EagleHead):
                raise OptionError(f"option 'head' of drafter {self.name!r} must be an EagleHead, got {type(options.head).__name__}")
            if options.head.kind != self.kind:
                raise OptionError(f"option 'head' of drafter {self.name!r} is an {options.head.kind!r} head; use drafter {options.head.kind!r}")
            head = options.head.to(device=target.device, dtype=dtype)
        else:
            head = load_head(options.path, target, kind=self.kind, allow_pickle=options.allow_pickle,
                             dtype=dtype, device=target.device)
            # A head of its own runs the small-batch linear kernel the target was given
            # (packed_linears, or bf16 linears): its forwards are tree layers of a few tokens too. A head passed
            # in stays as it is (it is the caller's object).
            kernel = linear_kernel(target.model)
            if kernel is not None:
                pack_linears(head, kernel)
            elif linears_label(target.model).startswith("bf16-"):
                use_linears(head, "bf16")
        self.head: EagleHead = head.eval()
        self.device = target.device
        self._band = _CausalBand(self.device)
        self.begin(torch.zeros(1, dtype=torch.long))

    def shared_options(self) -> EagleOptions:
        """These options with the loaded head itself (kernels packed): a batch's rows share it."""
        return replace(self.options, path=None, head=self.head)

    # ------------------------------------------------------------------ state
    def begin(self, prompt_ids: torch.Tensor, target_hidden: Any = None) -> None:
        """Reset; queue the prompt's pairs (f_t, x_{t+1}), forwarded with the first expand."""
        self.num_committed = len(prompt_ids)
        self.kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self.cached = 0  # committed pairs in the head cache (pair t sits at position t)
        width = self.head.config.feature_size
        # Held [1, p, F] and [1, p]: the head's batched shape, so a root forward adds no view.
        self.pending_feats = torch.zeros(1, 0, width, dtype=self.head.fc.weight.dtype, device=self.device)
        self.pending_tokens = torch.zeros(1, 0, dtype=torch.long, device=self.device)
        # Emptied after each root forward: kept, not sliced anew (each op counts on a CPU step).
        self._no_feats, self._no_tokens = self.pending_feats, self.pending_tokens
        if target_hidden is not None:
            self._queue(self.head.features(target_hidden), prompt_ids[1:])
        # The head's vocabulary map, read once a generation: top-k over the draft vocabulary
        # keeps the target's tie rule (lower id first) only where the map is increasing.
        ids = self.head.draft_ids if self.head.maps_vocab else None  # None: the target's own ids
        self._increasing = ids is None or bool((ids[1:] > ids[:-1]).all())
        self._draft_ids = ids
        self._id_list = None if ids is None else ids.tolist()
        self._new_step()

    def _queue(self, feats: torch.Tensor, tokens: torch.Tensor) -> None:
        """Queue pairs: target features ``[1, n, F]`` and the tokens ``[n]`` that follow them."""
        n = min(feats.shape[1], len(tokens))
        feats = feats if n == feats.shape[1] else feats[:, :n]
        tokens = (tokens if n == len(tokens) else tokens[:n]).reshape(1, n)
        if feats.device != self.device or feats.dtype != self.pending_feats.dtype:
            feats = feats.to(self.device, self.pending_feats.dtype)
        if tokens.device != self.device or tokens.dtype != torch.long:
            tokens = tokens.to(self.device, torch.long)
        # Usually nothing is pending (the root forward took it): the new pairs are the queue.
        pending = self.pending_tokens.shape[1]
        self.pending_feats = torch.cat([self.pending_feats, feats], dim=1) if pending else feats
        self.pending_tokens = torch.cat([self.pending_tokens, tokens], dim=1) if pending else tokens

    def _new_step(self) -> None:
        # Rows are kept as [1, ...] views of their forward's output: one row wanted (the root's,
        # most steps) is handed on as it is, several are one cat (each op counts after a forward).
        self.out_of: dict[int, torch.Tensor] = {}   # tree node -> head output feature [1, H]
        self.logp_of: dict[int, torch.Tensor] = {}  # tree node -> draft-vocab log-probs [1, V_draft]
        self.slots: list[int] = []                  # tree nodes in cache order after the committed pairs

    # ------------------------------------------------------------------ drafting
    def expand(self, tree: DraftTree, nodes: torch.Tensor) -> torch.Tensor:
        """Log-probs ``[len(nodes), V]`` after each node: one head forward per missing tree layer.

        Policies expand a layer whose parents were expanded before, so this is one forward.
        """
        return self.head.to_target(self._draft_rows(tree, nodes))

    def expand_top(self, tree: DraftTree, nodes: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:func:`topk_per_row` of :meth:`expand`'s rows, taken over the head's own vocabulary
        (8192 entries for SmolLM2's EAGLE-3 against the target's 49152) and mapped to target ids."""
        return self._top(self._draft_rows(tree, nodes), k)

    def _top(self, rows: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``topk_per_row(head.to_target(rows), k)`` for draft-vocabulary ``rows``: the same
        answer from the smaller rows where the vocabulary map is increasing (ties keep the lower
        target id) and every row has ``k`` finite entries (a short row pads with target ids);
        on the CPU, where that check reads nothing from a device."""
        ids = self._draft_ids
        if ids is None or not self._increasing or rows.device.type != "cpu" or k > rows.shape[1]:
            return topk_per_row(self.head.to_target(rows), k)
        values, index, ranks = topk_per_row(rows, k)
        if k and bool(torch.isinf(values[:, -1]).any()):
            return topk_per_row(self.head.to_target(rows), k)
        return values, ids[index], ranks

    def top_lists(self, tree: DraftTree, nodes: list[int], k: int) -> list[tuple[list[float], list[int]]]:
        """:meth:`expand_top`'s rows as host lists (``DraftSession.expand_top_lists``), on the
        CPU from one ``topk`` of ``k + 1`` places and a sort of ``k`` on the host: where a row's
        ``k``-th and ``k + 1``-th values tie (``topk`` may pick either), a row has fewer than ``k``
        finite entries or a NaN, the call takes :meth:`expand_top`'s exact selection instead."""
        rows = self._draft_rows(tree, [int(n) for n in nodes])
        k = min(int(k), self.vocab_size)
        if self._increasing and rows.device.type == "cpu" and 0 < k < rows.shape[1]:
            top = torch.topk(rows, k + 1, dim=-1, sorted=True)
            out = _host_top(top.values.tolist(), top.indices.tolist(), k, self._id_list)
            if out is not None:
                return out
        values, tokens, _ = self._top(rows, k)
        return list(zip(values.tolist(), tokens.tolist()))

    def _draft_rows(self, tree: DraftTree, nodes: torch.Tensor | list[int]) -> torch.Tensor:
        """Draft-vocabulary log-probs ``[len(nodes), V_draft]`` (one head forward per missing layer)."""
        with torch.inference_mode():
            if isinstance(nodes, list) and nodes == [0] and 0 not in self.logp_of:
                # The root's row alone (most steps' only layer): _expand_steps' walk without
                # the generator around it.
                job = self._root_job()
                if job is not None:
                    self._take_root(self._run(job))
                return self.logp_of[0]
            steps = self._expand_steps(tree, nodes)
            try:
                job = next(steps)
                while True:
                    job = steps.send(self._run(job))
            except StopIteration as done:
                return done.value

    @classmethod
    def expand_batch(cls, calls: Sequence[DraftCall]) -> list[Any]:
        """Several rows' calls (:class:`specframe.decode.lockstep.DraftCall`, one per row, each of
        its own drafter) with ONE head forward per tree layer for the rows that share a head:
        their pairs packed ``[B, q_max]`` over their head caches stacked (zero-padded, masked).
        Each answer is what the row's own ``expand`` / ``expand_top`` returns, up to float
        rounding of the other shapes."""
        with torch.inference_mode():
            steps = [call.drafter._expand_steps(call.tree, call.nodes) for call in calls]
            answers: list[Any] = [None] * len(calls)
            sends: dict[int, Any] = {i: None for i in range(len(calls))}
            while sends:
                jobs = {}
                for i, value in sends.items():
                    try:
                        jobs[i] = steps[i].send(value)
                    except StopIteration as done:
                        answers[i] = done.value
                sends = {}
                for group in _by_head(calls, jobs):
                    hidden = _run_packed([calls[i].drafter for i in group], [jobs[i] for i in group])
                    sends.update(zip(group, hidden))
        return [call.drafter.head.to_target(rows) if call.k is None else call.drafter._top(rows, call.k)
                for call, rows in zip(calls, answers)]

    def _expand_steps(self, tree: DraftTree, nodes: torch.Tensor | list[int]) -> Generator["_HeadJob", torch.Tensor, torch.Tensor]:
        """:meth:`expand` as a generator: yields each head forward it needs (a :class:`_HeadJob`),
        is sent the forward's hidden rows ``[1, q, H]``, returns the log-probs."""
        if 0 not in self.logp_of:
            job = self._root_job()
            if job is not None:
                self._take_root((yield job))
        wanted = nodes if isinstance(nodes, list) else nodes.tolist()
        if tree.has_host():  # a tree in host lists: its ancestors and depths without tensor ops
            lists = tree.host()
            closure = set()
            for node in wanted:
                while node >= 0 and node not in closure:
                    closure.add(node)
                    node = lists.parents[node]
            missing, depths = [i for i in sorted(closure) if i not in self.logp_of], lists.depths
        else:
            anc = tree.ancestor_mask()[nodes].any(dim=0)
            missing = [i for i in torch.nonzero(anc).flatten().tolist() if i not in self.logp_of]
            depths = tree.depths.tolist()
        for depth in sorted({depths[i] for i in missing}):
            todo = [i for i in missing if depths[i] == depth]
            job = self._nodes_job(tree, todo)
            if job is not None:
                self._take_nodes(todo, (yield job))
        return self.logp_of[wanted[0]] if len(wanted) == 1 else torch.cat([self.logp_of[n] for n in wanted])

    def _uniform(self) -> torch.Tensor:
        cfg = self.head.config
        logp = torch.full((1, cfg.draft_vocab_size), -math.log(cfg.draft_vocab_size),
                          dtype=torch.promote_types(self.pending_feats.dtype, torch.float32), device=self.device)
        return self.head.draft_logp(logp)

    def _root_job(self) -> "_HeadJob | None":
        """The forward of the queued committed pairs, whose last one (f_{L-2}, root) drafts the
        root's children; None when there is nothing to forward (the root then drafts uniformly)."""
        p = self.pending_tokens.shape[1]
        if p == 0:
            # A one-token prompt: the target has produced no feature yet, so nothing to draft from.
            self.logp_of[0] = self._uniform()
            return None
        positions, mask = self._band.causal(self.cached, p)
        return _HeadJob(self.pending_tokens, self.pending_feats, positions, mask, from_target=True)

    def _take_root(self, hidden: torch.Tensor) -> None:
        self.cached += self.pending_tokens.shape[1]
        self.pending_feats, self.pending_tokens = self._no_feats, self._no_tokens
        self.out_of[0] = last = hidden[0, -1:]
        self.logp_of[0] = self.head.draft_logp(self.head.logits(last))

    def _nodes_job(self, tree: DraftTree, todo: list[int]) -> "_HeadJob | None":
        """One batched forward of tree nodes whose parents have head outputs (None: no
        features at all, the nodes draft uniformly)."""
        if 0 not in self.out_of:  # no features at all (one-token prompt): stay uninformed
            for node in todo:
                self.logp_of[node] = self._uniform()
            return None
        if tree.has_host():
            return self._nodes_job_from_lists(tree.host(), todo)
        idx = torch.tensor(todo, dtype=torch.long, device=tree.device)
        parents = tree.parents[idx].tolist()
        missing = [p for p in parents if p not in self.out_of]
        if missing:
            raise RuntimeError(f"EAGLE drafter: node {missing[0]}'s parent was never expanded")
        feats = torch.stack([self.out_of[p] for p in parents], dim=1)
        positions = (self.cached - 1 + tree.depths[idx]).to(self.device)[None]
        anc = tree.ancestor_mask()[idx].to(self.device)
        q, s = len(todo), len(self.slots)
        mask = torch.ones(1, q, self.cached + s + q, dtype=torch.bool, device=self.device)
        if s:
            mask[0, :, self.cached : self.cached + s] = anc[:, torch.tensor(self.slots, device=self.device)]
        mask[0, :, self.cached + s :] = anc[:, idx.to(self.device)]
        return _HeadJob(tree.tokens[idx].to(self.device)[None], feats, positions, mask, from_target=False)

    def _nodes_job_from_lists(self, lists: HostLists, todo: list[int]) -> "_HeadJob":
        """:meth:`_nodes_job` for a tree in host lists: the same job, its mask's tree columns
        (this step's cached nodes, then ``todo``) from the lists in one tensor."""
        parents = [lists.parents[i] for i in todo]
        missing = [p for p in parents if p not in self.out_of]
        if missing:
            raise RuntimeError(f"EAGLE drafter: node {missing[0]}'s parent was never expanded")
        columns = self.slots + todo
        rows = []
        for node in todo:
            seen = set()
            while node >= 0:
                seen.add(node)
                node = lists.parents[node]
            rows.append([c in seen for c in columns])
        mask = torch.ones(1, len(todo), self.cached + len(columns), dtype=torch.bool, device=self.device)
        mask[0, :, self.cached :] = torch.tensor(rows, dtype=torch.bool, device=self.device)
        return _HeadJob(torch.tensor([[lists.tokens[i] for i in todo]], dtype=torch.long, device=self.device),
                        torch.stack([self.out_of[p] for p in parents], dim=1),
                        torch.tensor([[self.cached - 1 + lists.depths[i] for i in todo]], device=self.device),
                        mask, from_target=False)

    def _take_nodes(self, todo: list[int], hidden: torch.Tensor) -> None:
        hidden = hidden[0]
        logp = self.head.draft_logp(self.head.logits(hidden))
        # One split each: an index per node is a tensor op per node.
        for node, out, row in zip(todo, hidden.split(1), logp.split(1)):
            self.out_of[node] = out
            self.logp_of[node] = row
        self.slots += todo

    def _run(self, job: "_HeadJob") -> torch.Tensor:
        """The head's forward of ``job`` on this row's cache; its hidden rows ``[1, q, H]``."""
        hidden, self.kv = self.head(job.tokens, job.feats, job.positions, job.mask, self.kv, job.from_target)
        return hidden

    @property
    def _cache_len(self) -> int:
        """Rows in the head's cache (committed pairs, then this step's forwarded tree nodes)."""
        return 0 if self.kv is None else int(self.kv[0][0].shape[2])

    # ------------------------------------------------------------------ commit
    @torch.inference_mode()
    def commit(self, tokens: torch.Tensor, path: torch.Tensor | None = None, target_hidden: Any = None,
               tree: DraftTree | None = None) -> None:
        """Drop this step's tree entries (so a re-indexed ``tree`` needs no mapping); queue (target feature of each path node, next token).

        The accepted path (root first) and the emitted tokens (accepted + bonus) give pairs
        (f_root, t_1), (f_{a_1}, t_2), ..., (f_{a_k}, bonus): exactly the next committed pairs.
        """
        if self.kv is not None and self.slots:  # tree nodes were forwarded: their rows go
            self.kv = [(k[:, :, : self.cached], v[:, :, : self.cached]) for k, v in self.kv]
        if target_hidden is not None and path is not None:
            self._queue(self.head.features(target_hidden, path if path.dtype == torch.long else path.long()), tokens)
        self.num_committed += len(tokens)
        self._new_step()


def _host_top(values: list[list[float]], index: list[list[int]], k: int,
              ids: list[int] | None) -> list[tuple[list[float], list[int]]] | None:
    """Each row's ``k`` best of its ``k + 1`` largest (``values``, draft ``index``), ordered by
    value then id and mapped to target ``ids`` (None: the same ids); None when a row needs the
    exact selection (a tie at the k-th place, fewer than k finite values, a NaN)."""
    out = []
    for vals, idx in zip(values, index):
        if vals[k - 1] == vals[k] or vals[k - 1] == -math.inf or any(v != v for v in vals):
            return None
        order = sorted(range(k), key=lambda j: (-vals[j], idx[j]))
        out.append(([vals[j] for j in order], [idx[j] if ids is None else ids[idx[j]] for j in order]))
    return out


class _CausalBand:
    """Inputs of a head forward of ``p`` new pairs behind ``start`` cached ones: positions
    ``[1, p]`` (``start .. start + p - 1``) and the mask ``[1, p, start + p]`` (``j <= start + i``:
    the whole cache, then causal), as views of two buffers grown on demand. Building them took
    three tensor ops on every step's root forward, each of which costs tens of microseconds
    after a target forward."""

    ROWS = 16  # the most new pairs served from the buffers (a step queues its accepted path + 1)

    def __init__(self, device: torch.device) -> None:
        self.device, self.width = device, -1
        self.positions = self.band = torch.zeros(0, device=device)

    def causal(self, start: int, p: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(positions, mask)`` of ``p`` new pairs after ``start`` cached ones."""
        if p > self.ROWS:  # a prompt's pairs: once a generation
            return (torch.arange(start, start + p, device=self.device)[None],
                    torch.ones(1, p, start + p, dtype=torch.bool, device=self.device).tril(diagonal=start))
        if start > self.width:
            self._grow(max(2 * start, 256))
        w = self.width
        return self.positions[:, start : start + p], self.band[:, :p, w - start : w + p]

    def _grow(self, width: int) -> None:
        # band[i, c] = c <= width + i, so columns width - start .. width + p - 1 hold j <= start + i.
        self.width = width
        self.positions = torch.arange(width + self.ROWS, device=self.device)[None]
        self.band = torch.ones(1, self.ROWS, width + self.ROWS, dtype=torch.bool, device=self.device).tril(diagonal=width)


@dataclass
class _HeadJob:
    """One head forward of a row, in the head's batched shapes (so running it adds no view):
    pairs ``(feats[0, i], tokens[0, i])`` at ``positions`` ``[1, q]``, ``mask`` bool
    ``[1, q, S + q]`` over the row's cache (S rows) and the new pairs."""

    tokens: torch.Tensor
    feats: torch.Tensor
    positions: torch.Tensor
    mask: torch.Tensor
    from_target: bool


def _by_head(calls: Sequence[DraftCall], jobs: dict[int, _HeadJob]) -> list[list[int]]:
    """The jobs' call indices grouped by head instance and input kind (fused target features
    or the head's own outputs: EAGLE-3 takes them through different layers)."""
    groups: dict[tuple[int, bool], list[int]] = {}
    for i, job in jobs.items():
        groups.setdefault((id(calls[i].drafter.head), job.from_target), []).append(i)
    return list(groups.values())


def _run_packed(drafters: list[EagleDrafter], jobs: list[_HeadJob]) -> list[torch.Tensor]:
    """Every row's head forward in ONE call of their shared head, each row's cache extended as
    its own :meth:`EagleDrafter._run` extends it; returns each row's hidden rows ``[1, q, H]``."""
    if len(jobs) == 1:
        return [drafters[0]._run(jobs[0])]
    jobs = [_HeadJob(j.tokens[0], j.feats[0], j.positions[0], j.mask[0], j.from_target) for j in jobs]  # one row each
    sizes = [len(job.tokens) for job in jobs]
    lengths = [d._cache_len for d in drafters]
    width, q_max, dev = max(lengths), max(sizes), drafters[0].device
    rows = len(jobs)
    tokens = torch.zeros(rows, q_max, dtype=torch.long, device=dev)
    positions = torch.zeros(rows, q_max, dtype=torch.long, device=dev)
    feats = jobs[0].feats.new_zeros(rows, q_max, jobs[0].feats.shape[-1])
    for b, (job, q) in enumerate(zip(jobs, sizes)):
        tokens[b, :q], positions[b, :q], feats[b, :q] = job.tokens, job.positions, job.feats
        positions[b, q:] = job.positions[-1]
    visible = row_visibility(jobs, lengths, width, q_max).to(dev)  # a job's mask covers its whole cache
    past = _stacked_kv(drafters, width) if width else None
    hidden, present = drafters[0].head(tokens, feats, positions, visible, past, jobs[0].from_target)
    for b, (d, q, s) in enumerate(zip(drafters, sizes, lengths)):
        d.kv = [(torch.cat([k[b : b + 1, :, :s], k[b : b + 1, :, width : width + q]], dim=2),
                 torch.cat([v[b : b + 1, :, :s], v[b : b + 1, :, width : width + q]], dim=2)) for k, v in present]
    return [hidden[b : b + 1, :q] for b, q in enumerate(sizes)]


def _stacked_kv(drafters: list[EagleDrafter], width: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The drafters' head caches stacked per layer, each zero-padded to ``width`` rows."""
    template = next(d.kv for d in drafters if d.kv is not None)
    return [tuple(torch.cat([pad_columns(None if d.kv is None else d.kv[i][j], like, width, dim=2) for d in drafters])
                  for j, like in enumerate(pair)) for i, pair in enumerate(template)]
