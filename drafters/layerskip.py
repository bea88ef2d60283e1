"""Drafter ``layerskip``: the target drafts for itself with some sublayers skipped (self-speculation).

Draft & Verify (a fixed skipped set, a chain stopped by confidence), LayerSkip / early exit (the
first ``exit_layer`` layers, then the shared norm and LM head) and SWIFT (the skipped set
searched while generating, ``search = "swift"``) are the same drafter with other options. The
forward runs the target's own modules (:mod:`drafters.layerskip_forward`); the model is not
patched and no draft weights exist.

Draft KV: the committed context's K/V are the target's own (a full-model forward wrote them),
shared read-only: each draft forward reads them from the target's cache and writes its own rows
(this step's drafted nodes, kept layers only) to a scratch list that the step throws away at
``commit``. That is Draft & Verify's and SWIFT's scheme, and for early exit it is exactly the
first ``E`` layers' KV. Where the target's cache does not hold exactly the committed prefix of
one sequence (a replayed target has none; a batched one packs several rows) the drafter keeps
its own context K/V, written by full-model catch-up forwards of the committed tokens (``kv``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from specframe.interfaces import Drafter
from specframe.models.target import TargetModel
from specframe.options import require
from specframe.search_space import tunable
from specframe.tree import DraftTree

from .layerskip_forward import PRESETS, LayerRunner, SkipPlan, StepKV, context_from_cache, preset_plan
from .layerskip_state import StopThreshold, plan_from_options
from .swift_search import SwiftSearch, SwiftSettings, match_rate

KV_MODES = ("auto", "shared", "own")
SEARCHES = ("none", "swift")


@dataclass
class LayerSkipOptions:
    """Options of the ``layerskip`` drafter.

    Attributes:
        preset: the skipped set by name (both sublayers of the named layers): ``odd`` (layers 1,
            3, ..., last kept: SWIFT's start), ``even``, ``first-last-kept``, ``second-half``,
            ``none``, ``random`` (``skip_ratio`` of the inner sublayers, drawn with ``skip_seed``).
        attn_skip, mlp_skip: the skipped set as per-layer booleans (True: skipped; one per decoder
            layer), both or neither; they replace ``preset``.
        exit_layer: early exit after this many layers (1 .. L); replaces the skipped set.
        skip_ratio, skip_seed: the ``random`` preset's share of inner sublayers and seed
            (``specframe tune`` searches skipped sets through them).
        stop_threshold: Draft & Verify's stop: a chain policy stops after a drafted token whose
            draft probability is below it (0: never); other policies ignore it.
        adaptive_stop: adapt the threshold after each step as Draft & Verify's
            ``auto_th_stop_draft`` does (its ``auto_parameters`` ``[1, 0.5, 0.9, 1e-2, 0.9]``).
        stop_max_draft: the chain's length (Draft & Verify's ``max_step_draft``; set the chain's
            ``gamma`` to it): a fully drafted chain keeps the adapted threshold from falling.
        search: ``none`` (a fixed set) or ``swift`` (SWIFT's on-the-fly search, starting from
            the set above; its state carries across prompts).
        swift_*: SWIFT's search settings (:class:`~drafters.swift_search.SwiftSettings`).
        kv: ``auto`` (share the target's context KV when its cache holds exactly the committed
            prefix, else keep its own), ``shared`` (refuse otherwise) or ``own``.
    """

    preset: str = tunable("odd", choices=PRESETS)
    attn_skip: tuple | None = None
    mlp_skip: tuple | None = None
    exit_layer: int | None = None
    skip_ratio: float = tunable(0.45, low=0.1, high=0.9, when={"preset": "random"})
    skip_seed: int = tunable(0, low=0, high=999, when={"preset": "random"})
    stop_threshold: float = tunable(0.0, low=0.0, high=0.95)
    adaptive_stop: bool = False
    stop_max_draft: int = 8
    search: str = "none"
    swift_skip_ratio: float = 0.45
    swift_context_window: int = 32
    swift_max_score: float = 0.95
    swift_opt_interval: int = 1
    swift_bayes_interval: int = 25
    swift_max_opt_iter: int = 1000
    swift_max_tolerance_iter: int = 300
    swift_bayes: bool = True
    swift_seed: int = 2024
    kv: str = "auto"

    def __post_init__(self) -> None:
        require(self.preset in PRESETS, "preset", f"must be one of {PRESETS}, got {self.preset!r}")
        require((self.attn_skip is None) == (self.mlp_skip is None), "attn_skip",
                "and option 'mlp_skip' go together (per-layer booleans, one per decoder layer)")
        require(self.exit_layer is None or (isinstance(self.exit_layer, int) and self.exit_layer >= 1), "exit_layer",
                f"must be an int >= 1 (layers run before the exit), got {self.exit_layer!r}")
        require(0.0 <= self.stop_threshold < 1.0, "stop_threshold", f"must be in [0, 1), got {self.stop_threshold!r}")
        require(self.search in SEARCHES, "search", f"must be one of {SEARCHES}, got {self.search!r}")
        require(self.kv in KV_MODES, "kv", f"must be one of {KV_MODES}, got {self.kv!r}")
        require(self.search == "none" or self.exit_layer is None, "search",
                "'swift' searches skipped sets; it does not combine with 'exit_layer'")
        require(0.0 < self.swift_skip_ratio < 1.0, "swift_skip_ratio", f"must be in (0, 1), got {self.swift_skip_ratio!r}")
        require(self.swift_context_window >= 1 and self.swift_opt_interval >= 1 and self.swift_bayes_interval >= 1,
                "swift_context_window", "and swift_opt_interval, swift_bayes_interval must be >= 1")

    def swift_settings(self) -> SwiftSettings:
        """The ``swift_*`` options as SWIFT's settings."""
        return SwiftSettings(self.swift_skip_ratio, self.swift_context_window, self.swift_max_score,
                             self.swift_opt_interval, self.swift_bayes_interval, self.swift_max_opt_iter,
                             self.swift_max_tolerance_iter, self.swift_bayes, self.swift_seed)


