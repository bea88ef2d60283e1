"""Drafter ``hybrid``: several drafters' candidates merged into one row per node, one tree.

``drafter_options = { drafters = ["ngram", "recycle"] }``: each entry is a registered drafter
name or ``[name, {options}]``. At every node each part proposes its row, and the merged row is

    score(t) = max over parts p of ( log p_part(t) + log w_p ),    w_p = c_p / sum_q c_q

``score = "max"`` (the default): every ``c_p`` is 1, so ``log w_p = -log(number of parts)``: a
candidate is as likely as its most confident part says. ``score = "calibrated"``: ``c_p`` is part
p's calibration factor on this sequence, learned in ``commit`` from the verifier's verdicts
(:class:`PartCalibration`): the least-squares slope of "accepted" (0/1) on the probability p
claimed for the tested nodes it proposed, ``c_p = (sum p*accepted + prior) / (sum p^2 +
prior)``, each sum decayed per step. A part whose confident guesses keep being rejected (the
n-gram lookup's rare matches on a question) loses rank against one whose candidates keep
being accepted, and every factor starts at 1, so the first step of a sequence ranks exactly
as ``"max"`` does.

Either way the row is a sub-probability (``sum_t max_p w_p p_p(t) <= sum_p w_p = 1``) and
each part's candidates keep their own order (its shift is one constant for every node of the
step), so relative gates (TALON's) see a consistent order, ``budget = "auto"`` calibrates on
the merged ranks, and ties follow the project's rule (lower token id first). The weights
change only in ``commit``, so all rows of one step come from one rule.

``mode = "cascade"`` (the parts listed cheapest first, e.g. ``["ngram", ["eagle3", {...}]]``):
retrieve first, draft with a model only where retrieval fails ("Draft Less, Retrieve More",
arXiv 2605.20104). At a step's first call (the root) the parts are asked in order, and a
later part joins only while every earlier part's best root candidate is below ``threshold``
(a probability; ``"auto"``: where asking it has paid on this machine, learned by
:class:`~specframe.drafters.cascade_gate.CascadeGate` from measured step throughput); the step's rows are then the ``"max"`` merge of the parts asked (one part: its
own rows). The choice holds for the whole step, so a model part drafts a whole tree or sits
the step out: an EAGLE head can only expand nodes whose ancestors it expanded, and it still
receives every committed token's target feature in ``commit`` (it forwards the backlog at its
next root), so its state stays whole whatever steps it skipped. Draft time counts only the
parts asked; deciding costs one host read per step; :attr:`HybridDrafter.steps_asked` counts
the steps each part was asked in.

Lossless by construction: the hybrid is just a drafter, so the verifier decides as always.

Cost: one ``expand`` calls every part's ``expand`` (``expand_top``: every part's
``expand_top``) directly, not through the policy's :class:`~specframe.DraftSession`, so the
session times the sum of the parts' draft times and counts the call as ONE draft forward.
The top ``k`` of the merged row is always among the union of the parts' top ``k`` (a candidate
outside its best part's top k has k candidates at least as good in that part, and the part's
shift is the same for all of them), so ``expand_top`` merges the parts' few candidates and
never builds the dense rows of sparse parts. Calibration keeps the parts' top candidates of
each expanded node in a device buffer and learns with a fixed number of device ops in
``commit``: no host read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from specframe.interfaces import Drafter, wants_prompt_logits
from specframe.options import OptionError, build_options, require
from specframe.plugins import get_registry
from specframe.search_space import tunable
from specframe.tree import DraftTree

from .cascade_gate import CascadeGate
from .recycle import canonical_rows

#: How faithfully replaying a recorded greedy trace reproduces a drafter, weakest last.
REPLAY_ORDER = ("exact", "approximate", "unsupported")


def split_entry(entry: Any, key: str = "drafters") -> tuple[str, dict]:
    """``"name"`` or ``[name, {options}]`` -> ``(name, options)``; else an error naming option ``key``."""
    if isinstance(entry, str):
        return entry, {}
    if isinstance(entry, (list, tuple)) and len(entry) == 2 and isinstance(entry[0], str) and isinstance(entry[1], dict):
        return entry[0], dict(entry[1])
    raise OptionError(f"option {key!r}: entry {entry!r} is not a drafter name or [name, {{options}}]")


def make_part(entry: Any, target: Any, role: str = "a part of 'hybrid'", key: str = "drafters") -> Drafter:
    """The registered drafter an entry names (``"name"`` or ``[name, {options}]``), built over
    ``target``; ``role`` says in an option error what the drafter is part of."""
    name, values = split_entry(entry, key)
    cls = get_registry().get("drafters", name)
    return cls(build_options(cls.Options, values, f"drafter {name!r} ({role})"), target)


def part_inputs(part: Drafter, hidden: Any, logits: torch.Tensor | None) -> dict[str, Any]:
    """The keywords of ``part``'s ``begin``/``commit``: only the target outputs it declares."""
    out: dict[str, Any] = {}
    if getattr(part, "needs_target_hidden", False):
        out["target_hidden"] = hidden
    if getattr(part, "needs_target_logits", False):
        out["target_logits"] = logits
    return out


