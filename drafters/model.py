"""Drafter ``model``: an independent small causal LM with its own KV cache and tree attention."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from specframe.interfaces import Drafter
from specframe.options import OptionError
from specframe.pairs import check_same_tokenizer, model_source
from specframe.target import TargetModel, load_causal_lm
from specframe.tree import DraftTree


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
    """

    name = "model"
    Options = ModelDrafterOptions

    def __init__(self, options: ModelDrafterOptions, target: TargetModel) -> None:
        super().__init__(options, target)
        model = options.model
        if model is None:
            raise OptionError("option 'model' of drafter 'model' is required (a model, path or shipped name)")
        if isinstance(model, (str, bytes)) or hasattr(model, "__fspath__"):
            target_dir = model_source(target.model)
            if target_dir is not None:  # both given as paths: refuse a mismatched pair before loading
                check_same_tokenizer(target_dir, str(model))
            model = load_causal_lm(
                str(model), dtype=options.dtype or target.dtype, device=target.device,
                attn_implementation=options.attn_implementation,
            )
        self.lm = TargetModel(model)
        self.committed: list[int] = []
        self.cached = 0

    @property
    def vocab_size(self) -> int:
        """The draft model's output vocabulary size."""
        return self.lm.vocab_size

    def begin(self, prompt_ids: torch.Tensor, target_hidden: Any = None) -> None:
        """Reset the cache; the prompt is forwarded lazily with the first layer of the first tree."""
        self.lm.reset()
        self.committed = [int(t) for t in prompt_ids.tolist()]
        self.cached = 0
        self._new_step()

    def _new_step(self) -> None:
        self.slot_of: dict[int, int] = {}  # tree node -> slot index in the tree region of the cache
        # Drafted tokens after the root -> slot: policies may return a re-indexed sub-tree
        # (EAGLE / OPT-Tree re-rank with select()), so commit matches the path by tokens.
        self.slot_of_tokens: dict[tuple[int, ...], int] = {}
        self.logp_of: dict[int, torch.Tensor] = {}
        self.tree_start: int | None = None

    def _needed(self, tree: DraftTree, nodes: torch.Tensor) -> list[int]:
        """Requested nodes plus any unforwarded ancestors, in topological (index) order."""
        anc = tree.ancestor_mask()[nodes].any(dim=0)
        return [i for i in torch.nonzero(anc).flatten().tolist() if i not in self.slot_of]

    def expand(self, tree: DraftTree, nodes: torch.Tensor) -> torch.Tensor:
        """Draft log-probs after each node; one forward covers catch-up tokens and new nodes."""
        todo = self._needed(tree, nodes)
        if todo:
            self._forward(tree, todo)
        return torch.stack([self.logp_of[int(n)] for n in nodes.tolist()])

    def _forward(self, tree: DraftTree, todo: list[int]) -> None:
        dev = self.lm.device
        pending = self.committed[self.cached : len(self.committed) - 1] if self.tree_start is None else []
        if self.tree_start is None:
            self.tree_start = self.cached + len(pending)
        p, q = len(pending), len(todo)
        todo_t = torch.tensor(todo, dtype=torch.long, device=tree.device)
        tokens = torch.cat([torch.tensor(pending, dtype=torch.long), tree.tokens[todo_t].cpu()]).to(dev)
        positions = torch.cat(
            [torch.arange(self.cached, self.cached + p), tree.positions(len(self.committed))[todo_t].cpu()]
        ).to(dev)
        # Columns: forwarded tree slots of this step, then pending tokens, then the new nodes.
        slots = sorted(self.slot_of, key=self.slot_of.get)
        anc = tree.ancestor_mask().to(dev)
        mask = torch.zeros(p + q, len(slots) + p + q, dtype=torch.bool, device=dev)
        mask[:p, len(slots) : len(slots) + p] = torch.ones(p, p, dtype=torch.bool, device=dev).tril()
        mask[p:, len(slots) : len(slots) + p] = True
        if slots:
            mask[p:, : len(slots)] = anc[todo_t.to(dev)][:, torch.tensor(slots, device=dev)]
        mask[p:, len(slots) + p :] = anc[todo_t.to(dev)][:, todo_t.to(dev)]
        logits = self.lm.forward(tokens, positions, mask).logits[0, p:]
        self.cached += p
        logp = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
        all_tokens = tree.tokens.tolist()
        for j, node in enumerate(todo):
            self.slot_of_tokens[tuple(all_tokens[i] for i in tree.path_to(node)[1:])] = len(self.slot_of)
            self.slot_of[node] = len(self.slot_of)
            self.logp_of[node] = logp[j]

    def commit(self, tokens: torch.Tensor, path: torch.Tensor | None = None, target_hidden: Any = None) -> None:
        """Keep the cache entries of the accepted path that were forwarded; drop the rest."""
        if self.tree_start is not None:
            keep: list[int] = []
            emitted = [int(t) for t in tokens.tolist()]
            for depth in range(len(path) if path is not None else 0):
                slot = self.slot_of_tokens.get(tuple(emitted[:depth]))
                if slot is None:
                    break
                keep.append(slot)
            self.lm.keep(self.tree_start, torch.tensor(keep, dtype=torch.long))
            self.cached = self.tree_start + len(keep)
        self.committed += [int(t) for t in tokens.tolist()]
        self._new_step()
