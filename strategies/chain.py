"""Policy ``chain``: a single path of gamma drafted tokens (classic speculative decoding).

Greedy drafting (top-1 child, ``drafting="deterministic"``) by default; with ``sample=True``
each token is drawn from the raw draft softmax q and the tree records q at every expanded node
(``drafting="iid"``), which is Leviathan et al.'s speculative sampling when verified by the
``sampling`` verifier.

``gamma="auto"`` sizes each chain from the measured cost curve and the acceptance history
(:mod:`specframe.sizing`, docs/auto-sizing.md): drafting stops when the next token could not pay for
itself, and the chain is cut where the modelled tokens per second peak (possibly at the root:
a plain decoding step).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from specframe.interfaces import DraftSession, StepStats
from specframe.options import require
from specframe.search_space import tunable
from specframe.sampled_children import draft_distribution, rank_in_row, sample_iid, session_generator
from specframe.sizing import AUTO, AutoSizedPolicy, Growth, check_size_option
from specframe.tree import DraftTree, as_float32

SCHEDULES = ("constant", "heuristic")


@dataclass
class ChainOptions:
    """Options of the ``chain`` policy.

    Attributes:
        gamma: tokens drafted per step (the tree has gamma + 1 nodes with the root), or
            ``"auto"``: each step's length maximises modelled tokens per second (measured cost
            curve, running acceptance statistics), up to ``max_gamma``; needs the constant
            schedule.
        schedule: ``constant``, or ``heuristic`` (HF assisted generation: gamma += 2 after a
            fully accepted draft, else gamma = max(1, gamma - 1)).
        max_gamma: upper bound of gamma under the heuristic schedule and ``gamma="auto"``.
        confidence_stop: stop drafting after a token whose draft probability is below
            ``confidence_threshold`` (that token is still kept), as HF's
            ``assistant_confidence_threshold``. Without it, a drafter that carries its own
            threshold (a ``stop_threshold`` attribute that is not None: ``layerskip``, Draft &
            Verify's adaptive stop) stops the chain the same way.
        confidence_threshold: threshold of the confidence stop (HF default 0.4).
        sample: draw each token from the raw draft softmax instead of taking the top-1 (the
            tree then carries ``draft_probs`` and ``drafting="iid"`` for stochastic verifiers).
        seed: seed of the policy's own ``torch.Generator`` for sampling (one stream for the
            policy's lifetime); a generator the engine passes per call takes precedence, and
            None uses torch's global generator.
    """

    gamma: int | str = tunable(4, low=1, high=12)
    schedule: str = tunable("constant", choices=SCHEDULES)
    # Its low end is gamma's high end, so every drawn pair satisfies max_gamma >= gamma.
    max_gamma: int = tunable(32, low=12, high=48, when={"schedule": "heuristic"})
    confidence_stop: bool = tunable(False, choices=(False, True))
    confidence_threshold: float = tunable(0.4, low=0.05, high=0.95, when={"confidence_stop": True})
    sample: bool = False
    seed: int | None = None

    def __post_init__(self) -> None:
        check_size_option(self.gamma, "gamma", 1)
        require(self.schedule in SCHEDULES, "schedule", f"must be one of {SCHEDULES}, got {self.schedule!r}")
        require(self.gamma != AUTO or self.schedule == "constant", "schedule",
                "must be 'constant' with gamma=\"auto\" (the size chooser replaces the schedule)")
        top = 1 if self.gamma == AUTO else self.gamma
        require(self.max_gamma >= top, "max_gamma", f"must be >= gamma ({self.gamma}), got {self.max_gamma}")
        require(0.0 <= self.confidence_threshold <= 1.0, "confidence_threshold", "must be in [0, 1]")


class ChainPolicy(AutoSizedPolicy):
    """Drafts a chain: each step expands only the newest node and keeps its top-1 child."""

    name = "chain"
    Options = ChainOptions

    def __init__(self, options: ChainOptions) -> None:
        super().__init__(options)
        self.generator = None if options.seed is None else torch.Generator().manual_seed(int(options.seed))
        self.reset()

    @property
    def auto_size(self) -> bool:
        """Whether ``gamma`` is ``"auto"``."""
        return self.options.gamma == AUTO

    @property
    def max_budget(self) -> int:
        """Largest chain the schedule (or the auto size) can ask for, root included: gamma + 1
        (``max_gamma + 1`` under the heuristic schedule or ``gamma="auto"``)."""
        auto = self.auto_size or self.options.schedule == "heuristic"
        return (self.options.max_gamma if auto else self.options.gamma) + 1

    def reset(self) -> None:
        """Restart the schedule at the configured gamma (auto: keep the acceptance statistics)."""
        self.gamma = self.options.max_gamma if self.sizer is not None else self.options.gamma
        super().reset()

    def grow(self, session: DraftSession, growth: Growth) -> DraftTree:
        """Draft up to gamma tokens (top-1, or sampled with ``sample``), one draft forward each,
        within ``growth.nodes - 1``; stop where ``growth`` says, or before a token the drafter
        gives no finite log-prob (a row with nothing to offer)."""
        gamma = growth.nodes - 1 if growth.auto else min(self.gamma, growth.nodes - 1)
        threshold = self.options.confidence_threshold if self.options.confidence_stop else \
            getattr(session.drafter, "stop_threshold", None)
        if not self.options.sample and session.device.type == "cpu":
            return grow_on_host(session, growth, gamma, threshold)
        return self.grow_tensors(session, growth, gamma, threshold)

    def grow_tensors(self, session: DraftSession, growth: Growth, gamma: int, threshold: float | None) -> DraftTree:
        """:meth:`grow`'s loop over tensors (every device; sampling): :func:`grow_on_host` is
        its CPU fast path for greedy drafting, held equal to it by tests/test_host_trees.py."""
        tree = session.new_tree()
        generator = session_generator(session, self.generator) if self.options.sample else None
        drawn_from = []
        # The newest node as a one-element tensor, made once per layer: the next layer's
        # expanded node and parent; its cumulative log-prob, carried (the root's is 0).
        node, cumulative = torch.zeros(1, dtype=torch.long, device=tree.device), tree.logp
        for i in range(gamma):
            if self.options.sample:
                logp = session.expand(tree, node)
                q = draft_distribution(logp)
                tokens = sample_iid(q, 1, generator)
                values, ranks = torch.gather(logp, -1, tokens), rank_in_row(logp, tokens)
                drawn_from.append(q[0])
            else:
                values, tokens, ranks = session.expand_top(tree, node, 1)
            cumulative = cumulative + values[0]
            tree = tree.add_nodes(node, tokens[0], cumulative, ranks[0])
            node = torch.tensor([len(tree) - 1], device=tree.device)
            unsure = threshold is not None and float(values[0, 0].exp()) < threshold
            if growth.stop(tree, node, last=unsure or i + 1 == gamma):
                break
        tree = finite_prefix(tree)
        if not self.options.sample:
            return tree
        # Row u = the q node u's child was drawn from; the last node was never expanded.
        rows = [q.to(tree.device) for q in drawn_from[: len(tree) - 1]]
        rows.append(torch.zeros(session.vocab_size, dtype=torch.float64, device=tree.device))
        return replace(tree, draft_probs=torch.stack(rows), drafting="iid")

    def observe(self, step: StepStats) -> None:
        """Heuristic schedule: grow after a fully accepted draft, shrink otherwise; auto: learn."""
        if self.sizer is not None:
            self.sizer.observe(step)
            return
        if self.options.schedule != "heuristic":
            return
        if step.accepted == step.tree_size - 1:
            self.gamma = min(self.options.max_gamma, self.gamma + 2)
        else:
            self.gamma = max(1, self.gamma - 1)


def grow_on_host(session: DraftSession, growth: Growth, gamma: int, threshold: float | None) -> DraftTree:
    """The greedy chain of :meth:`ChainPolicy.grow` on the CPU, kept in host lists: each layer's
    tree is built from them in two tensor constructions instead of a dozen tensor ops (a
    5-node chain's build took 0.3 ms that way). The same tree as the tensor loop, value for
    value: the cumulative log-prob is summed in the precision the tensors sum it in (a double
    sum of two float32 values rounded to float32 is their float32 sum). ``threshold``: a drafter's or
    the confidence stop's (a token below it is kept and ends the chain)."""
    root = session.root_token
    tokens, parents, depths, logp, ranks = [root], [-1], [0], [0.0], [-1]
    tree = DraftTree.from_lists(tokens, parents, depths, logp, ranks, session.device)
    cumulative = 0.0
    for i in range(gamma):
        node = len(tokens) - 1
        [((value,), (token,), (rank,))], dtype = session.expand_top_lists(tree, [node], 1)
        # The tensor loop's sum promotes to the values' dtype: float64 values sum in float64
        # (each node's log-prob rounded once when stored), the others in float32.
        cumulative = cumulative + value if dtype == torch.float64 else as_float32(cumulative + value)
        tokens.append(token)
        parents.append(node)
        depths.append(node + 1)
        logp.append(as_float32(cumulative))
        ranks.append(rank)
        tree = DraftTree.from_lists(tokens, parents, depths, logp, ranks, session.device)
        # exp in the values' dtype, as the tensor loop's threshold test reads it.
        unsure = threshold is not None and float(torch.tensor(value, dtype=dtype).exp()) < threshold
        if growth.stop(tree, [node + 1], last=unsure or i + 1 == gamma):
            break
    # As finite_prefix cuts the tensor loop's chain: before its first non-finite log-prob.
    cut = next((i for i, value in enumerate(logp) if not math.isfinite(value)), len(logp))
    if cut == len(logp):
        return tree
    return DraftTree.from_lists(tokens[:cut], parents[:cut], depths[:cut], logp[:cut], ranks[:cut], session.device)



def finite_prefix(tree: DraftTree) -> DraftTree:
    """The chain up to (not including) its first node with a non-finite draft log-prob: a link
    drafted from a row with no finite entry is no draft. One read per build."""
    finite = torch.isfinite(tree.logp).tolist()
    if all(finite):
        return tree
    return tree.select(torch.arange(finite.index(False), device=tree.device))
