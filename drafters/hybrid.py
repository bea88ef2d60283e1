"""Drafter ``hybrid``: several drafters' candidates merged into one row per node, one tree.

``drafter_options = { drafters = ["ngram", "recycle"] }``: each entry is a registered drafter
name or ``[name, {options}]``. At every node each part proposes its row, and the merged row is

    score(t) = max over parts of log p_part(t)  -  log(number of parts)

A candidate is as likely as its most confident part says (so n-gram's sure copies and the
recycled table's habits each keep their own order), and dividing by the number of parts keeps
the row a sub-probability (the sum of the parts' maxima is at most the number of parts). The
shift is the same at every node of a layer, so relative gates (TALON's) and per-row Top-K see
exactly the order of the maxima. Ties follow the project's rule (lower token id first).

Lossless by construction: the hybrid is just a drafter, so the verifier decides as always.

Cost: one ``expand`` calls every part's ``expand`` (``expand_top``: every part's
``expand_top``) directly, not through the policy's :class:`~specframe.DraftSession`, so the
session times the sum of the parts' draft times and counts the call as ONE draft forward.
The top ``k`` of the merged row is always among the union of the parts' top ``k`` (a candidate
outside its best part's top k has k candidates at least as good in that part), so
``expand_top`` merges the parts' few candidates and never builds the dense rows of sparse parts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from specframe.interfaces import Drafter, wants_prompt_logits
from specframe.options import OptionError, build_options, require
from specframe.plugins import get_registry
from specframe.tree import DraftTree

from .recycle import canonical_rows

#: How faithfully replaying a recorded greedy trace reproduces a drafter, weakest last.
REPLAY_ORDER = ("exact", "approximate", "unsupported")


def _split(entry: Any) -> tuple[str, dict]:
    """``"name"`` or ``[name, {options}]`` -> ``(name, options)``."""
    if isinstance(entry, str):
        return entry, {}
    if isinstance(entry, (list, tuple)) and len(entry) == 2 and isinstance(entry[0], str) and isinstance(entry[1], dict):
        return entry[0], dict(entry[1])
    raise OptionError(f"option 'drafters': entry {entry!r} is not a drafter name or [name, {{options}}]")


@dataclass
class HybridDrafterOptions:
    """Options of the ``hybrid`` drafter.

    Attributes:
        drafters: the parts, each a registered drafter name or ``[name, {options}]``.
    """

    drafters: list = field(default_factory=lambda: ["ngram", "recycle"])

    def __post_init__(self) -> None:
        require(isinstance(self.drafters, (list, tuple)) and len(self.drafters) >= 1, "drafters",
                f"must be a non-empty list of drafter names or [name, {{options}}], got {self.drafters!r}")
        for entry in self.drafters:
            _split(entry)


class HybridDrafter(Drafter):
    """Merges its parts' candidate rows (max of log-probs, shifted by log of the part count)."""

    name = "hybrid"
    Options = HybridDrafterOptions

    def __init__(self, options: HybridDrafterOptions, target: Any) -> None:
        super().__init__(options, target)
        self.parts: list[Drafter] = [self._make_part(entry, target) for entry in options.drafters]
        # Declarations of the whole: what any part needs, keeps or loses on replay.
        self.needs_target_hidden = any(getattr(p, "needs_target_hidden", False) for p in self.parts)
        self.needs_target_logits = any(getattr(p, "needs_target_logits", False) for p in self.parts)
        self.needs_prompt_logits = any(wants_prompt_logits(p) for p in self.parts)
        self.persistent_state = any(getattr(p, "persistent_state", False) for p in self.parts)
        self.replay = max((getattr(p, "replay", "unsupported") for p in self.parts), key=_replay_rank)
        self.log_parts = math.log(len(self.parts))

    @staticmethod
    def _make_part(entry: Any, target: Any) -> Drafter:
        name, values = _split(entry)
        cls = get_registry().get("drafters", name)
        return cls(build_options(cls.Options, values, f"drafter {name!r} (a part of 'hybrid')"), target)

    # ------------------------------------------------------------------ life cycle
    def begin(self, prompt_ids: torch.Tensor, target_hidden: Any = None,
              target_logits: torch.Tensor | None = None) -> None:
        """Begin every part, each with only the target outputs it declares."""
        for part in self.parts:
            logits = target_logits if wants_prompt_logits(part) else None
            part.begin(prompt_ids, **self._inputs(part, target_hidden, logits))

    def commit(self, tokens: torch.Tensor, path: torch.Tensor | None = None, target_hidden: Any = None,
               tree: DraftTree | None = None, target_logits: torch.Tensor | None = None) -> None:
        """Commit to every part, each with only the target outputs it declares."""
        for part in self.parts:
            part.commit(tokens, path, tree=tree, **self._inputs(part, target_hidden, target_logits))

    @staticmethod
    def _inputs(part: Drafter, hidden: Any, logits: torch.Tensor | None) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if getattr(part, "needs_target_hidden", False):
            out["target_hidden"] = hidden
        if getattr(part, "needs_target_logits", False):
            out["target_logits"] = logits
        return out

    # ------------------------------------------------------------------ drafting
    def expand(self, tree: DraftTree, nodes: torch.Tensor) -> torch.Tensor:
        """Dense merged rows: the elementwise max of the parts' rows, minus log(parts)."""
        merged = None
        for part in self.parts:
            rows = part.expand(tree, nodes)
            merged = rows if merged is None else torch.maximum(merged, rows)
        return merged - self.log_parts

    def expand_top(self, tree: DraftTree, nodes: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The merged rows' top ``k`` from the union of the parts' top ``k`` (see the module)."""
        k = min(int(k), self.vocab_size)
        tops = [part.expand_top(tree, nodes, k) for part in self.parts]
        values = torch.cat([t[0] for t in tops], dim=-1)
        ids = torch.cat([t[1] for t in tops], dim=-1)
        if k == 1:  # a chain's layer: every step asks this, and the general merge costs ~20 ops
            return with_ranks(*best_first(values, ids, self.log_parts), tree.device)
        ids, values = canonical_rows(ids, best_of_duplicates(ids, values) - self.log_parts, k, self.vocab_size)
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


def _replay_rank(value: str) -> int:
    """Position of a replay declaration in :data:`REPLAY_ORDER` (unknown: the weakest)."""
    return REPLAY_ORDER.index(value) if value in REPLAY_ORDER else len(REPLAY_ORDER)
