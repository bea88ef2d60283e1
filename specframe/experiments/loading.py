"""Model loading for a run: the device, the target and the ``[models]`` aliases (loaded once
each, shared between arms), and the target's tokenizer."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import torch

from specframe.errors import ContextError, one_line
from specframe.experiments.config import BYTES_TOKENIZER, RANDOM_PREFIX, ExperimentConfig, ModelSpec
from specframe.experiments.data import ByteTokenizer

MODEL_FIX = ("give a local model directory, a shipped name (demo-target, demo-draft) or a hub id "
             "already in the local Hugging Face cache; offline, HF_HUB_OFFLINE=1 makes a missing "
             "hub id fail at once instead of after retries")


def resolve_device(name: str | None) -> torch.device:
    """``auto``/None -> CUDA when available, else CPU."""
    if name in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class ModelPool:
    """Loads the target and the ``[models]`` aliases once each and shares them between arms."""

    def __init__(self, config: ExperimentConfig) -> None:
        self.config = config
        self.device = resolve_device(config.target.device)
        self.dtype = getattr(torch, config.target.dtype or "float32")
        self._cache: dict[str, Any] = {}

    def target(self) -> Any:
        """The target transformers model."""
        return self.load("target")

    def load(self, ref: str) -> Any:
        """A model by alias (``target`` or a ``[models]`` key), or by path / shipped name.

        A model that fails to load raises :class:`ContextError` naming the table and the model.
        """
        if ref not in self._cache:
            try:
                self._cache[ref] = self._load(ref)
            except ContextError:
                raise
            except Exception as err:
                where = "[target]" if ref == "target" else f"[models.{ref}]" if ref in self.config.models else "model option"
                spec = self.config.target if ref == "target" else self.config.models.get(ref)
                name = spec.model if spec is not None else ref
                raise ContextError(f"cannot load model {name!r}: {one_line(err)}", where, MODEL_FIX, err) from err
        return self._cache[ref]

    def _load(self, ref: str) -> Any:
        if ref == "target":
            return self._build(self.config.target, is_target=True)
        if ref in self.config.models:
            return self._build(self.config.models[ref], is_target=False)
        from specframe.models.target import load_causal_lm

        return load_causal_lm(ref, dtype=self.dtype, device=self.device)

    def _build(self, spec: ModelSpec, is_target: bool) -> Any:
        model = self._build_plain(spec, is_target)
        if spec.packed_linears or spec.linears != "float32":
            from specframe.models.linears import apply_linears

            apply_linears(model, spec.linears, spec.packed_linears)
        if spec.exact:
            from specframe.models.exact import use_exact

            use_exact(model)
        return model

    def _build_plain(self, spec: ModelSpec, is_target: bool) -> Any:
        dtype = getattr(torch, spec.dtype) if spec.dtype else self.dtype
        device = self.device if (is_target or spec.device is None) else resolve_device(spec.device)
        if spec.is_random:
            from specframe.models import synthetic

            opts = dataclasses.asdict(synthetic.RandomModelOptions(**spec.random))
            model = synthetic.tiny_model(spec.model[len(RANDOM_PREFIX):], dtype=dtype,
                                         attn_implementation=spec.attn_implementation, **opts)
            return model.to(device).eval()
        if spec.perturbed_of is not None:
            from specframe.models import synthetic

            opts = synthetic.PerturbedOptions(**spec.random)
            return synthetic.perturbed_copy(self.load(spec.perturbed_of), float(opts.noise), opts.seed).to(device, dtype)
        from specframe.models.target import load_causal_lm

        return load_causal_lm(spec.model, dtype=dtype, device=device, attn_implementation=spec.attn_implementation)

    def substitute(self, options: dict) -> dict:
        """Plugin options with every string naming a declared model replaced by that model."""
        aliases = set(self.config.models) | {"target"}
        return {k: self.load(v) if isinstance(v, str) and v in aliases else v for k, v in options.items()}


def stop_tokens(config: ExperimentConfig, target: Any) -> set[int]:
    """The token ids an answer stops at: the target's EOS ids when ``stop_at_eos``, else none."""
    ids = target.eos_token_id
    if not config.stop_at_eos or ids is None:
        return set()
    return {int(ids)} if isinstance(ids, int) else {int(i) for i in ids}


def load_tokenizer(config: ExperimentConfig) -> Any:
    """The target's tokenizer (``bytes`` -> :class:`ByteTokenizer`, the default of random models)."""
    spec = config.target
    name = spec.tokenizer
    if name == BYTES_TOKENIZER or (name is None and spec.is_random):
        return ByteTokenizer(int(spec.random.get("vocab_size", 64)))
    from specframe.models.tokenizer import load_tokenizer as load_named

    try:
        return load_named(name or spec.model)
    except Exception as err:
        raise ContextError(f"cannot load the tokenizer {name or spec.model!r}: {one_line(err)}", "[target]",
                           "set [target] tokenizer to a directory holding the target's tokenizer; " + MODEL_FIX,
                           err) from err


@contextlib.contextmanager
def no_loading_bars():
    """Hide transformers' per-model "Loading weights" bars under our own progress bar."""
    from transformers.utils import logging

    enabled = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            logging.enable_progress_bar()


def sync(device: torch.device) -> None:
    """Wait for the device's queued work, so a clock read after it times the work itself."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
