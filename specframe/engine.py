"""SpecDecoder: prefill -> [build tree -> verify in one target forward -> commit] loop."""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from .contract import STRICT_VARIABLE, EngineError, checked_decision, reject_tree, strict_default, tree_flag  # noqa: F401
from .interfaces import DraftSession, Drafter, StepStats, TreePolicy, Verifier, logits_keyword, wants_prompt_logits
from .options import build_options
from .plugins import SINGULAR, get_registry
from .target import TargetModel
from .step_read import read_step
from .tree import DraftTree

PluginSpec = Any  # "name" | ("name", {options}) | instance

@dataclass
class GenerationOutput:
    """Result of one ``generate`` call."""

    tokens: list[int]
    steps: list[StepStats] = field(default_factory=list)
    wall_time: float = 0.0
    stopped_at_eos: bool = False

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


def _split_spec(spec: PluginSpec) -> tuple[str, dict]:
    if isinstance(spec, str):
        return spec, {}
    if isinstance(spec, (tuple, list)) and len(spec) == 2 and isinstance(spec[0], str):
        return spec[0], dict(spec[1] or {})
    raise TypeError(f"plugin spec must be a name, (name, options) or an instance, got {spec!r}")


def make_plugin(kind: str, spec: PluginSpec, *extra: Any) -> Any:
    """Instantiate a plugin of ``kind`` from a name, ``(name, options)`` or pass an instance."""
    base = {"policies": TreePolicy, "drafters": Drafter, "verifiers": Verifier}[kind]
    if isinstance(spec, base):
        return spec
    name, values = _split_spec(spec)
    cls = get_registry().get(kind, name)
    options = build_options(cls.Options, values, f"{SINGULAR[kind]} {name!r}")
    return cls(options, *extra)


def _as_prompt(input_ids: Any) -> torch.Tensor:
    ids = torch.as_tensor(input_ids, dtype=torch.long)
    if ids.dim() == 2:
        if ids.shape[0] != 1:
            raise ValueError(f"batch size {ids.shape[0]} is not supported: pass one prompt ([1, L] or [L])")
        ids = ids[0]
    if ids.dim() != 1 or ids.numel() == 0:
        raise ValueError("prompt is empty: pass at least one token id")
    return ids


def _eos_set(eos: int | Sequence[int] | None) -> set[int]:
    if eos is None:
        return set()
    if isinstance(eos, int):
        return {eos}
    return {int(e) for e in eos}


