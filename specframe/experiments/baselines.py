"""Baseline arms run in the same harness as specframe arms, on the same prompts.

``autoregressive``: a plain greedy loop over the same :class:`~specframe.models.target.TargetModel`
adapter the engine uses (prefill through ``causal_forward``, then one token per forward): the
denominator of every speedup. ``hf-assisted`` and ``hf-prompt-lookup``: what a user would pick
instead of specframe, transformers' ``generate(assistant_model=...)`` and
``generate(prompt_lookup_num_tokens=...)``.

Every arm is a runner with ``generate(prompt, max_new_tokens, eos, generator) -> ArmOutput``.
"""

from __future__ import annotations

import contextlib
import copy
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from specframe.models.row_argmax import row_argmax
from specframe.options import NoOptions, require

HF_SCHEDULES = ("constant", "heuristic", "heuristic_transient")


@dataclass
class ArmOutput:
    """What one generation of any arm reports.

    Attributes:
        tokens: generated token ids.
        target_forwards: target forwards that produced them (the verification passes; the
            autoregressive prefill counts, since it yields the first token).
        draft_forwards: drafter forwards (0 for model-free and autoregressive arms).
        accept_lengths: tokens emitted per target forward (Spec-Bench's ``accept_lengths``).
        steps: the engine's per-step statistics (specframe arms only).
        trees: the engine's :class:`~specframe.decode.engine.StepView` of every step (tree, accepted
            path, stats; specframe arms only); the record keeps a few of them.
        nll: the tokens' negative log-likelihood under the target (nats, summed), when scored.
        prefill_time: seconds of the target's forward over the prompt, None where the arm has
            no separate prefill to time (transformers' arms merge it into their first
            verification forward; a batch prefills its rows together).
        time_to_first_token: seconds from the call to the first token on the host, None where
            not measured.
    """

    tokens: list[int]
    target_forwards: int
    draft_forwards: int
    accept_lengths: list[int]
    steps: list | None = None
    trees: list = field(default_factory=list)
    nll: float | None = None
    prefill_time: float | None = None
    time_to_first_token: float | None = None


# ---------------------------------------------------------------------- options
@dataclass
class HFAssistedOptions:
    """Options of the ``hf-assisted`` baseline (None = transformers' default).

    Attributes:
        assistant: the assistant model: a ``[models]`` alias, path, hub id or shipped name;
            default: the ``model`` option of the ``[drafter]`` defaults.
        num_assistant_tokens: tokens drafted per step (start value of the schedule).
        num_assistant_tokens_schedule: ``constant``, ``heuristic`` or ``heuristic_transient``.
        assistant_confidence_threshold: stop drafting below this draft probability.
    """

    assistant: str | None = None
    num_assistant_tokens: int | None = None
    num_assistant_tokens_schedule: str | None = None
    assistant_confidence_threshold: float | None = None

    def __post_init__(self) -> None:
        require(self.num_assistant_tokens is None or self.num_assistant_tokens >= 1, "num_assistant_tokens", "must be >= 1")
        require(self.num_assistant_tokens_schedule in (None, *HF_SCHEDULES), "num_assistant_tokens_schedule",
                f"must be one of {HF_SCHEDULES}, got {self.num_assistant_tokens_schedule!r}")
        require(self.assistant_confidence_threshold is None or 0 <= self.assistant_confidence_threshold <= 1,
                "assistant_confidence_threshold", "must be in [0, 1]")


@dataclass
class HFPromptLookupOptions:
    """Options of the ``hf-prompt-lookup`` baseline.

    Attributes:
        prompt_lookup_num_tokens: tokens copied from the context per step.
        max_matching_ngram_size: longest n-gram matched (None = transformers' default, 2).
    """

    prompt_lookup_num_tokens: int = 10
    max_matching_ngram_size: int | None = None

    def __post_init__(self) -> None:
        require(self.prompt_lookup_num_tokens >= 1, "prompt_lookup_num_tokens", "must be >= 1")
        require(self.max_matching_ngram_size is None or self.max_matching_ngram_size >= 1,
                "max_matching_ngram_size", "must be >= 1")


# ---------------------------------------------------------------------- runners
class AutoregressiveRunner:
    """Plain greedy decoding over the target adapter: prefill, then one token per forward."""

    greedy = True

    def __init__(self, target: Any) -> None:
        self.target = target

    def generate(self, prompt: list[int], max_new_tokens: int, eos: set[int], generator: Any = None) -> ArmOutput:
        """Greedy continuation of ``prompt``; stops after ``max_new_tokens`` or an EOS token."""
        start = time.perf_counter()
        tgt = self.target
        tgt.reset()
        before = time.perf_counter()
        # Only the last row is read: computing the prompt's other lm_head rows would tax the
        # baseline, which the speculative arms' prefill does not pay either.
        logits = tgt.causal_forward(torch.tensor(prompt, dtype=torch.long, device=tgt.device),
                                    last_logits_only=True).logits[0, -1]
        tokens: list[int] = []
        prefill = first = None
        while True:
            tok = int(row_argmax(logits, fresh=True))  # the greedy verdict's argmax: the arms compare like for like
            if first is None:  # the host read above waited for the prefill: it yields token one
                first = time.perf_counter()
                prefill = first - before
            tokens.append(tok)
            if len(tokens) >= max_new_tokens or tok in eos:
                break
            logits = tgt.causal_forward(torch.tensor([tok], dtype=torch.long, device=tgt.device)).logits[0, -1]
        return ArmOutput(tokens, target_forwards=len(tokens), draft_forwards=0, accept_lengths=[1] * len(tokens),
                         prefill_time=prefill, time_to_first_token=first - start)


