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

from specframe.interfaces import Verifier
from specframe.models.target import TargetModel
from specframe.tree import DraftTree
from specframe.replay.trace import PromptTrace, Trace, TraceError

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
            self._sequence, self._hidden = self.recorded(found)
        return found

    def recorded(self, found: PromptTrace) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """A recorded turn as the forwards read it: prompt + continuation + :data:`NO_TOKEN`,
        and its stored hidden layers."""
        sequence = torch.tensor(found.prompt + found.continuation + [NO_TOKEN], dtype=torch.long, device=self.device)
        return sequence, self.trace.hidden(found, self.device)

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
        nxt = next_ids(self._sequence, positions)
        return ReplayOutput(nxt[None], self.hidden_rows(self._hidden, positions) if output_hidden_states else None)

    def hidden_rows(self, hidden: dict[int, torch.Tensor], positions: torch.Tensor) -> list:
        """The stored layers ``hidden`` at ``positions``, ``[1, q, H]`` each (a node off the
        continuation gets the state of its depth's continuation token: only accepted nodes'
        rows are ever read)."""
        if not hidden:
            raise TraceError(f"trace {self.trace.path} holds no hidden states, but a drafter asks for them: "
                             "record the trace with that drafter in the experiment file")
        # As long as the model's own tuple (embeddings + one per layer): heads derive default
        # layer ids from its length.
        layers = max(self._text_config_layers() + 1, max(hidden) + 1)
        out: list = [None] * layers
        for i, h in hidden.items():
            out[i] = h[positions.clamp(max=len(h) - 1)][None]
        return out


    def _text_config_layers(self) -> int:
        cfg = self.model.config
        cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
        return int(getattr(cfg, "num_hidden_layers", 0) or 0)


def next_ids(sequence: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The recorded token after each of ``positions`` (:data:`NO_TOKEN` past the recording)."""
    return sequence[(positions + 1).clamp(max=len(sequence) - 1)]


class ReplayKV:
    """The batch KV layout of a replay: each row answers from its own recorded turn.

    The engine's step runs on it exactly as on a live batch layout (one "forward" for all
    rows, per-row verdicts, ``keep`` of the accepted paths), so a replayed batch takes the
    live batch's decisions. ``turns``: the recorded turns of the call's prompts; each prefill
    or join matches its prefixes (prompts without their root) to them in order. ``layout``: the
    live layout whose forward shape :attr:`shapes` records (``padded``: rows x the largest
    tree; ``flat``: all trees' nodes).
    """

    def __init__(self, target: ReplayTarget, turns: list[PromptTrace], layout: str = "padded") -> None:
        self.target = target
        self.layout = layout
        self._waiting = list(turns)
        self.lengths: list[int] = []
        self.last_rows = 0
        self._rows: list[tuple[torch.Tensor, dict[int, torch.Tensor]]] = []
        #: Per step: (rows the live forward computes, the longest context): what the projection prices.
        self.shapes: list[tuple[int, int]] = []
        #: Recorded turn (its prompt) -> the step before which it joined.
        self.joined_at: dict[tuple[int, ...], int] = {}

    @property
    def width(self) -> int:
        """The longest row's cached prefix (only its value before a forward is passed back)."""
        return max(self.lengths, default=0)

    def prefill(self, prefixes: list[torch.Tensor], hidden: bool = False, logits: bool = False) -> Any:
        """Start the rows of ``prefixes``; returns the recorded states of their prompts."""
        self.lengths, self._rows = [], []
        return self.join(prefixes, hidden, logits)

    def join(self, prefixes: list[torch.Tensor], hidden: bool = False, logits: bool = False) -> Any:
        """Add rows; returns their prompts' recorded hidden states (``[B, P, H]`` per stored
        layer) when asked, else None."""
        rows = [self._take(prefix.tolist()) for prefix in prefixes]
        self._rows += rows
        self.lengths = self.lengths + [int(p.numel()) for p in prefixes]
        if not hidden or not max(int(p.numel()) for p in prefixes):
            return None
        width = max(int(p.numel()) for p in prefixes)
        per_row = [self.target.hidden_rows(h, torch.arange(width, device=self.target.device)) for _, h in rows]
        states = [None if layer[0] is None else torch.cat(list(layer)) for layer in zip(*per_row)]
        return ReplayOutput(None, states)

    def _take(self, prefix: list[int]) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        for i, turn in enumerate(self._waiting):
            if turn.prompt[:-1] == prefix:
                self.joined_at[tuple(turn.prompt)] = len(self.shapes)
                return self.target.recorded(self._waiting.pop(i))
        raise TraceError(f"a prompt of {len(prefix) + 1} tokens is not among the recorded turns of this batch")

    def tree_forward(self, trees: list[DraftTree], hidden: bool = False) -> ReplayOutput:
        """Every row's recorded next ids at its tree's positions (and hidden states if asked)."""
        ids, states = [], []
        for tree, length, (sequence, stored) in zip(trees, self.lengths, self._rows):
            positions = tree.positions(length + 1).to(self.target.device)
            ids.append(next_ids(sequence, positions))
            states.append(self.target.hidden_rows(stored, positions) if hidden else None)
        sizes = [len(tree) for tree in trees]
        self.last_rows = sum(sizes) if self.layout == "flat" else len(sizes) * max(sizes)
        self.shapes.append((self.last_rows, max(length + 1 for length in self.lengths)))
        return ReplayOutput(ids, states)

    def rows_of(self, values: list[torch.Tensor]) -> list[torch.Tensor]:
        """Row b's next ids (the output is per row already)."""
        return values

    def hidden_rows(self, out: ReplayOutput) -> list:
        """Row b's recorded hidden layers at its tree's nodes."""
        return out.hidden_states

    def keep(self, paths: list[torch.Tensor | None], tree_start: int, contiguous: Any = None) -> None:
        """Grow each live row by its accepted path; rows whose path is None leave."""
        live = [b for b, p in enumerate(paths) if p is not None]
        self.lengths = [self.lengths[b] + int(paths[b].numel()) for b in live]
        self._rows = [self._rows[b] for b in live]


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