class SpecDecoder:
    """Speculative decoding with draft trees: any drafter x policy x verifier.

    ``strict``: check every tree in full on the host (:meth:`DraftTree.check_valid`) before the
    target forward, and the verifier's decision is in range after it. It names a broken plugin
    at the step that broke it, but reads the device several times per step. Off, the engine
    still refuses every invalid tree with an :class:`EngineError` naming the invariant, from
    the validity flag it reads with the verdict in its one host read per step. None (default):
    on iff the ``SPECFRAME_STRICT`` environment variable is set (the pytest plugin sets it, so
    tests run strict). The output is the same either way.
    """

    def __init__(
        self, target: TargetModel, drafter: Drafter, policy: TreePolicy, verifier: Verifier,
        strict: bool | None = None,
    ) -> None:
        self.target = target
        self.drafter = drafter
        self.policy = policy
        self.verifier = verifier
        self.strict = strict_default() if strict is None else bool(strict)
        if drafter.vocab_size != target.vocab_size:
            raise ValueError(
                f"drafter {drafter.name!r} has vocabulary size {drafter.vocab_size}, the target has "
                f"{target.vocab_size}: the pair must share one tokenizer"
            )
        policy.attach(target)  # e.g. "auto" sizes read (or measure once) the cost curve

    @classmethod
    def build(
        cls,
        target: Any,
        drafter: PluginSpec = "model",
        policy: PluginSpec = "chain",
        verifier: PluginSpec = "greedy",
        strict: bool | None = None,
        compile: bool = False,
    ) -> "SpecDecoder":
        """Assemble a decoder from a transformers model (or TargetModel) and plugin specs.

        Each spec is a registered name, a ``(name, options_dict)`` pair or an instance.
        Options are checked before any drafter model loads. ``strict``: see
        :class:`SpecDecoder`. ``compile``: run the target's forward through ``torch.compile``
        (:meth:`TargetModel.compile`; see docs/performance.md for when it pays). KV-cache
        pre-allocation is the target's option: pass ``TargetModel(model, preallocate=...)``.
        """
        tgt = target if isinstance(target, TargetModel) else TargetModel(target)
        if compile and not tgt.compiled:
            tgt.compile()
        pol = make_plugin("policies", policy)
        ver = make_plugin("verifiers", verifier)
        dra = make_plugin("drafters", drafter, tgt)
        return cls(tgt, dra, pol, ver, strict=strict)

    @property
    def _needs_hidden(self) -> bool:
        return bool(getattr(self.drafter, "needs_target_hidden", False))

    # ------------------------------------------------------------------ generation
    def generate(
        self,
        input_ids: Any,
        max_new_tokens: int = 128,
        eos_token_id: int | Sequence[int] | None = -1,
        generator: torch.Generator | None = None,
        temperature: float | None = None,
        seed: int | None = None,
        on_step: Callable[[StepView], None] | None = None,
    ) -> GenerationOutput:
        """Generate up to ``max_new_tokens`` tokens after ``input_ids``.

        ``eos_token_id``: stop after emitting any of these ids; the default (-1) takes the
        target's ``generation_config.eos_token_id``; None disables EOS stopping.
        ``temperature``: None keeps the verifier's own setting; 0 verifies with exact greedy;
        > 0 needs a sampling verifier and overrides its temperature for this call.
        ``seed`` / ``generator``: randomness of this call for the verifier and for policies
        that sample children (the same seed gives the same output); neither = the plugins'
        own generators (their ``seed`` options) or torch's global one.
        ``on_step``: called after every verified step with a :class:`StepView` (the tree, the
        accepted path, the step's statistics); its time counts in the step's wall time, so
        keep it cheap (keep references, read later). None: nothing is built for it.
        """
        verifier = self._verifier_for(temperature)
        if seed is not None:
            if generator is not None:
                raise ValueError("pass either seed or generator to generate(), not both")
            generator = torch.Generator().manual_seed(int(seed))
        prompt = _as_prompt(input_ids)
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        need = len(prompt) + max_new_tokens
        if need > self.max_positions:
            whose = "target's" if self.max_positions == self.target.max_positions else "draft model's"
            raise ValueError(
                f"prompt ({len(prompt)} tokens) + max_new_tokens ({max_new_tokens}) = {need} exceeds "
                f"the {whose} {self.max_positions} positions"
            )
        eos = _eos_set(self.target.eos_token_id if eos_token_id == -1 else eos_token_id)
        start = time.perf_counter()
        self.target.reset(capacity=need + self.policy.max_budget)  # used if the target pre-allocates
        hidden = logits = None
        if len(prompt) > 1:
            # The root (last prompt token) enters with the first tree, as in EAGLE. No caller
            # reads the prefill's logits unless the drafter asks for them: skip their lm_head rows.
            prompt_logits = wants_prompt_logits(self.drafter)
            prefill = self.target.causal_forward(prompt[:-1].to(self.target.device), self._needs_hidden,
                                                 last_logits_only=not prompt_logits)
            hidden = prefill.hidden_states if self._needs_hidden else None
            logits = prefill.logits[0] if prompt_logits else None
        self.drafter.begin(prompt, target_hidden=hidden, **self._logits_kw(logits))
        self.policy.reset()
        committed = prompt.tolist()
        out = GenerationOutput(tokens=[])
        while len(out.tokens) < max_new_tokens:
            emitted, stats, view = self._step(committed, max_new_tokens - len(out.tokens), eos, generator,
                                              verifier, on_step is not None)
            committed += emitted
            out.tokens += emitted
            out.steps.append(stats)
            self.policy.observe(stats)
            if view is not None:
                on_step(view)
            if eos and emitted[-1] in eos:
                out.stopped_at_eos = True
                break
        self.drafter.finish(torch.tensor(out.tokens, dtype=torch.long))
        out.wall_time = time.perf_counter() - start
        return out

    def _logits_kw(self, logits: torch.Tensor | None) -> dict[str, Any]:
        """``target_logits=`` for a drafter that declares ``needs_target_logits``; nothing for
        the others, whose ``begin``/``commit`` may not take the keyword."""
        return logits_keyword(self.drafter, logits)

    def _verifier_for(self, temperature: float | None) -> Verifier:
        """The verifier of one generate call: ``temperature`` 0 = exact greedy, > 0 overrides
        a sampling verifier's temperature (a shallow copy, so it shares its generator)."""
        if temperature is None:
            return self.verifier
        if not math.isfinite(temperature) or temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {temperature}")
        if temperature == 0:
            return make_plugin("verifiers", "greedy")
        name = self.verifier.name
        if not getattr(self.verifier, "sampling", False):
            raise ValueError(
                f"temperature={temperature} needs a sampling verifier, but verifier {name!r} is not "
                f"one (it is lossless for greedy decoding only): build the decoder with "
                f"verifier=('sampling', {{'temperature': {temperature}}}) or pass temperature=0"
            )
        try:
            options = dataclasses.replace(self.verifier.options, temperature=float(temperature))
        except TypeError as err:
            raise ValueError(f"verifier {name!r} has no 'temperature' option to override") from err
        verifier = copy.copy(self.verifier)
        verifier.options = options
        return verifier

    @property
    def max_positions(self) -> int:
        """The context both models hold: the target's positions, or a draft model's when fewer
        (a drafter's ``max_positions``; None means no limit of its own)."""
        own = getattr(self.drafter, "max_positions", None)
        return self.target.max_positions if own is None else min(self.target.max_positions, int(own))

    def _build_tree(self, committed: list[int], generator: torch.Generator | None = None):
        session = DraftSession(self.drafter, committed[-1], self.target.device, generator,
                               context_len=len(committed))
        # The engine alone bounds the tree: the policy's largest, or the room left in the context.
        limit = min(self.policy.max_budget, self.max_positions - (len(committed) - 1))
        tree = self.policy.build(session, limit)
        return tree, session, limit

    def _step(
        self, committed: list[int], remaining: int, eos: set[int], generator, verifier: Verifier,
        want_view: bool = False,
    ) -> tuple[list[int], StepStats, StepView | None]:
        t0 = time.perf_counter()
        tree, session, limit = self._build_tree(committed, generator)
        ok = tree_flag(self.policy.name, tree, committed[-1], limit, self.strict)
        t1 = time.perf_counter()
        out = self.target.tree_forward(
            tree.tokens, tree.positions(len(committed)), tree.ancestor_mask(),
            output_hidden_states=self._needs_hidden,
            # The engine's limit already keeps every position in range: no device max to read.
            max_position=len(committed) - 2 + len(tree),
        )
        logits = out.logits[0]
        t2 = time.perf_counter()
        try:
            last, bonus = checked_decision(verifier.name, tree, verifier.verify(tree, logits, generator),
                                           self.target.vocab_size, self.strict)
        except Exception:
            # An invalid tree (its flag is not read yet) can break a verifier: name the tree.
            reject_tree(self.policy.name, tree, committed[-1], limit)
            raise
        read = read_step(tree, last, bonus, ok)  # the step's one host read
        if not read.ok:
            reject_tree(self.policy.name, tree, committed[-1], limit)
            raise EngineError(f"policy {self.policy.name!r} returned an invalid tree")
        t3 = time.perf_counter()
        emitted = read.tokens
        finished = len(emitted) >= remaining or any(t in eos for t in emitted)
        emitted = emitted[:remaining]
        for i, tok in enumerate(emitted):
            if tok in eos:
                emitted = emitted[: i + 1]
                break
        if not finished:
            # Cache held L-1 entries before the tree; keep the accepted path (root first) behind them.
            self.target.keep(len(committed) - 1, read.path, contiguous=read.contiguous)
        # The last step commits too (a drafter that learns from verifications sees them all),
        # with the verifier's whole decision even where max_new_tokens or EOS cut the output.
        hidden = out.hidden_states if self._needs_hidden else None
        self.drafter.commit(torch.tensor(read.tokens, dtype=torch.long), read.path, hidden, tree=tree,
                            **self._logits_kw(logits))
        t4 = time.perf_counter()
        draft_time = session.draft_time
        stats = StepStats(
            tree_size=len(tree),
            depth=len(read.widths) - 1,
            accepted=len(read.ranks),
            emitted=len(emitted),
            draft_forwards=session.draft_forwards,
            draft_time=draft_time,
            policy_time=(t1 - t0) - draft_time,
            target_time=t2 - t1,
            verify_time=t3 - t2,
            other_time=t4 - t3,
            widths=read.widths,
            accepted_ranks=read.ranks,
            budget_cut=self.policy.max_budget - limit,
        )
        return emitted, stats, StepView(tree, read.path, stats) if want_view else None