#: The merge rules of the ``score`` option (see the module docstring).
SCORES = ("calibrated", "max")
#: How the parts are asked: all of them at every node, or in order until one is confident.
MODES = ("merge", "cascade")
#: The cascade threshold that learns where a later part pays (:mod:`.cascade_gate`).
AUTO = "auto"


@dataclass
class HybridDrafterOptions:
    """Options of the ``hybrid`` drafter.

    Attributes:
        drafters: the parts, each a registered drafter name or ``[name, {options}]``.
        score: the merge rule: ``"calibrated"`` (each part's log-probs shifted by its
            calibration factor on this sequence) or ``"max"`` (no learning: the max of the
            parts' log-probs less log of the part count).
        calibration_prior: with ``"calibrated"``: the weight (in tested nodes claimed at
            probability 1) of the prior that every part is calibrated (factor 1); larger
            moves the factors more slowly.
        calibration_decay: with ``"calibrated"``: per-step decay in (0, 1] of the evidence,
            so the factors follow the sequence (1 keeps every step's evidence).
        mode: ``"merge"`` (every part at every node) or ``"cascade"`` (parts in the order
            listed, cheapest first: a step asks the next part only while the earlier ones'
            best root candidate is below ``threshold``; the module docstring).
        threshold: with ``"cascade"``: the probability in [0, 1] a part's best candidate at
            the root must reach for the later parts to sit the step out, or ``"auto"``: a
            later part is asked where steps that asked it have emitted more tokens per
            second than steps that did not, per bin of the earlier parts' confidence
            (:mod:`specframe.drafters.cascade_gate`).
    """

    drafters: list = field(default_factory=lambda: ["ngram", "recycle"])
    # A cascade takes score = "max", so score is drawn only for a merge.
    score: str = tunable("max", choices=SCORES, when={"mode": "merge"})
    calibration_prior: float = tunable(1.0, low=0.1, high=10.0, log=True, when={"score": "calibrated"})
    calibration_decay: float = tunable(0.95, low=0.5, high=1.0, when={"score": "calibrated"})
    mode: str = tunable("merge", choices=MODES)
    threshold: float | str = tunable(0.5, low=0.0, high=1.0, when={"mode": "cascade"})

    def __post_init__(self) -> None:
        require(isinstance(self.drafters, (list, tuple)) and len(self.drafters) >= 1, "drafters",
                f"must be a non-empty list of drafter names or [name, {{options}}], got {self.drafters!r}")
        for entry in self.drafters:
            split_entry(entry)
        require(self.score in SCORES, "score", f"must be one of {', '.join(map(repr, SCORES))}, got {self.score!r}")
        require(math.isfinite(self.calibration_prior) and self.calibration_prior > 0, "calibration_prior",
                f"must be a finite number > 0, got {self.calibration_prior!r}")
        require(0.0 < self.calibration_decay <= 1.0, "calibration_decay",
                f"must be in (0, 1], got {self.calibration_decay!r}")
        require(self.mode in MODES, "mode", f"must be one of {', '.join(map(repr, MODES))}, got {self.mode!r}")
        require(self.threshold == AUTO or (isinstance(self.threshold, (int, float)) and not isinstance(self.threshold, bool)
                                           and 0.0 <= self.threshold <= 1.0), "threshold",
                f"must be a probability in [0, 1] or {AUTO!r}, got {self.threshold!r}")
        require(self.mode == "merge" or self.score == "max", "score",
                f"'calibrated' merges every part at every node; mode = 'cascade' takes score = 'max', got {self.score!r}")


