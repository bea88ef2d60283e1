"""Drafter ``model``: an independent small causal LM with its own KV cache and tree attention."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, NoReturn, Sequence

import torch

from specframe.decode.lockstep import DraftCall, RowInputs, forward_rows
from specframe.interfaces import Drafter
from specframe.options import OptionError
from specframe.models.pairs import check_same_tokenizer, model_source
from specframe.selection import topk_per_row
from specframe.models.target import TargetModel, load_causal_lm
from specframe.tree import DraftTree

#: What ``TargetModel.max_positions`` holds for a config that names no context length.
_UNBOUNDED = 1 << 30


@dataclass
class ModelDrafterOptions:
    """Options of the ``model`` drafter.

    Attributes:
        model: a transformers causal LM instance, a local path, a hub id or a shipped name
            (``demo-draft``).
        dtype: dtype to load a path with (default: the target's dtype).
        attn_implementation: ``sdpa`` or ``eager`` (only these take a tree mask).
    """

    model: Any = None
    dtype: str | None = None
    attn_implementation: str = "sdpa"


class ModelDrafter(Drafter):
    """Runs a small LM over tree nodes, one batched forward per ``expand``.

    Cache layout: committed tokens (all but the root) followed by the tree nodes forwarded in
    this step. A new node attends to the committed prefix, its forwarded ancestors and itself.

    Attributes:
        max_positions: the draft model's context length (its config's
            ``max_position_embeddings``, or ``n_positions``), None when the config gives none.
            Prompt and tree positions are 0-based, so a generation of ``prompt + max_new_tokens``
            tokens fits when that sum is at most ``max_positions``. ``begin`` and ``expand``
            raise ``ValueError`` before forwarding past it.
    """

    name = "model"
    # Drafts depend only on the committed tokens: replaying a greedy trace is exact.
    replay = "exact"
    Options = ModelDrafterOptions

    def __init__(self, options: ModelDrafterOptions, target: TargetModel) -> None:
        super().__init__(options, target)
        model = options.model
        if model is None:
            raise OptionError("option 'model' of drafter 'model' is required (a model, path or shipped name)")
        target_dir = model_source(target.model)
        if isinstance(model, (str, bytes)) or hasattr(model, "__fspath__"):
            if target_dir is not None:  # both given as paths: refuse a mismatched pair before loading
                check_same_tokenizer(target_dir, str(model))
            model = load_causal_lm(
                str(model), dtype=options.dtype or target.dtype, device=target.device,
                attn_implementation=options.attn_implementation,
            )
        elif target_dir is not None and model_source(model) is not None:
            # Loaded models (a TOML [models] alias, an API caller's instance) get the same check:
            # equal vocabulary sizes do not make equal tokenizers.
            check_same_tokenizer(target_dir, model_source(model))
        self.lm = TargetModel(model)
        self._name = _name_of(options.model, model, self.lm)
        # TargetModel reads the context length as it does for the target; it stands _UNBOUNDED
        # in for a config that gives none, which this attribute reports as None.
        self.max_positions: int | None = None if self.lm.max_positions >= _UNBOUNDED else self.lm.max_positions
        self.committed: list[int] = []
        self.cached = 0
        self._kept: tuple[torch.Tensor, dict[int, int], int] | None = None  # commit's path, until read

    def shared_options(self) -> ModelDrafterOptions:
        """These options with the loaded model itself: a batch's rows share its weights."""
        return replace(self.options, model=self.lm.model)

    @property
    def vocab_size(self) -> int:
        """The draft model's output vocabulary size."""
        return self.lm.vocab_size

    def begin(self, prompt_ids: torch.Tensor, target_hidden: Any = None) -> None:
        """Reset the cache; the prompt is forwarded lazily with the first layer of the first tree.

        Raises ``ValueError`` when the prompt is longer than the draft model's positions."""
        if self.max_positions is not None and prompt_ids.numel() > self.max_positions:
            self._refuse(int(prompt_ids.numel()), "the prompt")
        self.lm.reset()
        self.committed = [int(t) for t in prompt_ids.tolist()]
        self.cached = 0
        self._kept = None
        self._new_step()

    def _refuse(self, needed: int, what: str) -> NoReturn:
        """Refuse, in one line, to forward ``what`` (needing ``needed`` positions) past the draft
        model's context: a draft with fewer positions than the target would otherwise fail mid-run
        inside the model (a position-embedding lookup out of range, or rotary values it never saw)."""
        raise ValueError(f"draft model {self._name} has {self.max_positions} positions but "
                         f"{what} needs {needed}: use a draft with as many positions as the target, "
                         "or shorter prompts / max_new_tokens")

    def _new_step(self) -> None:
        # Tree node (index in the tree expand saw) -> slot in the tree region of the cache.
        # Policies may return a re-indexed sub-tree (EAGLE / OPT-Tree re-rank with select()):
        # commit maps the verified path back through the tree's origins().
        self.slot_of: dict[int, int] = {}
        self.logp_of: dict[int, torch.Tensor] = {}
        self.tree_start: int | None = None

    def expand(self, tree: DraftTree, nodes: torch.Tensor) -> torch.Tensor:
        """Draft log-probs after each node; one forward covers catch-up tokens and new nodes."""
        wanted, query = self._plan(tree, nodes)
        if query is not None:
            self._take(query, self.lm.forward(query.tokens, query.positions, query.mask,
                                              max_position=query.top).logits[0])
        return torch.stack([self.logp_of[node] for node in wanted])

    @classmethod
    def expand_batch(cls, calls: Sequence[DraftCall]) -> list[Any]:
        """Several rows' calls (:class:`specframe.decode.lockstep.DraftCall`, one per row, each of
        its own drafter) in ONE draft model forward for the rows that share a draft model: their
        queries packed ``[B, q_max]`` over their caches stacked (see
        :func:`specframe.decode.lockstep.forward_rows`). Each answer is what the row's own
        ``expand`` / ``expand_top`` returns, up to float rounding of the other shapes."""
        plans = [call.drafter._plan(call.tree, call.nodes) for call in calls]
        jobs = [(call.drafter, query) for call, (_, query) in zip(calls, plans) if query is not None]
        for group in _by_model(jobs):
            logits = forward_rows([drafter.lm for drafter, _ in group], [query.inputs() for _, query in group])
            for (drafter, query), rows in zip(group, logits):
                drafter._take(query, rows)
        answers = []
        for call, (wanted, _) in zip(calls, plans):
            logp = torch.stack([call.drafter.logp_of[node] for node in wanted])
            answers.append(logp if call.k is None else topk_per_row(logp, call.k))
        return answers

    def _plan(self, tree: DraftTree, nodes: torch.Tensor) -> tuple[list[int], "_Query | None"]:
        """The nodes asked for (host values) and the forward they still need (None: none)."""
        # One read of the tree per draft forward (on a GPU each read waits for the device);
        # the bookkeeping below then walks plain lists. The last step's accepted nodes, if
        # commit left them on the device, come back in the same read.
        n, m = len(tree), len(nodes)
        parts = [tree.tokens, tree.parents, tree.depths, nodes.to(tree.device)]
        if self._kept is not None:
            parts.append(self._kept[0].to(tree.device))
        host = torch.cat(parts).tolist()
        if self._kept is not None:
            self._compact(host[3 * n + m :])
        shape = _HostTree(host[:n], host[n : 2 * n], host[2 * n : 3 * n])
        wanted = host[3 * n : 3 * n + m]
        todo = [i for i in shape.closure(wanted) if i not in self.slot_of]
        return wanted, (self._query(tree, todo, shape) if todo else None)

    def _query(self, tree: DraftTree, todo: list[int], shape: "_HostTree") -> "_Query":
        """The forward of ``todo``'s nodes, after the pending catch-up tokens on the first one."""
        dev = self.lm.device
        pending = self.committed[self.cached : len(self.committed) - 1] if self.tree_start is None else []
        p, q = len(pending), len(todo)
        root_position = len(self.committed) - 1
        positions = list(range(self.cached, self.cached + p)) + [root_position + shape.depths[i] for i in todo]
        top = max(positions)  # a tree node's: catch-up tokens sit before the root
        if self.max_positions is not None and top >= self.max_positions:  # before any state changes
            self._refuse(top + 1, f"a draft tree {top - root_position} deep after {len(self.committed)} "
                         "committed tokens")
        if self.tree_start is None:
            self.tree_start = self.cached + p
        tokens = torch.tensor(pending + [shape.tokens[i] for i in todo], dtype=torch.long).to(dev)
        # Columns: forwarded tree slots of this step, then pending tokens, then the new nodes.
        slots = sorted(self.slot_of, key=self.slot_of.get)
        anc = tree.ancestor_mask().to(dev)
        todo_t = torch.tensor(todo, dtype=torch.long).to(dev)
        mask = torch.zeros(p + q, len(slots) + p + q, dtype=torch.bool, device=dev)
        mask[:p, len(slots) : len(slots) + p] = torch.ones(p, p, dtype=torch.bool, device=dev).tril()
        mask[p:, len(slots) : len(slots) + p] = True
        if slots:
            mask[p:, : len(slots)] = anc[todo_t][:, torch.tensor(slots).to(dev)]
        mask[p:, len(slots) + p :] = anc[todo_t][:, todo_t]
        return _Query(tokens, torch.tensor(positions).to(dev), mask, top, p, todo)

    def _take(self, query: "_Query", logits: torch.Tensor) -> None:
        """Record the forward's ``[p + q, V]`` logits: the new nodes' log-probs and slots."""
        logits = logits[query.pending :]
        self.cached += query.pending
        logp = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
        for j, node in enumerate(query.todo):
            self.slot_of[node] = len(self.slot_of)
            self.logp_of[node] = logp[j]

    def commit(self, tokens: torch.Tensor, path: torch.Tensor | None = None, target_hidden: Any = None,
               tree: DraftTree | None = None) -> None:
        """Keep the cache entries of the accepted path that were forwarded; drop the rest.

        The path's nodes are mapped to the nodes ``expand`` saw through ``tree.origins()``
        (without ``tree``: the path indexes that tree directly). The path stays on its device
        until the next ``expand`` reads it with the next tree, so committing reads nothing."""
        emitted = [int(t) for t in tokens.tolist()]
        self._compact()  # a step without draft forwards left the one before it pending
        if self.tree_start is not None:
            if path is None:
                nodes = torch.zeros(0, dtype=torch.long)
            elif tree is None or tree.origin is None:
                nodes = path
            else:
                nodes = tree.origin[path.to(tree.device)]
            self._kept = (nodes, self.slot_of, self.tree_start)
        self.committed += emitted
        self._new_step()

    def _compact(self, nodes: list[int] | None = None) -> None:
        """Keep the cache slots of the pending accepted nodes (``nodes``: their host values,
        else read here) up to the first node that was never forwarded."""
        if self._kept is None:
            return
        device_nodes, slot_of, start = self._kept
        self._kept = None
        keep: list[int] = []
        for node in (device_nodes.tolist() if nodes is None else nodes):
            slot = slot_of.get(node)
            if slot is None:  # not forwarded (a leaf), or added after a select (-1)
                break
            keep.append(slot)
        self.lm.keep(start, torch.tensor(keep, dtype=torch.long),
                     contiguous=keep == list(range(len(keep))))  # known here: no device read
        self.cached = start + len(keep)


