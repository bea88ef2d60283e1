"""Drafter ``hydra``: Hydra's sequentially dependent heads (Ankner et al., arXiv 2402.05109).

Like Medusa's heads they read the target's hidden state ``h`` at the last accepted position (the
one that predicted the root), but head d also reads the embeddings of the tokens on the path it
continues: a node u of depth d is expanded by head d over ``concat(h, E(root), E(x_1), ..., E(u))``
(:mod:`specframe.drafters.hydra_heads`). This is the reference's proposal (zankner/Hydra
``_grounded_proposal``: head h takes the top-k children of every depth-h node, fed the
embeddings of that node's path), with the tree left to the policy: ``static`` over Medusa's and
Hydra's 63-node ``mc_sim_7b_63`` (its ``choices = "medusa_mc_sim_7b_63"``) drafts the reference's
tree, and any other policy shapes its own. A node deeper than the last head (the reference never
asks for one) gets the last head over the last K tokens of its path. Ungrounded heads
(``grounded_heads: false``) read ``h`` alone, so depth d's row is head d's as with Medusa.

Hydra++ (``prefix-mlp``) feeds every committed position's hidden state once through its prefix
layer, whose KV (one layer, over the committed positions only: tree nodes never enter it) the
drafter keeps; the heads then read that layer's output at the last accepted position instead of
``h``. The hidden states queue at ``begin``/``commit`` and go through the layer at the step's
first expansion, so the work counts as draft time.

One draft forward per expansion: each head that the expanded nodes need runs once over its
nodes (ResBlocks, then its own ``Linear(H, V)``). Replay: ``"approximate"`` (it reads hidden
states, as EAGLE and Medusa heads).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from specframe.interfaces import Drafter
from specframe.options import require
from specframe.tree import DraftTree

from .hydra_heads import HydraHeads, load_heads


@dataclass
class HydraDrafterOptions:
    """Options of the ``hydra`` drafter.

    Attributes:
        path: a checkpoint directory in Hydra's layout (``config.json`` + ``hydra_lm_head.pt``).
        allow_pickle: read a ``hydra_lm_head.pt`` that holds more than tensors (a pickle that
            can run code when read); a state dict of tensors never needs it.
        heads: a :class:`HydraHeads` instance instead of ``path`` (tests, training).
    """

    path: str | None = None
    allow_pickle: bool = False
    heads: Any = None

    def __post_init__(self) -> None:
        require((self.path is None) != (self.heads is None), "path",
                "give exactly one of path (a Hydra checkpoint directory) or heads (a HydraHeads module)")
        require(self.heads is None or isinstance(self.heads, HydraHeads), "heads",
                f"must be a HydraHeads module, got {type(self.heads).__name__}")


class HydraDrafter(Drafter):
    """Hydra heads: a depth-d node is expanded by head d over its path's embeddings (module docstring)."""

    name = "hydra"
    Options = HydraDrafterOptions
    needs_target_hidden = True
    replay = "approximate"

    def __init__(self, options: HydraDrafterOptions, target: Any) -> None:
        super().__init__(options, target)
        model = getattr(target, "model", target)
        config = model.config.get_text_config()
        heads = options.heads or load_heads(options.path, config, self.vocab_size, options.allow_pickle)
        require(heads.hidden == int(config.hidden_size) and heads.vocab == self.vocab_size, "heads",
                f"are sized hidden {heads.hidden}, vocabulary {heads.vocab}; the target has "
                f"{config.hidden_size}, {self.vocab_size}")
        self.device = getattr(target, "device", torch.device("cpu"))
        self.dtype = next(model.parameters()).dtype
        self.heads: HydraHeads = heads.to(device=self.device, dtype=self.dtype).eval()
        self.embed = model.get_input_embeddings()
        self.begin(torch.zeros(1, dtype=torch.long))

    def shared_options(self) -> HydraDrafterOptions:
        """Batch rows share the loaded heads (each row keeps its own prefix KV)."""
        return HydraDrafterOptions(heads=self.heads)

    # ------------------------------------------------------------------ state
    def begin(self, prompt_ids: torch.Tensor, target_hidden: Any = None) -> None:
        """Queue the prefill's hidden states (the last one predicted the first root); a
        one-token prompt has none, and its first step drafts from zeros."""
        hidden = self.heads.hidden
        self.state = torch.zeros(hidden, dtype=self.dtype, device=self.device)
        self.pending = torch.zeros(0, hidden, dtype=self.dtype, device=self.device)
        self.fed = 0  # positions in the prefix layer's KV
        self.cache = self._new_cache() if self.heads.has_prefix else None
        if target_hidden is not None and target_hidden[-1] is not None and target_hidden[-1].shape[-2] > 0:
            self._queue(self._layer(target_hidden)[0])

    def commit(self, tokens: torch.Tensor, path: torch.Tensor | None = None, target_hidden: Any = None,
               tree: DraftTree | None = None) -> None:
        """Queue the hidden states of the verified root and accepted nodes (the last predicted
        the bonus, the next root)."""
        if target_hidden is not None and path is not None:
            self._queue(self._layer(target_hidden)[0, path.to(self.device)])

    def _layer(self, target_hidden: Any) -> torch.Tensor:
        """The hidden-state layer the heads read (``hidden_state_offset`` before the last)."""
        return target_hidden[-(self.heads.hidden_state_offset + 1)]

    def _queue(self, rows: torch.Tensor) -> None:
        rows = rows.to(self.pending)
        # Plain heads read only the last row; Hydra++ feeds every row to its prefix layer.
        self.pending = torch.cat([self.pending, rows]) if self.heads.has_prefix else rows[-1:]

    def _new_cache(self) -> Any:
        from transformers import DynamicCache

        return DynamicCache(config=self.heads.prefix_embeding_layer.config)

    def _current_state(self) -> torch.Tensor:
        """The heads' input at the last accepted position, the queued rows fed first."""
        if len(self.pending):
            if self.heads.has_prefix:
                positions = torch.arange(self.fed, self.fed + len(self.pending), device=self.device)
                out = self.heads.prefix(self.pending, positions, self.cache)
                self.fed += len(self.pending)
                self.state = out[-1]
            else:
                self.state = self.pending[-1]
            self.pending = self.pending[:0]
        return self.state

    # ------------------------------------------------------------------ drafting
    @torch.inference_mode()
    def expand(self, tree: DraftTree, nodes: torch.Tensor) -> torch.Tensor:
        """Each node's log-probs from the head of its depth (the last head past the deepest),
        each head run once over its nodes."""
        state = self._current_state()
        nodes = torch.as_tensor(nodes, device=tree.device).flatten()
        if len(nodes) == 0:
            return torch.zeros(0, self.vocab_size, dtype=torch.promote_types(self.dtype, torch.float32),
                               device=tree.device)
        last = len(self.heads) - 1
        which = tree.depths[nodes].clamp(max=last).tolist()  # the drafter's one host read
        groups: dict[int, list[int]] = {}
        for row, head in enumerate(which):
            groups.setdefault(head, []).append(row)
        out: torch.Tensor | None = None
        for head, rows in sorted(groups.items()):
            index = torch.tensor(rows, dtype=torch.long, device=tree.device)
            logp = self._head_rows(tree, nodes[index], head, state)
            if out is None:
                out = logp.new_empty(len(nodes), logp.shape[-1])
            out[index.to(logp.device)] = logp
        return out.to(tree.device)

    def _head_rows(self, tree: DraftTree, nodes: torch.Tensor, head: int, state: torch.Tensor) -> torch.Tensor:
        """Head ``head``'s log-probs at ``nodes``: its input is the state and the embeddings of
        the last ``width`` tokens of each node's path, oldest first."""
        parts = [state.expand(len(nodes), -1)]
        width = self.heads.width(head)
        if width:
            tokens, at = [], nodes
            for _ in range(width):  # walk up: the node's token, its parent's, ...
                tokens.append(tree.tokens[at])
                at = tree.parents[at].clamp(min=0)
            path = torch.stack(tokens[::-1], dim=1).to(self.device)        # [n, width]
            parts.append(self.embed(path).to(self.dtype).flatten(1))         # [n, width * H]
        logits = self.heads.head_logits(head, torch.cat(parts, dim=-1))
        return torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