class _StepStreamer:
    """A transformers streamer that records how many tokens each target forward emitted, and
    when (``perf_counter``: the tokens are on the host then)."""

    def __init__(self) -> None:
        self.puts: list[int] = []
        self.times: list[float] = []

    def put(self, value: torch.Tensor) -> None:
        self.puts.append(int(value.numel()))
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


@contextlib.contextmanager
def _counting_forwards(module: Any):
    """Count ``module``'s forward calls (a list holding one int)."""
    count = [0]
    handle = None if module is None else module.register_forward_hook(lambda *_: count.__setitem__(0, count[0] + 1))
    try:
        yield count
    finally:
        if handle is not None:
            handle.remove()


@contextlib.contextmanager
def _quiet_transformers():
    """Silence transformers' generation advice for the duration of a timed call."""
    from transformers.utils import logging

    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(level)


class HFGenerateRunner:
    """transformers ``generate`` with assisted or prompt-lookup decoding, greedy.

    Target forwards are counted through a streamer (one ``put`` per forward after the prompt),
    assistant forwards through a forward hook. transformers merges the prefill into the first
    verification forward, so its forwards are comparable with the engine's.
    """

    greedy = True

    def __init__(self, model: Any, generation: dict, assistant: Any = None, assistant_generation: dict | None = None) -> None:
        self.model = model
        self.assistant = assistant
        self.generation = {k: v for k, v in generation.items() if v is not None}
        self._assistant_config = None
        if assistant is not None:
            # transformers reads num_assistant_tokens & co. from the ASSISTANT's generation
            # config. This arm's own copy is swapped in per call (the assistant may be shared
            # with other arms); it persists across calls, so the heuristic schedule carries
            # over between prompts exactly as in plain transformers.
            self._assistant_config = copy.deepcopy(assistant.generation_config)
            for key, value in (assistant_generation or {}).items():
                if value is not None:
                    setattr(self._assistant_config, key, value)

    def generate(self, prompt: list[int], max_new_tokens: int, eos: set[int], generator: Any = None) -> ArmOutput:
        """Generate with transformers; returns the new tokens and the counted forwards."""
        from transformers import GenerationConfig

        device = next(self.model.parameters()).device
        ids = torch.tensor([prompt], dtype=torch.long, device=device)
        pad = self.model.generation_config.pad_token_id
        config = GenerationConfig(
            max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=sorted(eos) or None,
            pad_token_id=pad if pad is not None else (min(eos) if eos else 0), **self.generation,
        )
        streamer = _StepStreamer()
        start = time.perf_counter()
        extra = {"assistant_model": self.assistant} if self.assistant is not None else {}
        with _quiet_transformers(), _counting_forwards(self.assistant) as drafts, self._assistant_settings():
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config,
                                      streamer=streamer, **extra)
        tokens = out[0, len(prompt):].tolist()
        accept = streamer.puts[1:]  # the first put is the prompt
        # The prefill is merged into the first verification forward: only the time to the
        # first token is measured honestly, the prefill alone is not (None).
        first = streamer.times[1] - start if len(streamer.times) > 1 else None
        return ArmOutput(tokens, target_forwards=len(accept), draft_forwards=drafts[0], accept_lengths=accept,
                         time_to_first_token=first)


    @contextlib.contextmanager
    def _assistant_settings(self):
        if self.assistant is None:
            yield
            return
        saved = self.assistant.generation_config
        self.assistant.generation_config = self._assistant_config
        try:
            yield
        finally:
            self.assistant.generation_config = saved


# ---------------------------------------------------------------------- registry
@dataclass(frozen=True)
class Baseline:
    """A baseline arm kind: its options dataclass and a factory for its runner.

    ``factory(options, target, load_model, default_assistant)`` where ``target`` is the
    :class:`TargetModel`, ``load_model(spec)`` loads a model alias/path/name, and
    ``default_assistant`` is the ``[drafter]`` defaults' ``model`` option (or None).
    """

    name: str
    Options: type
    factory: Callable[..., Any]


def _autoregressive(options: Any, target: Any, load_model: Callable, default_assistant: Any) -> AutoregressiveRunner:
    return AutoregressiveRunner(target)


def _hf_assisted(options: HFAssistedOptions, target: Any, load_model: Callable, default_assistant: Any) -> HFGenerateRunner:
    source = options.assistant if options.assistant is not None else default_assistant
    if source is None:
        raise ValueError(
            "baseline 'hf-assisted' needs an assistant: set baseline_options.assistant or a [drafter] 'model' option"
        )
    assistant_generation = {
        "num_assistant_tokens": options.num_assistant_tokens,
        "num_assistant_tokens_schedule": options.num_assistant_tokens_schedule,
        "assistant_confidence_threshold": options.assistant_confidence_threshold,
    }
    return HFGenerateRunner(target.model, {}, assistant=load_model(source), assistant_generation=assistant_generation)


def _hf_prompt_lookup(options: HFPromptLookupOptions, target: Any, load_model: Callable, default_assistant: Any) -> HFGenerateRunner:
    generation = {
        "prompt_lookup_num_tokens": options.prompt_lookup_num_tokens,
        "max_matching_ngram_size": options.max_matching_ngram_size,
    }
    return HFGenerateRunner(target.model, generation)


BASELINES: dict[str, Baseline] = {
    "autoregressive": Baseline("autoregressive", NoOptions, _autoregressive),
    "hf-assisted": Baseline("hf-assisted", HFAssistedOptions, _hf_assisted),
    "hf-prompt-lookup": Baseline("hf-prompt-lookup", HFPromptLookupOptions, _hf_prompt_lookup),
}