def _name_of(given: Any, model: Any, lm: TargetModel) -> str:
    """How the error messages name the draft model: the path or name it was given as, else the
    directory it was loaded from, else its architecture."""
    if isinstance(given, (str, bytes)) or hasattr(given, "__fspath__"):
        return str(given)
    name = getattr(getattr(model, "config", None), "_name_or_path", None)
    return str(name) if name else lm.architecture


@dataclass
class _Query:
    """One draft forward of a row: catch-up tokens then tree nodes (``pending`` of them first)."""

    tokens: torch.Tensor
    positions: torch.Tensor
    mask: torch.Tensor
    top: int
    pending: int
    todo: list[int]

    def inputs(self) -> RowInputs:
        """As :func:`specframe.decode.lockstep.forward_rows` takes it."""
        return RowInputs(self.tokens, self.positions, self.mask, self.top)


def _by_model(jobs: list[tuple[ModelDrafter, _Query]]) -> list[list[tuple[ModelDrafter, _Query]]]:
    """The jobs grouped by draft model instance (only rows sharing weights share a forward)."""
    groups: dict[int, list[tuple[ModelDrafter, _Query]]] = {}
    for job in jobs:
        groups.setdefault(id(job[0].lm.model), []).append(job)
    return list(groups.values())


class _HostTree:
    """A host copy of a tree's tokens, parents and depths for the drafter's bookkeeping."""

    def __init__(self, tokens: list[int], parents: list[int], depths: list[int]) -> None:
        self.tokens, self.parents, self.depths = tokens, parents, depths

    def closure(self, nodes: list[int]) -> list[int]:
        """``nodes`` and all their ancestors, in topological (index) order."""
        seen: set[int] = set()
        for node in nodes:
            while node >= 0 and node not in seen:
                seen.add(node)
                node = self.parents[node]
        return sorted(seen)
