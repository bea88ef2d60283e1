"""SWIFT's on-the-fly search over the skipped set (hemingkx/SWIFT, ``swift_optimization``).

While the model generates, every ``opt_interval``-th step (once more than ``context_window + 1``
tokens were generated) proposes another skipped set, scores it by its match rate (the share of
the first ``context_window`` generated tokens the skipping draft predicts, all in one parallel
draft forward over the prompt's KV) and keeps it when it beats the best score so far. Proposals
are random (``int(skip_ratio * 2 (L - 2))`` inner sublayers; first and last layer kept), and
every ``bayes_interval``-th one (with ``bayes``) comes from a Bayesian optimiser over the
``2 (L - 2)`` per-sublayer scores in [0, 1] (the top ones are skipped). The search stops when a
score exceeds ``max_score``, after ``max_tolerance_iter`` proposals without improvement, or
after ``max_opt_iter`` proposals. Its state (best set and score, counters, optimiser) lives on
the drafter and carries across prompts, as SWIFT's ``statistics`` dict does.

The random draws equal SWIFT's for the same seed (its global ``np.random`` is a
``RandomState``; here one is held per drafter). SWIFT's Bayesian step is ``bayes_opt``'s GP
with UCB (kappa 2.5); here it is Optuna's TPE sampler (seeded) over the same per-sublayer
parameters, with every probed point, random ones included, told to it: the same role, another
optimiser, documented in docs/drafters.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy

from .layerskip_forward import SkipPlan, random_sets


@dataclass
class SwiftSettings:
    """SWIFT's search settings (its command-line defaults)."""

    skip_ratio: float = 0.45
    context_window: int = 32
    max_score: float = 0.95
    opt_interval: int = 1
    bayes_interval: int = 25
    max_opt_iter: int = 1000
    max_tolerance_iter: int = 300
    bayes: bool = True
    seed: int = 2024


@dataclass
class SwiftState:
    """SWIFT's ``statistics``: what the search has found and how far it went."""

    origin_score: float = 0.0
    opt_iter: int = 0
    tolerance_iter: int = 0
    optimization: bool = True
    scores: list[float] = field(default_factory=list)


class SwiftSearch:
    """The search of one drafter over a model of ``layers`` decoder layers."""

    def __init__(self, settings: SwiftSettings, layers: int, plan: SkipPlan) -> None:
        self.settings = settings
        self.layers = layers
        self.plan = plan
        self.state = SwiftState(optimization=layers > 2)  # two layers: nothing inner to skip
        self.rng = numpy.random.RandomState(settings.seed)
        self._study: Any = None
        self._trial: Any = None

    @property
    def skip_count(self) -> int:
        """Sublayers each proposal skips: ``int(2 (L - 2) skip_ratio)``."""
        return int((self.layers - 2) * 2 * self.settings.skip_ratio)

    def due(self, step: int, new_tokens: int) -> bool:
        """Whether step ``step`` (0-based, of this generation) with ``new_tokens`` generated
        tokens runs a search iteration (SWIFT's test after ``update_inference_inputs``)."""
        s = self.settings
        return self.state.optimization and new_tokens > s.context_window + 1 and step % s.opt_interval == 0

    def propose(self) -> SkipPlan:
        """The next skipped set to score: a Bayesian suggestion every ``bayes_interval``-th
        iteration (with ``bayes``), else a random draw."""
        s = self.settings
        if s.bayes and (self.state.opt_iter + 1) % s.bayes_interval == 0:
            return self._suggest()
        attn, mlp = random_sets(self.layers, s.skip_ratio, self.rng)
        self._trial = None
        return SkipPlan.from_lists(attn, mlp)

    def record(self, candidate: SkipPlan, score: float) -> SkipPlan:
        """Score ``candidate``; keep it when it beats the best so far. Returns the plan to draft with."""
        st, s = self.state, self.settings
        st.scores.append(score)
        self._tell(candidate, score)
        if score > st.origin_score:
            st.origin_score = score
            st.tolerance_iter = 0
            self.plan = candidate
            if score > s.max_score:
                st.optimization = False
        else:
            st.tolerance_iter += 1
        st.opt_iter += 1
        if st.tolerance_iter > s.max_tolerance_iter or st.opt_iter > s.max_opt_iter:
            st.optimization = False
        return self.plan

    # ------------------------------------------------------------------ the Bayesian step
    def _names(self) -> list[str]:
        return [f"x{i}" for i in range(2 * (self.layers - 2))]

    def _point(self, plan: SkipPlan) -> dict[str, float]:
        """SWIFT's ``get_next_point_to_probe``: 1.0 for a skipped sublayer, else 0.0."""
        inner = self.layers - 2
        return {f"x{i}": float((i % inner) + 1 in (plan.attn if i < inner else plan.mlp))
                for i in range(2 * inner)}

    def _study_now(self) -> Any:
        if self._study is None:
            try:
                import optuna
            except ImportError as err:
                raise ImportError("drafter 'layerskip' with search = 'swift': its Bayesian step uses Optuna; "
                                  "pip install 'specframe[tune]', or set swift_bayes = false") from err

            optuna.logging.set_verbosity(optuna.logging.WARNING)
            sampler = optuna.samplers.TPESampler(seed=self.settings.seed)
            self._study = optuna.create_study(direction="maximize", sampler=sampler)
        return self._study

    def _distributions(self) -> dict[str, Any]:
        import optuna

        return {name: optuna.distributions.FloatDistribution(0.0, 1.0) for name in self._names()}

    def _suggest(self) -> SkipPlan:
        """SWIFT's ``layer_bayes_search``: the top ``skip_count`` suggested scores are skipped."""
        study = self._study_now()
        self._trial = study.ask(self._distributions())
        point = self._trial.params
        ranked = sorted(point.items(), reverse=True, key=lambda item: item[1])
        chosen = {name for name, _ in ranked[: self.skip_count]}
        inner = self.layers - 2
        attn = [i + 1 for i in range(inner) if f"x{i}" in chosen]
        mlp = [i + 1 for i in range(inner) if f"x{i + inner}" in chosen]
        return SkipPlan.from_lists(attn, mlp)

    def _tell(self, candidate: SkipPlan, score: float) -> None:
        if not self.settings.bayes:
            return
        study = self._study_now()
        if self._trial is not None:
            study.tell(self._trial, score)
            self._trial = None
            return
        import optuna

        study.add_trial(optuna.trial.create_trial(params=self._point(candidate), distributions=self._distributions(),
                                                  value=score))


def match_rate(draft_argmax: list[int], generated: list[int]) -> float:
    """SWIFT's score: the share of ``generated[1:]`` the draft predicted at the position before
    (``draft_argmax[j]`` after ``generated[j]``)."""
    target = generated[1:]
    hits = sum(1 for a, b in zip(draft_argmax[:-1], target) if a == b)
    return hits / len(target)