class LayerSkipDrafter(Drafter):
    """The target with a skipped set (or an exit layer) drafts: one partial forward per ``expand``."""

    name: ClassVar[str] = "layerskip"
    Options = LayerSkipOptions
    # Drafts depend only on the committed tokens; a replay computes the context's KV itself
    # (own KV), equal to the live target's up to rounding, and its draft time includes that.
    replay = "approximate"

    def __init__(self, options: LayerSkipOptions, target: TargetModel) -> None:
        super().__init__(options, target)
        self.runner = LayerRunner(target.model, target.attn_implementation)
        layers = self.runner.num_layers
        self.plan: SkipPlan = plan_from_options(options, layers)
        self.stop = StopThreshold(options.stop_threshold, options.adaptive_stop, options.stop_max_draft)
        self.search = SwiftSearch(options.swift_settings(), layers, self.plan) if options.search == "swift" else None
        self.persistent_state = self.search is not None  # SWIFT's state carries across prompts
        self.begin(torch.zeros(1, dtype=torch.long))

    @property
    def stop_threshold(self) -> float | None:
        """The current stop threshold for a chain policy (None: no stop)."""
        return self.stop.value

    # ------------------------------------------------------------------ state
    def begin(self, prompt_ids: torch.Tensor, target_hidden: Any = None) -> None:
        """Start a generation: forget the committed tokens and the own context KV."""
        self.committed: list[int] = [int(t) for t in prompt_ids.tolist()]
        self.prompt_len = len(self.committed)
        self.own: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * self.runner.num_layers
        self.own_len = 0
        self.steps = 0
        self.stop.reset()
        self._new_step()

    def _new_step(self) -> None:
        self.rows: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # scratch K/V of this step
        self.slot_of: dict[int, int] = {}
        self.logp_of: dict[int, torch.Tensor] = {}

    # ------------------------------------------------------------------ context KV
    def _context(self) -> list[tuple[torch.Tensor, torch.Tensor] | None]:
        """Every layer's context K/V (committed tokens but the root): the target's or our own."""
        length = len(self.committed) - 1
        if self.options.kv != "own":
            shared = context_from_cache(self.target.cache, length, self.runner.num_layers)
            if shared is not None:
                return shared
            if self.options.kv == "shared":
                raise RuntimeError(f"drafter 'layerskip' with kv = 'shared': the target's cache does not hold the "
                                   f"{length} committed tokens of one sequence (a replayed or batched target); use kv = 'auto'")
        self._catch_up(length)
        return self.own

    def _catch_up(self, length: int) -> None:
        """Extend the own context KV to ``length`` tokens with one full-model causal forward."""
        if self.own_len >= length:
            return
        dev = self.target.device
        tokens = torch.tensor(self.committed[self.own_len : length], dtype=torch.long, device=dev)
        q = len(tokens)
        visible = torch.ones(q, self.own_len + q, dtype=torch.bool, device=dev)
        visible[:, self.own_len :] = torch.ones(q, q, dtype=torch.bool, device=dev).tril()
        rows: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        positions = torch.arange(self.own_len, length, device=dev)
        self.runner.hidden(tokens, positions, visible, StepKV(self.own, rows), SkipPlan(frozenset(), frozenset()))
        self.own = [rows[i] if self.own[i] is None else (torch.cat([self.own[i][0], rows[i][0]], dim=-2),
                                                          torch.cat([self.own[i][1], rows[i][1]], dim=-2))
                    for i in range(self.runner.num_layers)]
        self.own_len = length

    # ------------------------------------------------------------------ drafting
    def expand(self, tree: DraftTree, nodes: torch.Tensor) -> torch.Tensor:
        """Draft log-probs after each node: one partial forward of the nodes not yet forwarded
        (and their unforwarded ancestors), over the context and this step's drafted rows."""
        n, m = len(tree), len(nodes)
        host = torch.cat([tree.tokens, tree.parents, tree.depths, nodes.to(tree.device)]).tolist()
        tokens, parents, depths, wanted = host[:n], host[n : 2 * n], host[2 * n : 3 * n], host[3 * n : 3 * n + m]
        todo = sorted(_closure(wanted, parents) - set(self.slot_of))
        if todo:
            self._forward(tree, todo, tokens, depths)
        return torch.stack([self.logp_of[node] for node in wanted])

    def _forward(self, tree: DraftTree, todo: list[int], tokens: list[int], depths: list[int]) -> None:
        dev = self.target.device
        context = self._context()
        length = len(self.committed) - 1
        slots = sorted(self.slot_of, key=self.slot_of.get)
        anc = tree.ancestor_mask().to(dev)
        todo_t = torch.tensor(todo, dtype=torch.long, device=dev)
        q, s = len(todo), len(slots)
        visible = torch.ones(q, length + s + q, dtype=torch.bool, device=dev)
        if s:
            visible[:, length : length + s] = anc[todo_t][:, torch.tensor(slots, dtype=torch.long, device=dev)]
        visible[:, length + s :] = anc[todo_t][:, todo_t]
        positions = torch.tensor([length + depths[i] for i in todo], dtype=torch.long, device=dev)
        ids = torch.tensor([tokens[i] for i in todo], dtype=torch.long, device=dev)
        hidden = self.runner.hidden(ids, positions, visible, StepKV(context, self.rows), self.plan)
        logits = self.runner.logits(hidden)
        logp = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
        for j, node in enumerate(todo):
            self.slot_of[node] = len(self.slot_of)
            self.logp_of[node] = logp[j]

    # ------------------------------------------------------------------ commit
    def commit(self, tokens: torch.Tensor, path: torch.Tensor | None = None, target_hidden: Any = None,
               tree: DraftTree | None = None) -> None:
        """Drop this step's draft rows; adapt the stop threshold; run SWIFT's search when due."""
        emitted = [int(t) for t in tokens.tolist()]
        drafted = (len(tree) - 1) if tree is not None else len(self.slot_of)
        self.stop.observe(accepted=len(emitted) - 1, drafted=drafted)
        self.committed += emitted
        self._new_step()
        if self.search is not None and self.search.due(self.steps, len(self.committed) - self.prompt_len):
            self._search_step()
        self.steps += 1

    def _search_step(self) -> None:
        """One SWIFT iteration: score a proposed set on the first ``context_window + 1``
        generated tokens, over the prompt's KV, in one parallel draft forward."""
        search = self.search
        window = search.settings.context_window + 1
        generated = self.committed[self.prompt_len : self.prompt_len + window]
        prompt_kv = [None if kv is None else (kv[0][..., : self.prompt_len, :], kv[1][..., : self.prompt_len, :])
                     for kv in self._context_prefix(self.prompt_len)]
        candidate = search.propose()
        dev = self.target.device
        q = len(generated)
        visible = torch.ones(q, self.prompt_len + q, dtype=torch.bool, device=dev)
        visible[:, self.prompt_len :] = torch.ones(q, q, dtype=torch.bool, device=dev).tril()
        positions = torch.arange(self.prompt_len, self.prompt_len + q, device=dev)
        hidden = self.runner.hidden(torch.tensor(generated, dtype=torch.long, device=dev), positions, visible,
                                    StepKV(prompt_kv, {}), candidate)
        argmax = self.runner.logits(hidden).argmax(dim=-1).tolist()
        self.plan = search.record(candidate, match_rate(argmax, generated))

    def _context_prefix(self, length: int) -> list[tuple[torch.Tensor, torch.Tensor] | None]:
        """Every layer's K/V holding at least the first ``length`` committed tokens."""
        cache = getattr(self.target, "cache", None)
        if self.options.kv != "own" and cache is not None:
            full = getattr(self.target, "cache_len", 0)
            shared = context_from_cache(cache, full, self.runner.num_layers) if full >= length else None
            if shared is not None:
                return shared
        self._catch_up(max(length, self.own_len))
        return self.own


def _closure(nodes: list[int], parents: list[int]) -> set[int]:
    """``nodes`` and all their ancestors."""
    seen: set[int] = set()
    for node in nodes:
        while node >= 0 and node not in seen:
            seen.add(node)
            node = parents[node]
    return seen