#: Candidates per part kept for calibration from a dense ``expand`` row (its top entries): a
#: node sampled from outside them teaches nothing.
DENSE_RECORD = 8


class PartCalibration:
    """Per-part calibration factors of the ``calibrated`` score, learned from verifications.

    While a step drafts, :meth:`record` keeps each expanded node's per-part top candidates
    (ids and the parts' own log-probs) in a ``[capacity, parts, width]`` device buffer indexed
    by the node's index in the tree ``expand`` saw. :meth:`learn` then reads the verified tree:
    a node is *tested* when its parent is on the accepted path; the parts whose shifted
    log-prob of its token set the merged score *won* it (all of them on a tie). For each part p
    over its won tested nodes, with ``q`` the probability p claimed and ``a`` 1 if accepted::

        hit_p <- decay * hit_p + sum q * a       sq_p <- decay * sq_p + sum q^2
        c_p = (hit_p + prior) / (sq_p + prior)   log w_p = log c_p - log sum_q c_q

    ``c_p`` is the least-squares slope of acceptance on claimed probability, pulled to 1 by
    the prior: a part whose probability-1 guesses are accepted one time in five drifts to 0.2;
    its fallback guesses (probability ~1e-6) weigh nothing either way. Everything stays on the
    device: a fixed number of ops per step, no host read, no data-dependent shape.
    """

    def __init__(self, parts: int, prior: float, decay: float, device: torch.device) -> None:
        self.parts, self.prior, self.decay, self.device = parts, float(prior), float(decay), device
        self.ids: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.reset()

    def reset(self) -> None:
        """Forget the evidence (every factor back to 1) and the step's records."""
        self.hit = torch.zeros(self.parts, device=self.device)
        self.sq = torch.zeros(self.parts, device=self.device)
        self.log_weight = torch.full((self.parts,), -math.log(self.parts), device=self.device)
        if self.ids is not None:
            self.ids.fill_(-1)

    def record(self, size: int, nodes: torch.Tensor, ids: torch.Tensor, values: torch.Tensor) -> None:
        """Keep the parts' candidates ``ids``/``values`` (``[len(nodes), parts, k]``) of
        ``nodes`` of a tree of ``size`` nodes (indices in that tree)."""
        k = ids.shape[-1]
        self._fit(size, k)
        width = self.ids.shape[-1]
        if k < width:  # clear the places an earlier, wider record of the node left
            ids = torch.nn.functional.pad(ids, (0, width - k), value=-1)
            values = torch.nn.functional.pad(values, (0, width - k), value=-math.inf)
        nodes = nodes.to(self.device, torch.long)
        self.ids[nodes] = ids.to(self.device)
        self.values[nodes] = values.to(self.device, self.values.dtype)

    def _fit(self, size: int, k: int) -> None:
        """Grow the buffers to hold ``size`` nodes of ``k`` candidates (doubling, so a step
        rarely reallocates; the buffers outlive the step and are cleared by :meth:`learn`)."""
        rows, width = (0, 0) if self.ids is None else self.ids.shape[::2]
        if rows >= size and width >= k:
            return
        rows, width = max(size, 2 * rows, 16), max(k, width, 8)
        ids = torch.full((rows, self.parts, width), -1, dtype=torch.long, device=self.device)
        values = torch.full((rows, self.parts, width), -math.inf, device=self.device)
        if self.ids is not None:
            old_rows, _, old_width = self.ids.shape
            ids[:old_rows, :, :old_width] = self.ids
            values[:old_rows, :, :old_width] = self.values
        self.ids, self.values = ids, values

    def learn(self, tree: DraftTree, path: torch.Tensor | None) -> None:
        """Update the factors from the verified ``tree`` and its accepted ``path`` (root
        first), then clear the step's records. ``tree`` may be a re-indexed sub-tree of the
        one ``expand`` saw (``tree.origins()`` maps it back); nodes appended after a select
        (origin -1), or whose token no part's record holds, teach nothing."""
        if self.ids is None or path is None:
            return
        won, claim, accepted = self._verdicts(tree, path)
        claim = torch.where(won, claim, 0.0)
        self.hit = self.decay * self.hit + (claim * accepted[:, None]).sum(0)
        self.sq = self.decay * self.sq + (claim * claim).sum(0)
        factor = (self.hit + self.prior) / (self.sq + self.prior)
        self.log_weight = factor.log() - factor.sum().log()
        self.ids.fill_(-1)

    def _verdicts(self, tree: DraftTree, path: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(won [n, parts], claimed probability [n, parts], accepted [n])`` per verified node."""
        n, dev, rows = len(tree), self.device, self.ids.shape[0]
        on_path = torch.zeros(n, dtype=torch.bool, device=dev).index_fill_(0, path.to(dev, torch.long), True)
        parents, origin = tree.parents.to(dev), tree.origins().to(dev)
        up = parents.clamp(min=0)
        at = origin[up]  # the parent's index in the tree expand saw
        tested = (parents >= 0) & on_path[up] & (origin >= 0) & (at >= 0) & (at < rows)
        at = at.clamp(0, rows - 1)
        match = self.ids[at] == tree.tokens.to(dev)[:, None, None]
        raw = torch.where(match, self.values[at], -math.inf).amax(dim=-1)        # [n, parts]
        score = raw + self.log_weight
        won = tested[:, None] & torch.isfinite(raw) & (score == score.amax(dim=-1, keepdim=True))
        return won, raw.exp(), on_path.to(raw.dtype)


class HybridDrafter(Drafter):
    """Merges its parts' candidate rows: the max over parts of each part's log-probs shifted
    by its weight (calibrated per part on the sequence, or equal: see the module)."""

    name = "hybrid"
    Options = HybridDrafterOptions

    def __init__(self, options: HybridDrafterOptions, target: Any, parts: list[Drafter] | None = None) -> None:
        """Build the parts from ``options.drafters``, or take already built ``parts``."""
        super().__init__(options, target)
        self.parts: list[Drafter] = parts if parts is not None else [
            self._make_part(entry, target) for entry in options.drafters]
        # Declarations of the whole: what any part needs, keeps or loses on replay.
        self.needs_target_hidden = any(getattr(p, "needs_target_hidden", False) for p in self.parts)
        self.needs_target_logits = any(getattr(p, "needs_target_logits", False) for p in self.parts)
        self.needs_prompt_logits = any(wants_prompt_logits(p) for p in self.parts)
        self.persistent_state = any(getattr(p, "persistent_state", False) for p in self.parts)
        self.uses_clock = any(getattr(p, "uses_clock", False) for p in self.parts)
        self.replay = max((getattr(p, "replay", "unsupported") for p in self.parts), key=_replay_rank)
        # One part has nothing to be calibrated against: its weight is 1 under either rule.
        self.calibrated = options.score == "calibrated" and len(self.parts) > 1
        self.calibration = PartCalibration(len(self.parts), options.calibration_prior, options.calibration_decay,
                                           getattr(target, "device", torch.device("cpu")))
        # Calibration learns from the verdicts at rejected nodes too, which no fresh drafter
        # can repeat.
        self.learns_from_verdicts = self.calibrated or any(
            getattr(p, "learns_from_verdicts", False) for p in self.parts)
        self.cascade = options.mode == "cascade" and len(self.parts) > 1
        # The auto gate learns from wall-clock step rates and keeps them across requests.
        self.gate = CascadeGate(len(self.parts) - 1) if self.cascade and options.threshold == AUTO else None
        if self.gate is not None:
            self.persistent_state = True
            self.uses_clock = True
            self.replay = max(self.replay, "approximate", key=_replay_rank)
        self._active: list[Drafter] | None = None  # this step's parts (cascade), chosen at its first call
        #: Steps each part was asked in (cascade: what the threshold saved).
        self.steps_asked = [0] * len(self.parts)

    @classmethod
    def from_parts(cls, parts: list[Drafter], target: Any, **options: Any) -> "HybridDrafter":
        """A hybrid of already built ``parts`` (programmatic composition, tests); ``options``
        are the other :class:`HybridDrafterOptions` (``score=``, ...)."""
        names = [part.name or type(part).__name__ for part in parts]
        return cls(HybridDrafterOptions(drafters=names, **options), target, parts=parts)

    @staticmethod
    def _make_part(entry: Any, target: Any) -> Drafter:
        return make_part(entry, target)

    # ------------------------------------------------------------------ life cycle
    def begin(self, prompt_ids: torch.Tensor, target_hidden: Any = None,
              target_logits: torch.Tensor | None = None) -> None:
        """Begin every part, each with only the target outputs it declares; the calibration
        starts over (it is about this sequence)."""
        for part in self.parts:
            logits = target_logits if wants_prompt_logits(part) else None
            part.begin(prompt_ids, **self._inputs(part, target_hidden, logits))
        self.calibration.reset()
        self._active = None
        if self.gate is not None:
            self.gate.start()

    def commit(self, tokens: torch.Tensor, path: torch.Tensor | None = None, target_hidden: Any = None,
               tree: DraftTree | None = None, target_logits: torch.Tensor | None = None) -> None:
        """Commit to every part, each with only the target outputs it declares; then learn
        the parts' calibration from the verified ``tree`` and its accepted ``path``."""
        for part in self.parts:
            part.commit(tokens, path, tree=tree, **self._inputs(part, target_hidden, target_logits))
        if self.calibrated and tree is not None:
            self.calibration.learn(tree, path)
        if self.gate is not None:
            self.gate.settle(len(tokens))
        self._active = None

    def set_clock(self, clock: Callable[[], float]) -> None:
        """The gate and every part read ``clock`` from now on."""
        if self.gate is not None:
            self.gate.clock = clock
        for part in self.parts:
            part.set_clock(clock)

    @staticmethod
    def _inputs(part: Drafter, hidden: Any, logits: torch.Tensor | None) -> dict[str, Any]:
        return part_inputs(part, hidden, logits)

    # ------------------------------------------------------------------ drafting
    def active_parts(self, tree: DraftTree, nodes: torch.Tensor) -> list[Drafter]:
        """The parts this step asks: all of them (merge), or, in cascade, the parts in order up
        to the first whose best candidate at the step's first call (the root) reaches the
        threshold (every part when none does). Chosen once per step, so a part is asked for
        the whole tree or sits the step out: an EAGLE head expands only nodes whose ancestors it
        expanded, and still gets every committed token in ``commit``."""
        if not self.cascade:
            return self.parts
        if self._active is None:
            self._active = list(self.parts)
            best = 0.0
            for j, part in enumerate(self.parts[:-1]):
                values = part.expand_top(tree, nodes, 1)[0]
                # One host read a step: whether to run the costlier parts is a host decision.
                best = max(best, math.exp(float(values.max())))
                if not self._asks_next(j + 1, best):
                    self._active = self.parts[: j + 1]
                    break
            for j in range(len(self._active)):
                self.steps_asked[j] += 1
        return self._active

    def _asks_next(self, part: int, best: float) -> bool:
        """Whether the cascade asks ``part`` when the earlier parts' best root probability is ``best``."""
        if self.gate is not None:
            return self.gate.ask(part, best)
        return best < self.options.threshold

    def expand(self, tree: DraftTree, nodes: torch.Tensor) -> torch.Tensor:
        """Dense merged rows: the elementwise max of the parts' rows, each shifted by its
        part's log-weight (``"max"``: the max, minus log(parts)); in cascade, of this step's parts."""
        parts = self.active_parts(tree, nodes)
        rows = [part.expand(tree, nodes) for part in parts]
        if not self.calibrated:
            merged = rows[0]
            for row in rows[1:]:
                merged = torch.maximum(merged, row)
            return merged - math.log(len(parts))
        log_weight = self.calibration.log_weight.to(rows[0].device)
        merged = rows[0] + log_weight[0]
        for p, row in enumerate(rows[1:], start=1):
            merged = torch.maximum(merged, row + log_weight[p])
        tops = [torch.topk(row, min(DENSE_RECORD, self.vocab_size), dim=-1) for row in rows]
        self.calibration.record(len(tree), nodes, torch.stack([t.indices for t in tops], dim=1),
                                torch.stack([t.values for t in tops], dim=1))
        return merged

    def expand_top(self, tree: DraftTree, nodes: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The merged rows' top ``k`` from the union of the parts' top ``k`` (see the module)."""
        k = min(int(k), self.vocab_size)
        parts = self.active_parts(tree, nodes)
        tops = [part.expand_top(tree, nodes, k) for part in parts]
        if self.calibrated:
            values, ids = torch.stack([t[0] for t in tops], dim=1), torch.stack([t[1] for t in tops], dim=1)
            self.calibration.record(len(tree), nodes, ids, values)
            values = (values + self.calibration.log_weight.to(values.device)[:, None]).flatten(1)
            ids, shift = ids.flatten(1), 0.0
        else:
            values = torch.cat([t[0] for t in tops], dim=-1)
            ids = torch.cat([t[1] for t in tops], dim=-1)
            shift = math.log(len(parts))
        if k == 1:  # a chain's layer: every step asks this, and the general merge costs ~20 ops
            return with_ranks(*best_first(values, ids, shift), tree.device)
        ids, values = canonical_rows(ids, best_of_duplicates(ids, values) - shift, k, self.vocab_size)
        return with_ranks(values, ids, tree.device)


def best_first(values: torch.Tensor, ids: torch.Tensor, shift: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The merged top-1 from the parts' top-1s (``[rows, parts]``): the best value less
    ``shift``, its lowest id among ties; a row with no finite candidate gets id 0 at ``-inf``,
    as :func:`specframe.topk_per_row` fills it. (Another part's token tied with the best can
    not have a lower id than its own part's top-1, which the tie rule already made lowest.)"""
    best = values.max(dim=-1, keepdim=True).values
    alive = torch.isfinite(best)
    winner = torch.where((values == best) & alive, ids, torch.iinfo(ids.dtype).max).min(dim=-1, keepdim=True).values
    return best - shift, torch.where(alive, winner, torch.zeros_like(winner))


def with_ranks(values: torch.Tensor, ids: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(values, ids, ranks)`` on ``device``, as :func:`specframe.topk_per_row` returns them."""
    rows, k = values.shape
    return values.to(device), ids.to(device), torch.arange(k, device=device).expand(rows, k)


def best_of_duplicates(ids: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``values`` with every entry ``-inf`` that another finite entry of its row with the same id
    beats (higher value, or equal and earlier): each id keeps its max once."""
    finite = torch.isfinite(values)
    same = ids[:, :, None] == ids[:, None, :]                       # [rows, i, j]
    order = torch.arange(ids.shape[-1], device=ids.device)
    earlier = order[:, None] < order[None, :]
    beats = same & finite[:, :, None] & (
        (values[:, :, None] > values[:, None, :]) | ((values[:, :, None] == values[:, None, :]) & earlier))
    return torch.where(beats.any(dim=1), -math.inf, values)


def weakest_replay(values: list[str | None]) -> str:
    """The weakest of several replay declarations (a composite replays as its weakest part)."""
    return max(values, key=_replay_rank)


def _replay_rank(value: str) -> int:
    """Position of a replay declaration in :data:`REPLAY_ORDER` (unknown: the weakest)."""
    return REPLAY_ORDER.index(value) if value in REPLAY_ORDER else len(REPLAY_ORDER)
