"""Projected wall clock of a replayed run.

A replayed step runs the drafter and the policy for real and the target not at all. Its
projected time is::

    T(n, L)                    the cost curve: one target forward of the n-node tree at context L
  + draft_time + policy_time   measured during the replay (the same code as live)
  + rest(n) = a + b (n - 1)    verification, read-back and cache compaction (``verify_time`` +
                               ``kv_time``), fitted at record time on live steps of the
                               recording arm
  + the step's other fields    the drafter's commit and the engine's bookkeeping, measured
                               during the replay

An autoregressive step is the curve's T(1, L) times the ratio of a measured autoregressive step
to it, taken at record time (a causal forward, not the curve's tree forward).

A generation adds its prefill (measured at record time, or T(L - 1) of the curve when another
curve is given) and the replay's own time outside steps (the drafter's ``begin``).
:class:`ProjectedPolicy` writes these times into each step's ``StepStats`` before the policy
observes it, so auto-sized policies see projected times, as they would see measured ones live.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Iterator

from specframe.interfaces import DraftSession, StepStats, TreePolicy
from specframe.sizing.profile import CostCurve


@dataclass
class StepModel:
    """The projection's parameters: the curve, the per-step rest and the autoregressive overhead.

    Attributes:
        curve: T(n, L) in seconds.
        curve_source: where the curve came from (printed in the report).
        rest_fixed, rest_per_node: the rest of a speculative step, a + b (n - 1), seconds.
        ar_ratio: an autoregressive step's measured time / the curve's T(1, L), at record time
            (1.0 with another machine's curve)
        prefill_from_curve: price prefills with the curve (another machine's curve) instead of
            the recorded prefill times.
        curve_scale: measured / curve target time of the recording run's steps (median): the
            trace's own curve, measured apart from the run, is scaled to the machine's state
            while recording; another machine's curve is taken as it is (1.0).
        identity: the curve's key and content hash (run.json ties projected times to them).
    """

    curve: CostCurve
    curve_source: str
    rest_fixed: float = 0.0
    rest_per_node: float = 0.0
    ar_ratio: float = 1.0
    prefill_from_curve: bool = False
    curve_scale: float = 1.0
    identity: dict = field(default_factory=dict)

    def target_seconds(self, n: int, context: int) -> float:
        """T(n) with ``context - 1`` tokens cached (the root enters with the tree)."""
        return self.curve_scale * self.curve.time(n, max(context - 1, 0))

    def batch_step_seconds(self, rows: int, context: int) -> tuple[float, float]:
        """``(target, rest)`` seconds of a batched step whose forward computes ``rows`` rows
        (all trees' nodes, padding included) with at most ``context`` tokens committed: the
        curve prices them as one sequence's ``rows``-node tree at the longest context. The
        linears, which dominate a CPU forward, see the same rows; attention over several
        prefixes is priced as over one, so a replayed batch's time is an approximation
        (its tokens, steps and draft forwards are exact)."""
        return self.target_seconds(rows, context), self.rest_seconds(rows)

    def ar_seconds(self, context: int) -> float:
        """One autoregressive step after ``context`` tokens."""
        return self.ar_ratio * self.curve.time(1, context)

    def ar_batch_seconds(self, rows: int, context: int) -> float:
        """One batched autoregressive step of ``rows`` sequences, the longest at ``context``
        (priced as :meth:`batch_step_seconds` prices a speculative one)."""
        return self.ar_ratio * self.curve.time(rows, context)

    def rest_seconds(self, n: int) -> float:
        """Verification, read-back and compaction of an n-node tree."""
        return self.rest_fixed + self.rest_per_node * max(n - 1, 0)

    def prefill_seconds(self, prompt_len: int, recorded: float) -> float:
        """The prefill of a ``prompt_len``-token prompt (the root enters with the first tree)."""
        if self.prefill_from_curve or recorded <= 0:
            return self.curve_scale * self.curve.time(max(prompt_len - 1, 1), 0) if prompt_len > 1 else 0.0
        return recorded

    def describe(self) -> str:
        """One line stating the model (the report prints it)."""
        scale = f" x {self.curve_scale:.3f} (recorded steps / curve)" if self.curve_scale != 1.0 else ""
        return (f"projected step = T(n, L) from {self.curve_source}{scale} + measured draft, policy and commit time "
                f"+ rest {self.rest_fixed * 1e3:.3f} ms + {self.rest_per_node * 1e3:.4f} ms per drafted node; "
                f"autoregressive step = {self.ar_ratio:.3f} x T(1, L) (measured when recorded); prefill "
                + ("T(L-1) of the curve" if self.prefill_from_curve else "as recorded"))


def fit_rest(samples: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares ``(a, b)`` of seconds = a + b (n - 1) over ``(n, seconds)``; b >= 0."""
    if not samples:
        return 0.0, 0.0
    xs = [n - 1 for n, _ in samples]
    ys = [s for _, s in samples]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    slope = max(sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var, 0.0) if var > 0 else 0.0
    return max(my - slope * mx, 0.0), slope


class ProjectedPolicy(TreePolicy):
    """Wraps a policy so every step it observes carries projected times (see the module doc).

    The wrapped step's ``target_time`` becomes T(n, L), ``verify_time`` the fitted rest and
    ``kv_time`` 0 (the rest holds the cache's work);
    :attr:`replaced` / :attr:`added` sum what was taken out and put in, so a generation's
    projected wall time is its replay wall time - replaced + added (+ the prefill).
    """

    def __init__(self, inner: TreePolicy, model: StepModel, target: Any) -> None:
        super().__init__(inner.options)
        self.inner = inner
        self.name = inner.name
        self.model = model
        self.target = target
        self.replaced = 0.0
        self.added = 0.0

    @property
    def max_budget(self) -> int:
        """The wrapped policy's largest tree."""
        return self.inner.max_budget

    def __getattr__(self, name: str) -> Any:
        # Anything else the engine or a caller reads is the wrapped policy's.
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def reset(self) -> None:
        """Reset the wrapped policy and the time sums."""
        self.inner.reset()
        self.replaced = self.added = 0.0

    def attach(self, target: Any) -> None:
        """The wrapped policy reads the projection's curve (see :func:`curve_installed`)."""
        with curve_installed(target, self.model.curve):
            self.inner.attach(target)

    def build(self, session: DraftSession, budget: int) -> Any:
        """The wrapped policy's tree."""
        return self.inner.build(session, budget)

    def observe(self, step: StepStats) -> None:
        """Project ``step``'s target and rest time, then let the wrapped policy learn from it."""
        target_t = self.model.target_seconds(step.tree_size, self.target.last_context)
        rest_t = self.model.rest_seconds(step.tree_size)
        self.replaced += step.target_time + step.verify_time + step.kv_time
        self.added += target_t + rest_t
        step.target_time, step.verify_time, step.kv_time = target_t, rest_t, 0.0
        self.inner.observe(step)


@contextlib.contextmanager
def curve_installed(target: Any, curve: CostCurve) -> Iterator[None]:
    """Make :func:`specframe.sizing.profile.curve_for` answer ``curve`` for ``target`` (auto-sized
    policies price trees with the projection's curve, never measure the replay target), and
    restore the process's curve cache afterwards."""
    from specframe.sizing import profile

    key = profile.curve_key(target.model, target.device, target.dtype)
    slot = (profile.cache_dir(), key)
    old = profile._MEMO.get(slot)
    profile._MEMO[slot] = curve
    try:
        yield
    finally:
        if old is None:
            profile._MEMO.pop(slot, None)
        else:
            profile._MEMO[slot] = old
