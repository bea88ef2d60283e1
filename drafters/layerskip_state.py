"""The ``layerskip`` drafter's small pieces of state: its skipped set from options, and Draft &
Verify's stop threshold (fixed or adapted after each step)."""

from __future__ import annotations

from typing import Any

from specframe.options import OptionError

from .layerskip_forward import SkipPlan, preset_plan

#: Draft & Verify's ``auto_parameters`` default: every 1 step, matchness EMA weight 0.5, target
#: 0.9, step 1e-2, threshold EMA weight 0.9.
AUTO_PARAMETERS = (1, 0.5, 0.9, 1e-2, 0.9)


def plan_from_options(options: Any, layers: int) -> SkipPlan:
    """The skipped set ``options`` name over ``layers`` decoder layers: ``exit_layer``, else the
    per-layer booleans, else the preset. OptionError names a value that does not fit the model."""
    if options.exit_layer is not None:
        if options.exit_layer > layers:
            raise OptionError(f"option 'exit_layer' of drafter 'layerskip' is {options.exit_layer} but the model has "
                              f"{layers} layers (valid: 1 .. {layers})")
        return SkipPlan.exit_after(options.exit_layer, layers)
    if options.attn_skip is not None:
        for name in ("attn_skip", "mlp_skip"):
            flags = getattr(options, name)
            if len(flags) != layers or not all(isinstance(f, bool) for f in flags):
                raise OptionError(f"option {name!r} of drafter 'layerskip' must be {layers} booleans (one per "
                                  f"decoder layer, True: skipped), got {list(flags)!r}")
        return SkipPlan.from_lists([i for i, f in enumerate(options.attn_skip) if f],
                                   [i for i, f in enumerate(options.mlp_skip) if f])
    return preset_plan(options.preset, layers, options.skip_ratio, options.skip_seed)


class StopThreshold:
    """Draft & Verify's stop threshold ``th_stop_draft``: a chain stops after a drafted token
    whose draft probability is below it. With ``adaptive`` it follows ``auto_th_stop_draft``
    (decoding.py, ``exact_self_speculative_generate``): after each verification the matchness
    ``accepted / drafted`` enters an EMA; below the target 0.9 the threshold rises by 0.01,
    else it falls by 0.01 unless the whole ``max_draft`` chain was drafted, and the threshold
    moves to 0.9 * old + 0.1 * new."""

    def __init__(self, initial: float, adaptive: bool, max_draft: int = 8) -> None:
        self.initial = float(initial)
        self.adaptive = adaptive
        self.max_draft = max_draft
        self.reset()

    def reset(self) -> None:
        """Back to the initial threshold (a new generation, as each call of the reference)."""
        self.threshold = self.initial
        self.matchness = 0.0
        self.verified = 0
        self.trajectory: list[float] = []

    @property
    def value(self) -> float | None:
        """The threshold, or None when drafting never stops on confidence."""
        return self.threshold if self.threshold > 0.0 or self.adaptive else None

    def observe(self, accepted: int, drafted: int) -> None:
        """One verified step: ``accepted`` of ``drafted`` tokens."""
        if not self.adaptive or drafted <= 0:
            return
        every, weight, aim, delta, inertia = AUTO_PARAMETERS
        self.verified += 1
        if self.verified % every:
            return
        self.matchness = weight * self.matchness + (1 - weight) * (accepted / drafted)
        if self.matchness < aim:
            new = self.threshold + delta
        else:
            new = self.threshold if drafted == self.max_draft else self.threshold - delta
        self.threshold = inertia * self.threshold + (1 - inertia) * new
        self.trajectory.append(self.threshold)
