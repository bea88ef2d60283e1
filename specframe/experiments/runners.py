"""Building an arm's runner: a specframe arm's decoder or a baseline, with the arm named in
every failure, and what the run asks of a runner's drafter (state kept across requests)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from specframe.errors import ContextError, one_line
from specframe.experiments.baselines import BASELINES, ArmOutput
from specframe.experiments.config import ArmConfig, ExperimentConfig
from specframe.experiments.loading import ModelPool
from specframe.options import build_options


class SpecRunner:
    """A specframe arm: SpecDecoder.generate, keeping the engine's view of every step.

    ``generate(on_step=...)`` hands over each verified tree with its accepted path; the
    callback only keeps a reference, so nothing is read or copied inside the timed region.
    """

    def __init__(self, decoder: Any, score: bool = False) -> None:
        self.decoder = decoder
        self.score = score
        verifier = decoder.verifier
        # A lossy verifier at temperature 0 is deterministic: compared with autoregressive too.
        self.greedy = not getattr(verifier, "sampling", False) or getattr(getattr(verifier, "options", None),
                                                                          "temperature", None) == 0

    def generate(self, prompt: list[int], max_new_tokens: int, eos: set[int], generator: Any = None) -> ArmOutput:
        """One speculative generation."""
        views: list = []
        out = self.decoder.generate(torch.tensor(prompt, dtype=torch.long), max_new_tokens=max_new_tokens,
                                    eos_token_id=sorted(eos) or None, generator=generator, on_step=views.append,
                                    score=self.score)
        return ArmOutput(
            tokens=list(out.tokens), target_forwards=len(out.steps),
            draft_forwards=sum(s.draft_forwards for s in out.steps),
            accept_lengths=[s.emitted for s in out.steps], steps=out.steps, trees=views, nll=out.nll,
            prefill_time=out.prefill_time, time_to_first_token=out.time_to_first_token,
        )

    def prepare_batch(self, config: ExperimentConfig, prompts: list[list[int]], eos: set[int]) -> None:
        """Build the batched decoder once: its rows' drafters and policies (a draft model or head
        loads) and, with ``warmup``, one untimed pass of the batched path."""
        if "batch" in self.__dict__:
            return
        from specframe.decode.batch import BatchDecoder

        self.batch = BatchDecoder(self.decoder, (config.batch_allocator, {"budget": None}))
        self.batch.prepare(config.batch_size)
        if config.warmup:
            self.batch.generate(prompts, 2, sorted(eos) or None)
            self.batch.forget_rows()
            self.batch.prepare(config.batch_size)

    def generate_batch(self, prompts: list[list[int]], config: ExperimentConfig, eos: set[int], seeds: list,
                       live: int | None) -> tuple[list[ArmOutput], list[float], None]:
        """One batch of ``prompts`` (``live``: continuous batching); the outputs, each
        sequence's latency, and None (the caller's clock is the wall time)."""
        outs, latency, _ = batch_answers(self.batch, prompts, config, eos, seeds, live, self.score)
        return outs, latency, None


def batch_answers(batcher: Any, prompts: list[list[int]], config: ExperimentConfig, eos: set[int], seeds: list,
                  live: int | None, score: bool = False) -> tuple[list[ArmOutput], list[float], Any]:
    """``batcher`` (a ``BatchDecoder``) on one batch under the experiment's allocator budget:
    every sequence's :class:`ArmOutput` and latency, and the ``BatchOutput``."""
    rows = min(len(prompts), config.batch_size)
    batcher.allocator.options.budget = config.batch_budget and config.batch_budget * rows
    res = batcher.generate(prompts, config.max_new_tokens, sorted(eos) or None, seeds=seeds, max_live=live,
                           score=score)
    outs = [ArmOutput(list(o.tokens), len(o.steps), sum(s.draft_forwards for s in o.steps),
                      [s.emitted for s in o.steps], steps=o.steps, nll=o.nll) for o in res.outputs]
    return outs, res.latencies, res


def build_runner(arm: ArmConfig, pool: ModelPool, target: Any, config: ExperimentConfig) -> Any:
    """The runner of one arm (drafter models load here); a failure names the arm."""
    try:
        return _build_runner(arm, pool, target, config)
    except ContextError as err:
        raise ContextError(err.what, f"arm {arm.name!r}, {err.where}", err.fix, err.cause) from err
    except Exception as err:
        what, fix = _load_fault(err, arm)
        raise ContextError(what, arm_where(arm), fix, err) from err


#: The advice for an arm that failed to build for no reason of its own saying.
OPTIONS_FIX = "fix this arm's drafter / policy / verifier options in the experiment file, or remove the arm"


def _load_fault(err: BaseException, arm: ArmConfig) -> tuple[str, str]:
    """``(what, how to fix)`` of an arm that failed to build; weight files are named."""
    if "safetensor" in type(err).__name__.lower():
        files = [str(f) for d in _option_dirs(arm) for f in sorted(d.glob("*.safetensors"))]
        return (f"cannot read the weights {', '.join(files) or '(*.safetensors)'}: {one_line(err)}",
                "the file is empty, truncated or not safetensors: copy or export the checkpoint again")
    return fault(err, OPTIONS_FIX)


