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
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from specframe.interfaces import Drafter
from specframe.options import OptionError, require
from specframe.packed_linear import linear_kernel, pack_linears
from specframe.target import TargetModel
from specframe.tree import DraftTree

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
            # (packed_linears): its forwards are tree layers of a few tokens too. A head passed
            # in stays as it is (it is the caller's object).
            kernel = linear_kernel(target.model)
            if kernel is not None:
                pack_linears(head, kernel)
        self.head: EagleHead = head.eval()
        self.device = target.device
        self.begin(torch.zeros(1, dtype=torch.long))

    # ------------------------------------------------------------------ state
    def begin(self, prompt_ids: torch.Tensor, target_hidden: Any = None) -> None:
        """Reset; queue the prompt's pairs (f_t, x_{t+1}), forwarded with the first expand."""
        self.num_committed = len(prompt_ids)
        self.kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self.cached = 0  # committed pairs in the head cache (pair t sits at position t)
        width = self.head.config.feature_size
        self.pending_feats = torch.zeros(0, width, dtype=self.head.fc.weight.dtype, device=self.device)
        self.pending_tokens = torch.zeros(0, dtype=torch.long, device=self.device)
        if target_hidden is not None:
            self._queue(self.head.features(target_hidden)[0], prompt_ids[1:])
        self._new_step()

    @torch.inference_mode()
    def _queue(self, feats: torch.Tensor, tokens: torch.Tensor) -> None:
        n = min(len(feats), len(tokens))
        feats = feats[:n].to(self.device, self.pending_feats.dtype)
        self.pending_feats = torch.cat([self.pending_feats, feats])
        self.pending_tokens = torch.cat([self.pending_tokens, tokens[:n].to(self.device, torch.long)])

    def _new_step(self) -> None:
        self.out_of: dict[int, torch.Tensor] = {}   # tree node -> head output feature
        self.logp_of: dict[int, torch.Tensor] = {}  # tree node -> target-vocab log-probs
        self.slots: list[int] = []                  # tree nodes in cache order after the committed pairs

    # ------------------------------------------------------------------ drafting
    def expand(self, tree: DraftTree, nodes: torch.Tensor) -> torch.Tensor:
        """Log-probs ``[len(nodes), V]`` after each node: one head forward per missing tree layer.

        Policies expand a layer whose parents were expanded before, so this is one forward.
        """
        with torch.inference_mode():
            if 0 not in self.logp_of:
                self._forward_root()
            anc = tree.ancestor_mask()[nodes].any(dim=0)
            missing = [i for i in torch.nonzero(anc).flatten().tolist() if i not in self.logp_of]
            depths = tree.depths.tolist()
            for depth in sorted({depths[i] for i in missing}):
                self._forward_nodes(tree, [i for i in missing if depths[i] == depth])
            return torch.stack([self.logp_of[int(n)] for n in nodes.tolist()])

    def _uniform(self) -> torch.Tensor:
        cfg = self.head.config
        logp = torch.full((1, cfg.draft_vocab_size), -math.log(cfg.draft_vocab_size),
                          dtype=torch.promote_types(self.pending_feats.dtype, torch.float32), device=self.device)
        return self.head.target_logp(logp)[0]

    def _forward_root(self) -> None:
        """Forward the queued committed pairs; the last one (f_{L-2}, root) drafts the root's children."""
        p = len(self.pending_tokens)
        if p == 0:
            # A one-token prompt: the target has produced no feature yet, so nothing to draft from.
            self.logp_of[0] = self._uniform()
            return
        start = self.cached
        positions = torch.arange(start, start + p, device=self.device)
        mask = torch.ones(p, start + p, dtype=torch.bool, device=self.device)
        mask[:, start:] = torch.ones(p, p, dtype=torch.bool, device=self.device).tril()
        hidden = self._run(self.pending_tokens, self.pending_feats, positions, mask, from_target=True)
        self.cached += p
        self.pending_feats = self.pending_feats[:0]
        self.pending_tokens = self.pending_tokens[:0]
        self.out_of[0] = hidden[-1]
        self.logp_of[0] = self.head.target_logp(self.head.logits(hidden[-1:]))[0]

    def _forward_nodes(self, tree: DraftTree, todo: list[int]) -> None:
        """One batched forward of tree nodes whose parents have head outputs."""
        if 0 not in self.out_of:  # no features at all (one-token prompt): stay uninformed
            for node in todo:
                self.logp_of[node] = self._uniform()
            return
        idx = torch.tensor(todo, dtype=torch.long, device=tree.device)
        parents = tree.parents[idx].tolist()
        missing = [p for p in parents if p not in self.out_of]
        if missing:
            raise RuntimeError(f"EAGLE drafter: node {missing[0]}'s parent was never expanded")
        feats = torch.stack([self.out_of[p] for p in parents])
        positions = (self.cached - 1 + tree.depths[idx]).to(self.device)
        anc = tree.ancestor_mask()[idx].to(self.device)
        q, s = len(todo), len(self.slots)
        mask = torch.ones(q, self.cached + s + q, dtype=torch.bool, device=self.device)
        if s:
            mask[:, self.cached : self.cached + s] = anc[:, torch.tensor(self.slots, device=self.device)]
        mask[:, self.cached + s :] = anc[:, idx.to(self.device)]
        hidden = self._run(tree.tokens[idx].to(self.device), feats, positions, mask, from_target=False)
        logp = self.head.target_logp(self.head.logits(hidden))
        for j, node in enumerate(todo):
            self.out_of[node] = hidden[j]
            self.logp_of[node] = logp[j]
        self.slots += todo

    def _run(self, tokens: torch.Tensor, feats: torch.Tensor, positions: torch.Tensor,
             mask: torch.Tensor, from_target: bool) -> torch.Tensor:
        hidden, self.kv = self.head(tokens[None], feats[None], positions[None], mask[None], self.kv, from_target)
        return hidden[0]

    # ------------------------------------------------------------------ commit
    @torch.inference_mode()
    def commit(self, tokens: torch.Tensor, path: torch.Tensor | None = None, target_hidden: Any = None,
               tree: DraftTree | None = None) -> None:
        """Drop this step's tree entries (so a re-indexed ``tree`` needs no mapping); queue (target feature of each path node, next token).

        The accepted path (root first) and the emitted tokens (accepted + bonus) give pairs
        (f_root, t_1), (f_{a_1}, t_2), ..., (f_{a_k}, bonus): exactly the next committed pairs.
        """
        if self.kv is not None:
            self.kv = [(k[:, :, : self.cached], v[:, :, : self.cached]) for k, v in self.kv]
        if target_hidden is not None and path is not None:
            self._queue(self.head.features(target_hidden, path.to(torch.long))[0], tokens)
        self.num_committed += len(tokens)
        self._new_step()
