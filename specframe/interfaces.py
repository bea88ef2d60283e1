"""The three plugin interfaces: Drafter, TreePolicy, Verifier.

Each plugin class sets a ``name`` and an ``Options`` dataclass and implements one abstract
method where possible. The engine talks to plugins only through these classes.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from .options import NoOptions
from .tree import DraftTree

if TYPE_CHECKING:
    from .target import TargetModel


class Drafter(ABC):
    """Proposes next-token distributions at draft-tree nodes.

    Life cycle per generation: ``begin(prompt)``, then per step any number of
    ``expand(tree, nodes)`` calls (each ONE batched draft forward honouring tree attention),
    then ``commit(...)`` with what the verifier accepted.
    """

    name: ClassVar[str] = ""
    Options: ClassVar[type] = NoOptions
    #: Feature-level drafters (EAGLE) set this: the engine then passes the target's hidden
    #: states (the ``hidden_states`` tuple of the transformers output) to ``begin``/``commit``.
    needs_target_hidden: ClassVar[bool] = False

    def __init__(self, options: Any, target: "TargetModel") -> None:
        self.options = options
        self.target = target

    @property
    def vocab_size(self) -> int:
        """Size of the distributions ``expand`` returns (must equal the target's)."""
        return self.target.vocab_size

    def begin(self, prompt_ids: torch.Tensor, target_hidden: Any = None) -> None:
        """Start a new generation from ``prompt_ids`` (``[L]`` long tensor); drop old state.

        ``target_hidden``: for drafters with ``needs_target_hidden``, the target's hidden states
        of the prefill over ``prompt_ids[:-1]`` (None when the prompt is a single token).
        """

    @abstractmethod
    def expand(self, tree: DraftTree, nodes: torch.Tensor) -> torch.Tensor:
        """Log-probabilities ``[len(nodes), V]`` of the next token after each given node.

        The context of node u is the committed sequence (ending in the root) followed by the
        path root -> u. Nodes are expanded after their parents (layer by layer).
        """

    def commit(
        self,
        tokens: torch.Tensor,
        path: torch.Tensor | None = None,
        target_hidden: torch.Tensor | None = None,
    ) -> None:
        """Record newly committed ``tokens`` (accepted drafted tokens + bonus token).

        ``path`` holds the accepted node indices of the last tree (root first) so a drafter can
        keep the cache entries it already computed; ``target_hidden`` carries the target's
        hidden states of the whole verified tree (index them with ``path``) for drafters with
        ``needs_target_hidden``.
        """


class DraftSession:
    """What a policy sees while building one tree: the drafter, the root, a forward counter.

    ``generator``: the engine's per-call randomness (``generate(seed=...)``) for policies that
    sample children; None lets such a policy use its own generator or torch's global one.
    ``context_len``: committed tokens, root included (None when unknown); hardware-aware
    policies price a tree at this context length.
    """

    def __init__(
        self, drafter: Drafter, root_token: int, device: torch.device,
        generator: torch.Generator | None = None, context_len: int | None = None,
    ) -> None:
        self.drafter = drafter
        self.root_token = int(root_token)
        self.device = device
        self.generator = generator
        self.context_len = context_len
        self.draft_forwards = 0
        self.draft_time = 0.0

    @property
    def vocab_size(self) -> int:
        """Vocabulary size of the draft distributions."""
        return self.drafter.vocab_size

    def new_tree(self) -> DraftTree:
        """A root-only tree for this step."""
        return DraftTree.root(self.root_token, device=self.device)

    def expand(self, tree: DraftTree, nodes: torch.Tensor | list[int]) -> torch.Tensor:
        """Draft log-probs ``[len(nodes), V]`` for ``nodes`` of ``tree``: one draft forward."""
        nodes = torch.as_tensor(nodes, dtype=torch.long, device=tree.device)
        start = time.perf_counter()
        logp = self.drafter.expand(tree, nodes)
        self.draft_time += time.perf_counter() - start
        self.draft_forwards += 1
        return logp


class TreePolicy(ABC):
    """Decides the draft tree's shape: which nodes to expand and which children to keep."""

    name: ClassVar[str] = ""
    Options: ClassVar[type] = NoOptions

    def __init__(self, options: Any) -> None:
        self.options = options

    @property
    def budget(self) -> int:
        """Largest tree (root included) this policy may return; the engine enforces it."""
        return int(getattr(self.options, "budget"))

    def reset(self) -> None:
        """Forget adaptive state at the start of a generation."""

    def attach(self, target: "TargetModel") -> None:
        """Called once by the decoder with its target; hardware-aware policies read the
        target's cost curve here (:mod:`specframe.profile`). Default: nothing."""

    @abstractmethod
    def build(self, session: DraftSession, budget: int) -> DraftTree:
        """Build one draft tree of at most ``min(budget, self.budget)`` nodes."""

    def observe(self, step: "StepStats") -> None:
        """Called after each verification with that step's statistics (adaptive policies)."""


@dataclass
class Verdict:
    """Outcome of verifying one tree: accepted node indices (root first) and the bonus token."""

    accepted_path: torch.Tensor
    bonus_token: int

    @classmethod
    def from_leaf(cls, tree: DraftTree, last: torch.Tensor, bonus: torch.Tensor) -> "Verdict":
        """The verdict whose path runs from the root to node ``last`` (reads back to the host)."""
        path = torch.nonzero(tree.ancestor_mask()[int(last)]).flatten()  # topological = root..last
        return cls(accepted_path=path, bonus_token=int(bonus))


class Verifier(ABC):
    """Decides which drafted path the target accepts and which token it adds."""

    name: ClassVar[str] = ""
    Options: ClassVar[type] = NoOptions
    lossless: ClassVar[bool] = True
    sampling: ClassVar[bool] = False

    def __init__(self, options: Any) -> None:
        self.options = options

    @abstractmethod
    def verify(
        self, tree: DraftTree, target_logits: torch.Tensor, generator: torch.Generator | None
    ) -> Verdict:
        """Verify ``tree`` given target logits ``[n, V]`` at every node (row i predicts i's child)."""

    def accept_leaf(
        self, tree: DraftTree, target_logits: torch.Tensor, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The same decision as :meth:`verify`, as two 0-dim tensors on the tree's device:
        the deepest accepted node and the bonus token.

        The engine's fast path calls this so that the accepted path, its tokens and the bonus
        reach the host in one read per step. This default goes through :meth:`verify` (which
        reads back on its own); a verifier that can decide on the device overrides it and
        derives ``verify`` from it, as the built-ins do.
        """
        verdict = self.verify(tree, target_logits, generator)
        last = verdict.accepted_path[-1].to(tree.device)
        return last, torch.tensor(verdict.bonus_token, device=tree.device)


@dataclass
class StepStats:
    """Per-step record: tree shape, acceptance and where the time went (seconds)."""

    tree_size: int
    depth: int
    accepted: int
    emitted: int
    draft_forwards: int
    draft_time: float
    policy_time: float
    target_time: float
    verify_time: float
    other_time: float
    widths: list[int]
    accepted_ranks: list[int]
    #: Nodes the context took off the policy's budget this step (0: the full budget was
    #: available). Near the target's maximum length the engine passes a smaller limit.
    budget_cut: int = 0

    @property
    def total_time(self) -> float:
        """Whole step wall time."""
        return self.draft_time + self.policy_time + self.target_time + self.verify_time + self.other_time
