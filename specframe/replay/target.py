"""ReplayTarget: the engine's target, answering every forward from a recorded greedy trace.

Under greedy verification a step's verdict depends on the target only through its argmax at
the tree's nodes, and only nodes whose root path spells the greedy continuation can be
accepted. So a node at depth d (position p) needs just one number: the continuation token at
p + 1. The replay target returns those ids, ``[1, n]``, in place of ``[1, n, V]`` logits, and
:class:`ReplayVerifier` runs the greedy verdict on them. Nodes off the continuation get the id
of their depth too; that is harmless, because a node is accepted only if all its ancestors
matched, i.e. only if it lies on the continuation. Past the recorded tokens the id is -1,
which matches nothing.

The live engine is untouched: the same ``SpecDecoder`` runs with this target and verifier.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..interfaces import Verifier
from ..target import TargetModel
from ..tree import DraftTree
from .trace import PromptTrace, Trace, TraceError

#: The id of a position past the recorded continuation: no token equals it.
NO_TOKEN = -1


@dataclass
class ReplayOutput:
    """What a replayed forward returns: ``logits`` holds next-token ids ``[1, q]`` (not scores),
    ``hidden_states`` the recorded states (None where a layer was not stored)."""

    logits: torch.Tensor | None
    hidden_states: list | None = None


class ReplayTarget(TargetModel):
    """A :class:`TargetModel` whose forwards read a :class:`Trace` instead of running the model.

    The model itself is still held (drafters read its embeddings and config; the cost curve is
    keyed by it) but never run. Call :meth:`use` with the prompt before each generation.
    """

    def __init__(self, model: Any, trace: Trace) -> None:
        super().__init__(model, preallocate=False)
        self.trace = trace
        self.replay_calls = 0
        self._by_prompt = {tuple(p.prompt): p for p in trace.prompts.values()}
        self._sequence = torch.zeros(1, dtype=torch.long)
        self._hidden: dict[int, torch.Tensor] = {}
        self.current: PromptTrace | None = None
        #: Committed tokens (root included) at the last tree forward: what the projection prices.
        self.last_context = 0

    def use(self, prompt: list[int]) -> PromptTrace:
        """Select the recorded turn whose prompt is ``prompt`` (refused when none is)."""
        found = self._by_prompt.get(tuple(prompt))
        if found is None:
            raise TraceError(f"a prompt of {len(prompt)} tokens is not in trace {self.trace.path}: the experiment's "
                             "prompts differ from the recorded ones (record the trace again)")
        if found is not self.current:
            self.current = found
            self._sequence = torch.tensor(found.prompt + found.continuation + [NO_TOKEN], dtype=torch.long,
                                          device=self.device)
            self._hidden = self.trace.hidden(found, self.device)
        return found

    # ------------------------------------------------------------------ cache bookkeeping
    def reset(self, capacity: int | None = None) -> None:
        """Start a sequence: nothing is cached (there is no cache to drop)."""
        self.cache_len = 0

    def keep(self, start: int, slots: torch.Tensor, contiguous: bool | None = None) -> None:
        """Keep ``start`` entries plus the accepted path's (only the length matters here)."""
        self.cache_len = start + int(slots.numel())

    # ------------------------------------------------------------------ forwards
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, new_mask: torch.Tensor,
                output_hidden_states: bool = False, max_position: int | None = None, **_: Any) -> ReplayOutput:
        """The recorded next tokens after ``positions`` (and their hidden states when asked)."""
        if self.current is None:
            raise TraceError("ReplayTarget: no prompt selected (call use(prompt) before generating)")
        self.replay_calls += 1
        positions = positions.to(self.device)
        self.last_context = self.cache_len + 1
        self.cache_len += int(tokens.shape[0])
        nxt = self._sequence[(positions + 1).clamp(max=len(self._sequence) - 1)]
        return ReplayOutput(nxt[None], self._hidden_rows(positions) if output_hidden_states else None)

    def _hidden_rows(self, positions: torch.Tensor) -> list:
        """The stored layers at ``positions`` (a node off the continuation gets the state of its
        depth's continuation token: only accepted nodes' rows are ever read)."""
        if not self._hidden:
            raise TraceError(f"trace {self.trace.path} holds no hidden states, but a drafter asks for them: "
                             "record the trace with that drafter in the experiment file")
        # As long as the model's own tuple (embeddings + one per layer): heads derive default
        # layer ids from its length.
        layers = max(self._text_config_layers() + 1, max(self._hidden) + 1)
        out: list = [None] * layers
        for i, h in self._hidden.items():
            out[i] = h[positions.clamp(max=len(h) - 1)][None]
        return out


    def _text_config_layers(self) -> int:
        cfg = self.model.config
        cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
        return int(getattr(cfg, "num_hidden_layers", 0) or 0)


class ReplayVerifier(Verifier):
    """Greedy verification against recorded next-token ids (what :class:`ReplayTarget` returns).

    The same verdict as ``greedy``: a node is accepted iff every node on its root path carries
    its parent's next token; the deepest accepted node's next token is the bonus.
    """

    name = "greedy"
    lossless = True
    sampling = False

    def verify(self, tree: DraftTree, target_logits: torch.Tensor,
               generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``target_logits`` is ``[n]`` next-token ids here, not scores."""
        nxt = target_logits.to(tree.device)
        match = tree.tokens == nxt[tree.parents.clamp(min=0)]
        match[0] = True
        accepted = (tree.ancestor_mask() & ~match[None, :]).sum(dim=1) == 0
        depth = torch.where(accepted, tree.depths, torch.full_like(tree.depths, -1))
        last = depth.argmax()
        # Past the recording the id is -1: any valid token will do, the engine cuts it off.
        return last, nxt[last].clamp(min=0)