def fault(err: BaseException, default_fix: str) -> tuple[str, str]:
    """``(what, how to fix)`` of ``err``: its own ``what`` and ``fix`` when it names a fix (a
    measurement refused on a busy machine is no fault of an arm's options), else its one-line
    message and ``default_fix``."""
    fix = getattr(err, "fix", None)
    if isinstance(fix, str) and fix:
        return str(getattr(err, "what", None) or one_line(err)), fix
    return one_line(err), default_fix


def _option_dirs(arm: ArmConfig) -> list[Path]:
    """Local directories named by the arm's string drafter options (checkpoints)."""
    from specframe.models.assets import resolve_model_path

    dirs = []
    for value in (arm.drafter.options.values() if arm.drafter else ()):
        if isinstance(value, str):
            try:
                path = Path(resolve_model_path(value))
            except Exception:  # not a path: nothing to name
                continue
            if path.is_dir():
                dirs.append(path)
    return dirs


def arm_where(arm: ArmConfig) -> str:
    """``arm 'x'`` plus the arm's file-like drafter options (a checkpoint path names the file)."""
    where = f"arm {arm.name!r}"
    if arm.drafter is not None:
        paths = [f"{k}={v!r}" for k, v in arm.drafter.options.items() if isinstance(v, str)]
        where += f", drafter {arm.drafter.name!r}" + (f" {' '.join(paths)}" if paths else "")
    return where


def _build_runner(arm: ArmConfig, pool: ModelPool, target: Any, config: ExperimentConfig) -> Any:
    if arm.baseline:
        base = BASELINES[arm.baseline]
        options = build_options(base.Options, arm.baseline_options, f"baseline {arm.baseline!r}")
        default = (config.drafter.options.get("model") if config.drafter else None)
        return base.factory(options, target, pool.load, default)
    from specframe.decode.engine import SpecDecoder

    decoder = SpecDecoder.build(
        target=target,
        drafter=(arm.drafter.name, pool.substitute(arm.drafter.options)),
        policy=(arm.policy.name, arm.policy.options),
        verifier=(arm.verifier.name, arm.verifier.options),
    )
    return SpecRunner(decoder, score=config.scored)



def context_limit(target: Any, runners: dict) -> tuple[int, str]:
    """``(positions, whose)``: the fewest positions of the target and every arm's draft model
    (a drafter's ``max_positions``, None when it has no limit of its own)."""
    limit = (int(target.max_positions), "the target")
    for name, runner in runners.items():
        drafter = getattr(getattr(runner, "decoder", None), "drafter", None)
        positions = getattr(drafter, "max_positions", None)
        if positions is not None and int(positions) < limit[0]:
            limit = (int(positions), f"arm {name!r}'s draft model")
    return limit


def keeps_state(runner: Any) -> bool:
    """True when the runner's drafter keeps state across requests (``persistent_state``)."""
    decoder = getattr(runner, "decoder", None)
    return bool(getattr(getattr(decoder, "drafter", None), "persistent_state", False))


def fresh_drafter(runner: Any) -> None:
    """Replace the runner's drafter by a fresh one like it (same options, shared weights), and
    forget the rows of its batched decoder, so no state of earlier requests survives."""
    from specframe.decode.batch import rebuild_drafter

    runner.decoder.drafter = rebuild_drafter(runner.decoder)
    batch = runner.__dict__.get("batch")
    if batch is not None:
        batch.forget_rows()


def guarded_generate(arm: ArmConfig, runner: Any, prompt: list[int], max_new_tokens: int, eos: set[int],
              generator: torch.Generator, where: str) -> ArmOutput:
    """``runner.generate`` whose failure names the arm and the question (a plugin raised)."""
    try:
        return runner.generate(prompt, max_new_tokens, eos, generator)
    except Exception as err:
        raise ContextError(
            f"generation failed: {one_line(err)}", f"{arm_where(arm)}, {where}",
            "answers finished so far are saved and the same command resumes; fix the plugin or the "
            "arm's options (rerun with --debug for the traceback)", err,
        ) from err


class StatePositions:
    """Per arm, the (repeat, question index) its drafter's state was last advanced to."""

    def __init__(self) -> None:
        self._at: dict[str, tuple[int, int]] = {}

    def follows(self, arm: str, repeat: int, index: int) -> bool:
        """True when the arm's last question was the one just before ``index`` in this repeat
        (a drafter not yet used is fresh: "before question 0 of repeat 0")."""
        return self._at.get(arm, (0, -1)) == (repeat, index - 1)

    def mark(self, arm: str, repeat: int, index: int) -> None:
        """The arm has now answered question ``index`` of ``repeat``."""
        self._at[arm] = (repeat, index)
