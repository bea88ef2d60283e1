"""The three plugin interfaces: Drafter, TreePolicy, Verifier.

Each plugin class sets a ``name`` and an ``Options`` dataclass and implements one abstract
method where possible. The engine talks to plugins only through these classes.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Sequence

import torch

from specframe.options import BudgetOptions, NoOptions
from specframe.tree import DRAFTING_MODES, DraftTree, HostLists

if TYPE_CHECKING:
    from specframe.models.target import TargetModel


class Drafter(ABC):
    """Proposes next-token distributions at draft-tree nodes.

    Life cycle per generation: ``begin(prompt)``, then per step any number of
    ``expand(tree, nodes)`` calls (each ONE batched draft forward honouring tree attention),
    then ``commit(...)`` with what the verifier accepted. ``commit`` follows every verified
    step, the generation's last one included (there the target's cache is not compacted, and
    ``tokens`` is the verifier's whole decision even where ``max_new_tokens`` or EOS cut what
    the generation emits), so a drafter that learns from verifications sees them all.

    The two ``needs_*`` flags are read from the instance, so a drafter may set them per
    instance in ``__init__`` (e.g. from an option, or as the union of the drafters it wraps).
    """

    name: ClassVar[str] = ""
    Options: ClassVar[type] = NoOptions
    #: Feature-level drafters (EAGLE) set this: the engine then passes the target's hidden
    #: states (the ``hidden_states`` tuple of the transformers output) to ``begin``/``commit``.
    needs_target_hidden: ClassVar[bool] = False
    #: True for a drafter that keeps state across generations on purpose (Token Recycling's
    #: hot-start table): ``begin`` then does not drop everything, so a second generation may
    #: build other trees than the first (never other tokens: verification keeps them lossless).
    #: May be set per instance (a cold-start option sets it False). The conformance suite then
    #: checks that a fresh instance reproduces a fresh run instead of requiring ``begin`` to
    #: forget (docs/conformance.md).
    persistent_state: ClassVar[bool] = False
    #: True for a drafter whose later drafts depend on which of its proposals the target
    #: accepted, rejected nodes included (the hybrid's per-part calibration): no fresh drafter
    #: fed only the committed tokens can repeat its rows, so the conformance suite's honesty
    #: test compares it with a copy of itself as each step began. Implied by
    #: ``needs_target_logits``. May be set per instance.
    learns_from_verdicts: ClassVar[bool] = False
    #: Whether replaying a recorded greedy target trace (:mod:`specframe.replay`) reproduces
    #: this drafter's live run: ``"exact"`` (drafts depend only on committed tokens),
    #: ``"approximate"`` (e.g. EAGLE heads fed hidden states of a full forward, equal to the
    #: tree forward's up to the last bits) or ``"unsupported"`` (needs the target at off-path
    #: tree nodes). None = undeclared: replay refuses the drafter. May be a property on the
    #: instance (a composite takes its weakest part). See docs/replay.md.
    replay: ClassVar[str | None] = None
    #: True for a drafter whose trees depend on measured time (the cascade's ``"auto"`` gate):
    #: it reads :attr:`specframe.clock.wall_clock` unless :meth:`set_clock` gives it another,
    #: and the conformance suite gives it a :class:`specframe.clock.TickClock` so that two
    #: instances fed the same calls decide alike. May be set per instance.
    uses_clock: ClassVar[bool] = False
    #: Drafters that learn from the target's predictions (Token Recycling) set this: the engine
    #: then passes ``target_logits=`` to ``begin`` (the prefill's ``[L-1, V]`` logits over
    #: ``prompt_ids[:-1]``, None for a one-token prompt) and to ``commit`` (the ``[len(tree), V]``
    #: tensor the verifier saw: the same object, on the target's device, never copied or read
    #: back). Only to drafters that set it, so other drafters' signatures need no such keyword.
    needs_target_logits: ClassVar[bool] = False
    #: With ``needs_target_logits``: whether ``begin`` reads the prefill's logits. False spares
    #: the prefill the lm_head over every prompt position (tens of ms for a few hundred prompt
    #: tokens on a CPU) and ``begin`` gets ``target_logits=None``; ``commit`` is unchanged.
    #: May be set on the instance (from an option).
    needs_prompt_logits: ClassVar[bool] = True
    #: Optional: a classmethod ``expand_batch(calls)`` that answers several rows' draft calls of
    #: one layer at once in a batch (docs/batching.md, "Batched drafting"). ``calls`` is a list of
    #: :class:`specframe.decode.lockstep.DraftCall` (``drafter``, ``tree``, ``nodes``, ``k``), one per
    #: row, each drafter an instance of this class; it returns one answer per call, equal (up to
    #: float rounding) to ``drafter.expand(tree, nodes)`` when ``k`` is None, else to
    #: ``drafter.expand_top(tree, nodes, k)``. None (default): each row's drafter is called alone.
    expand_batch: ClassVar[Any] = None
    #: The most side rows :meth:`side_rows` ever returns (it sizes the cache a generation
    #: reserves); 0 (default): the drafter adds none and :meth:`side_rows` is never called.
    #: A drafter that sets it also takes ``side=`` in ``commit`` (:class:`SideOutput`,
    #: or None on a step it added none). May be set on the instance (from an option).
    max_side_rows: ClassVar[int] = 0

    def __init__(self, options: Any, target: "TargetModel") -> None:
        self.options = options
        self.target = target

    @property
    def vocab_size(self) -> int:
        """Size of the distributions ``expand`` returns (must equal the target's)."""
        return self.target.vocab_size

    def shared_options(self) -> Any:
        """Options that build another drafter like this one, for another sequence of a batch,
        sharing what is heavy and read-only: a draft model's or head's weights, loaded once,
        so that the rows' drafters can answer one batched call (:attr:`expand_batch`). The
        default, this drafter's own options, rebuilds everything from them."""
        return self.options

    def begin(self, prompt_ids: torch.Tensor, target_hidden: Any = None) -> None:
        """Start a new generation from ``prompt_ids`` (``[L]`` long tensor); drop old state.

        ``target_hidden``: for drafters with ``needs_target_hidden``, the target's hidden states
        of the prefill over ``prompt_ids[:-1]`` (None when the prompt is a single token).
        A drafter with ``needs_target_logits`` also takes ``target_logits=``: the prefill's
        logits ``[L-1, V]`` (row i: the target's prediction after ``prompt_ids[i]``), or None.
        """

    @abstractmethod
    def expand(self, tree: DraftTree, nodes: torch.Tensor) -> torch.Tensor:
        """Log-probabilities ``[len(nodes), V]`` of the next token after each given node.

        The context of node u is the committed sequence (ending in the root) followed by the
        path root -> u. Nodes are expanded after their parents (layer by layer).
        """

    def expand_top(self, tree: DraftTree, nodes: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The top ``k`` children of each node, as :func:`specframe.topk_per_row` returns them
        (``values, token_ids, ranks``, each ``[len(nodes), min(k, V)]``) for the rows of
        :meth:`expand`; one draft forward, like ``expand``.

        Policies that keep only each row's top children call this (through
        :meth:`DraftSession.expand_top`). Override it only to skip the dense rows: a drafter
        with a handful of candidates per row (the n-gram lookup) builds the top-k straight from
        them, where a ``[nodes, V]`` block and a selection over it cost more than the lookup.
        An override must return exactly what this default returns (ties included); the
        conformance suite checks it.
        """
        from specframe.selection import topk_per_row

        return topk_per_row(self.expand(tree, nodes), k)

    def commit(
        self,
        tokens: torch.Tensor,
        path: torch.Tensor | None = None,
        target_hidden: torch.Tensor | None = None,
        tree: DraftTree | None = None,
    ) -> None:
        """Record newly committed ``tokens`` (accepted drafted tokens + bonus token).

        ``path`` holds the accepted node indices of the verified tree (root first) so a
        drafter can keep the cache entries it already computed; ``target_hidden`` carries the
        target's hidden states of the whole verified tree (index them with ``path``) for
        drafters with ``needs_target_hidden``. ``tree`` is the verified tree itself: a policy
        may have re-indexed the tree ``expand`` saw with :meth:`DraftTree.select`, and
        ``tree.origins()[path]`` gives the accepted nodes' indices in that tree.
        A drafter with ``needs_target_logits`` also takes ``target_logits=``: the verifier's
        ``[len(tree), V]`` logits (row i: the target's prediction after node i), on the device.
        """

    def side_rows(self, context_len: int, max_position: int) -> "SideRows | None":
        """Tokens to add to this step's target forward beside the draft tree, or None (docs/hooks.md,
        "Side rows"). Called once per step, after the policy built the tree, on drafters with
        ``max_side_rows``; ``context_len``: committed tokens, root included (the root sits at
        position ``context_len - 1``); ``max_position``: the largest position the target holds.
        The target's outputs at the rows come back with the verdict: ``commit(..., side=...)``.
        Side rows are never verified, committed or counted as accepted.
        """
        return None

    def set_clock(self, clock: Callable[[], float]) -> None:
        """Read ``clock`` (seconds) instead of the wall clock from now on. Only drafters with
        ``uses_clock`` read one; the default ignores it."""

    def finish(self, output_ids: torch.Tensor) -> None:
        """A generation ended: ``output_ids`` (``[T]`` long, on the CPU) are exactly the tokens
        it emitted, cut at ``max_new_tokens`` and at EOS as the caller received them (the last
        ``commit`` may have carried more). A drafter that learns across requests
        (``persistent_state``) keeps what it learns from here; the default does nothing."""


def wants_prompt_logits(drafter: Drafter) -> bool:
    """Whether the prefill must compute logits at every prompt position for ``drafter``'s
    ``begin`` (``needs_target_logits`` and ``needs_prompt_logits``, on its class or instance)."""
    return bool(getattr(drafter, "needs_target_logits", False) and getattr(drafter, "needs_prompt_logits", True))


def logits_keyword(drafter: Drafter, logits: torch.Tensor | None) -> dict[str, Any]:
    """``{"target_logits": logits}`` for a drafter that declares ``needs_target_logits`` (on its
    class or the instance), else ``{}``: the ``begin``/``commit`` of the others may not take it."""
    return {"target_logits": logits} if getattr(drafter, "needs_target_logits", False) else {}


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
        return self._forward(self.drafter.expand, tree, nodes)

    def expand_top(self, tree: DraftTree, nodes: torch.Tensor | list[int], k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The top ``k`` children of each of ``nodes``: ``(values, token_ids, ranks)`` of
        :func:`specframe.topk_per_row` over the rows :meth:`expand` would give, in one draft
        forward (:meth:`Drafter.expand_top`; the selection counts as draft time)."""
        return self._forward(self.drafter.expand_top, tree, nodes, k)

    def expand_top_lists(self, tree: DraftTree, nodes: list[int],
                         k: int) -> tuple[list[tuple[list[float], list[int], list[int]]], torch.dtype]:
        """:meth:`expand_top` as host lists, one ``(values, token_ids, ranks)`` per node, and the
        values' dtype: for a policy that grows its tree on the host (the CPU). A drafter that
        drafts on the host answers through its ``top_lists(tree, nodes, k)`` (ranked float32
        ``(values, token_ids)`` per node, ranks 0..k-1) without making tensors; any other's
        ``expand_top`` is read back, as is the answer of a session that answers ``expand_top``
        its own way (the lockstep session batches it with the other rows'). One draft forward
        either way."""
        own = getattr(self.drafter, "top_lists", None)
        if own is None or type(self).expand_top is not DraftSession.expand_top:
            values, tokens, ranks = self.expand_top(tree, nodes, k)
            return list(zip(values.tolist(), tokens.tolist(), ranks.tolist())), values.dtype
        rows = self._timed(own, tree, nodes, k)
        return [(values, tokens, list(range(len(tokens)))) for values, tokens in rows], torch.float32

    def _forward(self, call: Any, tree: DraftTree, nodes: torch.Tensor | list[int], *args: Any) -> Any:
        """``call(tree, nodes, *args)`` with ``nodes`` as a long tensor on the tree's device,
        timed and counted as one draft forward."""
        return self._timed(call, tree, torch.as_tensor(nodes, dtype=torch.long, device=tree.device), *args)

    def _timed(self, call: Any, *args: Any) -> Any:
        """``call(*args)``, timed and counted as one draft forward."""
        start = time.perf_counter()
        out = call(*args)
        self.draft_time += time.perf_counter() - start
        self.draft_forwards += 1
        return out


class TreePolicy(ABC):
    """Decides the draft tree's shape: which nodes to expand and which children to keep."""

    name: ClassVar[str] = ""
    Options: ClassVar[type] = NoOptions

    def __init__(self, options: Any) -> None:
        self.options = options

    @property
    def max_budget(self) -> int:
        """The largest tree (root included) this policy ever builds.

        The engine passes ``build`` the smaller of this and the room left in the target's
        context, and sizes per-generation buffers by it. By default it is ``options.budget``
        of a policy whose ``Options`` inherit :class:`~specframe.options.BudgetOptions`;
        a policy sized otherwise (a fixed shape, a chain length) overrides this property.
        """
        if isinstance(self.options, BudgetOptions):
            return int(self.options.budget)
        raise TypeError(
            f"policy {self.name!r}: its Options ({type(self.options).__name__}) do not inherit "
            "specframe.BudgetOptions, so its largest tree is unknown: inherit BudgetOptions "
            "(a 'budget' option) or override the max_budget property"
        )

    def fixed_shape(self) -> tuple[tuple[int, ...], ...] | None:
        """The rank paths of the tree this policy drafts when its shape is fixed before decoding
        (a serving engine's static tree then serves it as it is); None, the default, for a tree
        that depends on each step (an export fits a static tree to measured acceptance)."""
        return None

    def reset(self) -> None:
        """Forget adaptive state at the start of a generation."""

    def attach(self, target: "TargetModel") -> None:
        """Called once by the decoder with its target; hardware-aware policies read the
        target's cost curve here (:mod:`specframe.sizing.profile`). Default: nothing."""

    @property
    def wants_batch_curve(self) -> bool:
        """Whether :meth:`price_batch` should be called: the batched decoder measures (once,
        then cached) the target's cost curve at the batch shape only for policies that ask."""
        return False

    def price_batch(self, curve: Any) -> None:
        """Called by the batched decoder (:mod:`specframe.decode.batch`), when this policy asks
        (:attr:`wants_batch_curve`), before the first step and whenever the live batch changes
        size: ``curve`` (a :class:`~specframe.sizing.profile.CostCurve`) is what ONE row pays of a
        packed forward at that batch size (:meth:`specframe.decode.batch_curves.BatchCurves.row_curve`),
        and the one-row curve again when the batch ends. Default: nothing."""

    @abstractmethod
    def build(self, session: DraftSession, budget: int) -> DraftTree:
        """Build one draft tree of at most ``budget`` nodes, root included.

        The engine passes ``budget = min(self.max_budget, room left in the context)``, so a
        policy never takes that minimum itself; a larger tree is an ``EngineError``.
        """

    def observe(self, step: "StepStats") -> None:
        """Called after each verification with that step's statistics (adaptive policies)."""


class Verifier(ABC):
    """Decides which drafted path the target accepts and which token it adds.

    A verifier implements one method, :meth:`verify`. Class attributes: ``lossless`` (the
    output is distributed exactly as the target's own decoding) and ``sampling`` (it samples,
    so ``generate(temperature=...)`` may override its ``temperature`` option).
    """

    name: ClassVar[str] = ""
    Options: ClassVar[type] = NoOptions
    lossless: ClassVar[bool] = True
    sampling: ClassVar[bool] = False
    #: The drafting modes (``DraftTree.drafting``) it verifies; a tree of another mode is
    #: refused in one line (Traversal Verification's proof covers sampled trees only).
    drafting_modes: ClassVar[tuple[str, ...]] = DRAFTING_MODES

    def __init__(self, options: Any) -> None:
        self.options = options

    @abstractmethod
    def verify(
        self, tree: DraftTree, target_logits: torch.Tensor, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Decide one step: ``(last, bonus)``, the deepest accepted node of ``tree`` and the
        bonus token, as two 0-dim integer tensors on ``tree.device``.

        The accepted path is the root path to ``last`` (``last = 0``: no drafted token
        accepted). Returning tensors, not Python ints, lets a verifier decide on the device:
        the engine reads the verdict, the tree and its finiteness flag back in
        ONE transfer per step, so anything that reads the device here (``int(t)``,
        ``t.tolist()``, ``nonzero``) makes every step wait for the GPU once more.

        ``target_logits``: ``[n, V]``, row i is the target's prediction after node i (so row
        ``parents[j]`` verifies node j, and row ``last`` gives the bonus token).
        ``generator``: the randomness of this ``generate`` call (None: the verifier's own or
        torch's global one); a deterministic verifier ignores it.

        A host-side loop is fine for a prototype (``specframe.testing.reference.Verdict``
        turns a path into this return), and a property test against such an obviously-correct
        loop is how the built-ins are checked::

            def test_greedy_takes_the_argmax_child():
                tree = DraftTree.root(4).add_nodes(torch.tensor([0, 0]), torch.tensor([2, 5]),
                                                   torch.tensor([-0.5, -1.0]))
                logits = torch.zeros(3, 8)
                logits[0, 5] = logits[2, 7] = 1.0          # argmax 5 at the root, 7 after node 2
                last, bonus = make_plugin("verifiers", "greedy").verify(tree, logits, None)
                assert (int(last), int(bonus)) == (2, 7)
        """

    def root_tokens(self, root_logits: torch.Tensor,
                    generators: "list[torch.Generator | None]") -> torch.Tensor | None:
        """The bonus tokens of several root-only trees at once, or None (the default) to
        :meth:`verify` each root alone.

        A row whose speculation is switched off (a load-aware allocator's budget of 1) verifies
        its root alone; answering all such rows of a step in one call keeps that step as cheap
        as plain decoding. ``root_logits``: ``[R, V]``, row r the target's logits after root
        r; ``generators``: each row's randomness. Must return, as a ``[R]`` integer tensor on
        the logits' device, exactly the bonus token :meth:`verify` would give each root alone
        (``tests/test_root_tokens.py`` checks the built-ins against :meth:`verify`).
        """
        return None

    def verdict_rows(self, tree: DraftTree, target_logits: torch.Tensor) -> torch.Tensor | None:
        """What to read for :meth:`verify_host`, or None (the default) to :meth:`verify` on the
        device.

        Called only for a tree held in host lists (:meth:`DraftTree.has_host`, the CPU fast
        path of host-grown trees): a ``[len(tree)]`` integer tensor (greedy: the target's
        argmax at each node) that rides in the step's one host read; :meth:`verify_host` then
        decides on the host, so the step runs no tensor op on the tree after its forward.
        ``tests/test_greedy.py`` holds the built-in's two paths equal."""
        return None

    def verify_host(self, tree: HostLists, rows: list[int]) -> tuple[int, int]:
        """``(last, bonus)`` as :meth:`verify` would decide them, from the tree's host lists
        and the host copy of :meth:`verdict_rows`. Needed only where ``verdict_rows`` is."""
        raise NotImplementedError(f"verifier {self.name!r} gives verdict_rows but no verify_host")


@dataclass
class SideRows:
    """The side rows a drafter adds to one step's target forward (:meth:`Drafter.side_rows`).

    The engine appends them after the tree in the step's one target forward: tree nodes never
    see them (the verdict is the tree's alone), they are never verified, committed or counted
    as accepted, their cache entries go with the rejected nodes', and the target's argmax at
    them rides in the step's one host read to ``commit(..., side=SideOutput)``.
    The tokens, offsets and prefixes are host lists (the drafter's own data), so the engine
    checks them without reading the device.

    Attributes:
        tokens: ``S`` token ids.
        offsets: ``S`` positions relative to the step's root: a row at offset ``k`` sits at the
            root's position plus ``k`` (the committed prefix of ``L`` tokens, root included,
            holds positions ``0 .. L - 1``).
        visible: ``[S, S]`` bool tensor, ``visible[i, j]``: side row ``i`` attends to side row
            ``j``. The diagonal is implied (a row always sees itself).
        prefix: ``S`` counts of committed tokens each row sees (the first ``prefix[i]`` of the
            ``L``, root included: ``L`` means all of them, the root too); None (default): all.
        logits: also hand the drafter the target's ``[S, V]`` logits at the rows (on the
            device, never read back); the argmax comes either way.
    """

    tokens: Sequence[int]
    offsets: Sequence[int]
    visible: torch.Tensor
    prefix: Sequence[int] | None = None
    logits: bool = False

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass
class SideOutput:
    """What the target made of a step's side rows, given to ``commit(..., side=...)``.

    Attributes:
        rows: the :class:`SideRows` the drafter returned for the step.
        argmax: the target's greedy prediction after each side row (a host list, read with the
            step's verdict in its one transfer).
        logits: ``[S, V]`` logits at the rows when ``rows.logits`` asked for them, else None.
    """

    rows: SideRows
    argmax: list[int]
    logits: torch.Tensor | None = None


@dataclass
class StepStats:
    """Per-step record: tree shape, acceptance and where the time went (seconds).

    The time fields partition the step's wall time: :attr:`total_time` is their sum, and the
    engine measures them as consecutive intervals of one clock, so nothing of the step is in
    no field. ``other_time`` is the engine's own bookkeeping (what no other field names).
    In a batch every row's record carries the whole step's times (each sequence waited for all).
    """

    tree_size: int
    depth: int
    accepted: int
    emitted: int
    draft_forwards: int
    #: The drafter's calls while the tree was built (its forwards, lookups and their bookkeeping).
    draft_time: float
    #: Building the tree less its drafting, and the policy's ``observe`` after the step.
    policy_time: float
    #: The verification forward of the target (with the drafters' side rows, if any).
    target_time: float
    #: The verifier's decision and the step's one host read.
    verify_time: float
    #: The engine's own bookkeeping: checks, the side rows' set-up, the loop around the rows.
    other_time: float
    widths: list[int]
    accepted_ranks: list[int]
    #: Nodes the context took off the policy's budget this step (0: the full budget was
    #: available). Near the target's maximum length the engine passes a smaller limit.
    budget_cut: int = 0
    #: Children of the last accepted node (the root when nothing was accepted): the nodes that
    #: put the next depth to the test. 0: the accepted path ended at a leaf, so a tree deeper
    #: elsewhere missed nothing below it (what acceptance by depth and rank needs to know).
    #: -1: not recorded (a StepStats built outside the engine; records written before it).
    accepted_children: int = -1
    #: The KV cache's work: keeping the accepted path, dropping the rest.
    kv_time: float = 0.0
    #: The drafters' ``commit`` (what a drafter learns from the verified step).
    commit_time: float = 0.0
    #: Committing the emitted tokens to the output (and the score, with ``score=True``).
    emit_time: float = 0.0
    #: Stop checks: the cut at ``max_new_tokens`` and EOS.
    stop_time: float = 0.0
    #: The output record: this StepStats, the accepted path's view, a finished row's ``finish``.
    record_time: float = 0.0
    #: ``generate(on_step=...)``'s callback.
    callback_time: float = 0.0

    @property
    def total_time(self) -> float:
        """Whole step wall time (the sum of every time field, :data:`TIME_FIELDS`)."""
        return sum(getattr(self, name) for name in TIME_FIELDS)

    @property
    def overhead_time(self) -> float:
        """The step after its tree was built, less the target forward: verification and every
        piece of bookkeeping (what a step costs beside its forward and its drafting)."""
        return self.total_time - self.draft_time - self.policy_time - self.target_time

    @property
    def engine_time(self) -> float:
        """The step less its target forward and its drafting: the engine's and the policy's share."""
        return self.total_time - self.target_time - self.draft_time


#: The time fields of :class:`StepStats`, in declaration order: they partition a step's wall time.
TIME_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(StepStats) if f.name.endswith("_time"))
