"""What a generation returns and what the engine keeps per sequence while it decodes:
:class:`GenerationOutput`, :class:`StepView` (``on_step``'s argument), :class:`Row`, and the
small functions over them the step uses."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from specframe.interfaces import TIME_FIELDS, Drafter, StepStats, TreePolicy
from specframe.tree import DraftTree


@dataclass
class GenerationOutput:
    """Result of one ``generate`` call."""

    tokens: list[int]
    steps: list[StepStats] = field(default_factory=list)
    #: Seconds from the call to its last token (the fields below and the steps' sum to it).
    wall_time: float = 0.0
    stopped_at_eos: bool = False
    #: With ``generate(score=True)``: the output's negative log-likelihood under the target (nats,
    #: summed over its tokens; the target's own distribution, no temperature), else None.
    nll: float | None = None
    #: The target's forward over the prompt (seconds).
    prefill_time: float = 0.0
    #: The call's set-up beside the prefill: checks, the KV cache's reservation, the drafter's
    #: ``begin`` (and its own prompt work) and the policy's reset.
    setup_time: float = 0.0

    @property
    def accounted_time(self) -> float:
        """Set-up, prefill and every step's fields: the generation's wall time (each step's
        clock starts where the last ended, so nothing falls between them)."""
        return self.setup_time + self.prefill_time + sum(s.total_time for s in self.steps)

    @property
    def time_to_first_token(self) -> float:
        """Seconds from the call to the end of the step that emitted the first token."""
        return self.setup_time + self.prefill_time + (self.steps[0].total_time if self.steps else 0.0)

    @property
    def target_forwards(self) -> int:
        """Verification forwards (one per step; the prefill is not counted)."""
        return len(self.steps)

    @property
    def tau(self) -> float:
        """Tokens emitted per target forward, bonus included."""
        return len(self.tokens) / max(1, len(self.steps))

    @property
    def delta(self) -> float:
        """Draft forwards per target forward."""
        return sum(s.draft_forwards for s in self.steps) / max(1, len(self.steps))


@dataclass
class StepView:
    """One verified step, as ``generate(on_step=...)`` hands it to its callback.

    Attributes:
        tree: the verified draft tree (as the policy returned it).
        path_nodes: the accepted node indices, root first, exactly as the engine read them
            (a tensor on the tree's device); ``path`` is the host list.
        stats: the step's :class:`StepStats` (the same object as in ``GenerationOutput.steps``).

    The accepted path is what the verifier accepted: on the last step, a cut at
    ``max_new_tokens`` or EOS may emit fewer of its tokens (``stats.emitted``).
    """

    tree: DraftTree
    path_nodes: torch.Tensor
    stats: StepStats
    _path: list[int] | None = field(default=None, repr=False, compare=False)

    @property
    def path(self) -> list[int]:
        """Accepted node indices, root first, as a host list. Read on first use, so a callback
        that only keeps the view adds no device read to the step (on a GPU)."""
        if self._path is None:
            self._path = [int(i) for i in self.path_nodes.tolist()]
        return self._path


@dataclass
class Row:
    """One sequence while it decodes: its own drafter, policy and generator, its committed
    tokens (prompt included) and its output so far.

    ``index``: the prompt's place in the call; ``slot``: which of the decoder's drafter/policy
    pairs it uses (a batch reuses the slots that finished rows freed).
    """

    index: int
    slot: int
    drafter: Drafter
    policy: TreePolicy
    committed: list[int]
    out: GenerationOutput
    generator: torch.Generator | None = None
    on_step: Callable[[StepView], None] | None = None
    #: Accumulate the output's negative log-likelihood (``nll_sum``, on the device) for ``out.nll``.
    score: bool = False
    nll_sum: Any = 0.0
    #: When its set-up or its last step ended (``perf_counter``): where a one-sequence
    #: generation's next step starts its clock, so the steps' fields tile its wall time.
    mark: float = 0.0


def negative_log_likelihood(logits: torch.Tensor, path: torch.Tensor, tokens: list[int], count: int) -> torch.Tensor:
    """The target's negative log-likelihood (nats, a device scalar) of the first ``count``
    emitted ``tokens`` of a step: token j follows accepted node ``path[j]``, whose logits row
    predicted it (the root's row the first token, the last node's the bonus)."""
    rows = logits[path[:count]]
    rows = rows.float() if rows.dtype.itemsize < 4 else rows  # half precision: sum in float32
    ids = torch.tensor(tokens[:count], dtype=torch.long, device=rows.device)
    return -torch.log_softmax(rows, dim=-1).gather(1, ids[:, None]).sum()


def cut_output(tokens: list[int], remaining: int, eos: set[int]) -> list[int]:
    """The tokens a row emits of its verdict: at most ``remaining``, ending at its first EOS."""
    emitted = tokens[:remaining]
    for i, tok in enumerate(emitted):
        if tok in eos:
            return emitted[: i + 1]
    return emitted


def row_share(stats: StepStats, live: int) -> StepStats:
    """What a batch-priced policy learns from: its own drafting and building, and ``1 / live``
    of the batch's forward, verification and bookkeeping (the step's cost spread over its rows,
    as its row curve spreads the forward). The recorded step keeps the whole batch's times,
    since the sequence waited for them."""
    if live == 1:
        return stats
    shared = {f: getattr(stats, f) / live for f in SHARED_FIELDS}
    return dataclasses.replace(stats, **shared)


#: The step's fields every row of a batch shares (all but its own drafting and building).
SHARED_FIELDS = tuple(name for name in TIME_FIELDS if name not in ("draft_time", "policy_time"))
