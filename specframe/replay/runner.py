"""``specframe run CONFIG --replay TRACE``: the experiment's arms replayed over a trace.

Each specframe arm runs the same ``SpecDecoder`` with :class:`ReplayTarget`,
:class:`ReplayVerifier` and its policy wrapped in :class:`ProjectedPolicy`; the autoregressive
arm is projected from the trace. Answers carry projected wall times, so the run directory,
report and plots are the usual ones (every table marks the arms as replayed).
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from pathlib import Path
from typing import Any

import torch

from specframe.experiments.baselines import ArmOutput
from specframe.experiments.config import ArmConfig, ExperimentConfig
from specframe.experiments.data import Question
from specframe.decode.engine import SpecDecoder, make_plugin
from specframe.errors import ContextError, warn
from specframe.experiments.experiment import Experiment, RunOutcome
from specframe.experiments.loading import ModelPool, no_loading_bars, stop_tokens
from specframe.experiments.runners import arm_where, batch_answers, fault
from specframe.options import NoOptions
from specframe.plugins import get_registry
from specframe.sizing.profile import CostCurve
from specframe.experiments.runs import RunFile
from specframe.replay.projection import ProjectedPolicy, StepModel
from specframe.replay.record import config_hash, experiment_settings, layers_read, placeholder_states
from specframe.replay.target import ReplayKV, ReplayTarget, ReplayVerifier
from specframe.replay.trace import Trace, TraceError

#: Exactness declarations a replay accepts (weakest last).
REPLAYABLE = ("exact", "approximate")


class ReplayError(ValueError):
    """An arm or experiment cannot be replayed; the message says which and why."""


def step_model(trace: Trace, curve_path: str | Path | None = None) -> StepModel:
    """The projection of ``trace``: its own curve, or the one at ``curve_path`` (another machine's).

    The model's ``identity`` names the curve by key and content hash (what run.json's
    fingerprint ties the projected times to); a curve of another model is refused."""
    if curve_path is not None:
        text = Path(curve_path).read_text(encoding="utf-8")
        curve = _parse_curve(text, curve_path)
        source = f"{curve_path} ({curve.key})"
        _check_curve_model(curve, trace, curve_path)
    else:
        text = trace.curve_text()
        if text is None:
            raise TraceError(f"trace {trace.path} holds no cost curve: pass one with --curve")
        curve = _parse_curve(text, trace.path)
        source = f"the trace's curve ({curve.key})"
    o = trace.overhead
    return StepModel(curve, source, o.get("rest_fixed", 0.0), o.get("rest_per_node", 0.0),
                     o.get("ar_ratio", 1.0) if curve_path is None else 1.0, prefill_from_curve=curve_path is not None,
                     curve_scale=1.0 if curve_path is not None else o.get("curve_scale", 1.0),
                     identity={"key": curve.key, "sha1": hashlib.sha1(text.encode("utf-8")).hexdigest()[:16]})


def _parse_curve(text: str, where: Any) -> CostCurve:
    try:
        return CostCurve.from_json(text)
    except (ValueError, KeyError, TypeError) as err:
        raise TraceError(f"cost curve {where} is not a valid curve: {err}") from err


def _check_curve_model(curve: CostCurve, trace: Trace, where: Any) -> None:
    """Refuse a curve measured on another model or dtype than the trace's (its key starts with
    the model's name and config hash; device, threads and torch may differ: another machine)."""
    label, dtype = trace.environment.get("model_label"), trace.environment.get("dtype")
    parts = curve.key.split("_")
    if not label or len(parts) < 3:
        return  # a hand-made curve (tests, what-if projections) names no model to compare
    if "-".join(_identity(parts[0])) != "-".join(_identity(label)) or parts[2] != dtype:
        raise TraceError(f"cost curve {where} was measured for {parts[0]} ({parts[2]}), the trace's target is "
                         f"{label} ({dtype}): measure one for this model (`specframe profile`)")


def _identity(label: str) -> list[str]:
    """``name-confighash`` of a model label (the kernel and attention suffixes dropped)."""
    pieces = label.split("-")
    for i, piece in enumerate(pieces):
        if len(piece) == 10 and all(c in "0123456789abcdef" for c in piece):
            return pieces[: i + 1]
    return pieces


def replayable_arms(config: ExperimentConfig) -> tuple[list[ArmConfig], list[str]]:
    """``(arms to replay, names of baselines left out)``; a sampling or lossy verifier is refused."""
    keep, skipped = [], []
    for arm in config.arms:
        if arm.baseline == "autoregressive":
            keep.append(arm)
            continue
        if arm.baseline is not None:
            skipped.append(arm.name)
            continue
        why = unreplayable_verifier(get_registry().get("verifiers", arm.verifier.name))
        if why:
            raise ReplayError(f"arm {arm.name!r}: verifier {arm.verifier.name!r} {why}; replay is greedy-only: run the "
                              "arm live")
        keep.append(arm)
    return keep, skipped


def unreplayable_verifier(cls: type) -> str | None:
    """Why a verifier class cannot be replayed (None when it can): a trace holds the target's
    greedy continuation only, so a verdict that reads more of the target's distribution (a
    sampled one, or a lossy rule's thresholds) cannot be decided from it."""
    if not getattr(cls, "lossless", True):
        return ("is lossy (it accepts tokens by thresholds on the target's whole distribution at each node, "
                "which a greedy trace does not hold)")
    if getattr(cls, "sampling", False):
        return "samples (a sampled verdict depends on the target's whole distribution, which a trace does not hold)"
    return None


def check_drafter(drafter: Any, where: str) -> str:
    """The drafter's ``replay`` declaration; undeclared or unsupported ones are refused."""
    kind = getattr(drafter, "replay", None)
    if kind not in REPLAYABLE:
        why = ("declares replay = 'unsupported'" if kind == "unsupported"
               else "does not declare whether it replays (class attribute replay = 'exact' | 'approximate' | 'unsupported')")
        raise ReplayError(f"{where}: drafter {drafter.name!r} {why}; run it live instead")
    return kind


class ReplayRunner:
    """A specframe arm over a :class:`ReplayTarget`; its outputs carry projected wall times."""

    greedy = True

    def __init__(self, decoder: SpecDecoder, target: ReplayTarget, model: StepModel) -> None:
        self.decoder, self.target, self.model = decoder, target, model
        #: Seconds spent replaying (what the replay itself costs, warm-up included).
        self.seconds = 0.0

    def generate(self, prompt: list[int], max_new_tokens: int, eos: set[int], generator: Any = None) -> ArmOutput:
        """One replayed generation."""
        found = self.target.use(prompt)
        views: list = []
        start = time.perf_counter()
        out = self.decoder.generate(torch.tensor(prompt, dtype=torch.long), max_new_tokens=max_new_tokens,
                                    eos_token_id=sorted(eos) or None, generator=generator, on_step=views.append)
        wall = time.perf_counter() - start
        policy = self.decoder.policy
        result = ArmOutput(tokens=list(out.tokens), target_forwards=len(out.steps),
                           draft_forwards=sum(s.draft_forwards for s in out.steps),
                           accept_lengths=[s.emitted for s in out.steps], steps=out.steps, trees=views)
        result.replay_wall = wall
        self.seconds += wall
        result.projected_wall = (wall - policy.replaced + policy.added
                                 + self.model.prefill_seconds(len(prompt), found.prefill_seconds))
        return result


    def prepare_batch(self, config: ExperimentConfig, prompts: list[list[int]], eos: set[int]) -> None:
        """The batched decoder of this arm, built once: the live batch's engine over
        :class:`ReplayKV` (its policy unwrapped: a batch step is projected as a whole)."""
        if "batch" in self.__dict__:
            return
        policy = self.decoder.policy.inner
        if policy.wants_batch_curve:
            raise ReplayError(f"policy {policy.name!r} prices a live batch from the target's batch curves, which a "
                              "trace does not hold: replay it with batch_size = 1, or run the batch live")
        from specframe.decode.batch import BatchDecoder

        dec = self.decoder
        plain = SpecDecoder(dec.target, dec.drafter, policy, dec.verifier, strict=dec.strict)
        self._turns: list = []
        self.batch = BatchDecoder(plain, (config.batch_allocator, {"budget": None}),
                                  kv_factory=self._replay_kv)
        self.batch.prepare(config.batch_size)

    def generate_batch(self, prompts: list[list[int]], config: ExperimentConfig, eos: set[int], seeds: list,
                       live: int | None) -> tuple[list[ArmOutput], list[float], float]:
        """One replayed batch: the live batch's outputs and steps, each sequence's projected
        latency and the batch's projected wall time.

        A step is projected as the single path projects one: its measured time, less its
        replayed forward and verification, plus :meth:`StepModel.batch_step_seconds` of the
        forward's shape (the steps' ``target_time`` / ``verify_time`` carry the projected parts).
        """
        turns = [self.target.use(p) for p in prompts]
        self._turns[:] = turns
        start = time.perf_counter()
        outs, _latency, res = batch_answers(self.batch, prompts, config, eos, seeds, live)
        wall = time.perf_counter() - start
        self.seconds += wall
        kv = self._kv
        at = [kv.joined_at[tuple(t.prompt)] for t in turns]
        replayed = [0.0] * len(res.step_times)
        projected = [self.model.batch_step_seconds(rows, ctx) for rows, ctx in kv.shapes]
        for start_step, out in zip(at, outs):
            for k, step in enumerate(out.steps, start_step):
                replayed[k] = step.target_time + step.verify_time + step.kv_time  # one batch-wide value per step
                step.target_time, step.verify_time = projected[k]
                step.kv_time = 0.0  # the projected rest holds the cache's work
        steps = [t - r + sum(p) for t, r, p in zip(res.step_times, replayed, projected)]
        prefills = [self.model.prefill_seconds(len(p), t.prefill_seconds) for p, t in zip(prompts, turns)]
        first = min(len(prompts), live or len(prompts))
        latency = [(sum(prefills[:first]) if i < first else prefills[i]) + sum(steps[a : a + out.target_forwards])
                   for i, (a, out) in enumerate(zip(at, outs))]
        return outs, latency, wall - sum(res.step_times) + sum(steps) + sum(prefills)

    def _replay_kv(self, target: ReplayTarget, layout: str, reserve: int = 0) -> ReplayKV:
        """The KV layout of one replayed batch call (kept for its recorded shapes)."""
        self._kv = ReplayKV(target, self._turns, layout)
        return self._kv


class ReplayAutoregressive:
    """The autoregressive arm, projected: the recorded tokens at one autoregressive step each."""

    greedy = True

    def __init__(self, target: ReplayTarget, model: StepModel) -> None:
        self.target, self.model = target, model
        self.seconds = 0.0

    def generate(self, prompt: list[int], max_new_tokens: int, eos: set[int], generator: Any = None) -> ArmOutput:
        """The recorded greedy answer and its projected time."""
        found = self.target.use(prompt)
        start = time.perf_counter()
        tokens: list[int] = []
        for tok in found.continuation:
            tokens.append(tok)
            if len(tokens) >= max_new_tokens or tok in eos:
                break
        ctx = len(prompt)
        seconds = self.model.prefill_seconds(ctx, found.prefill_seconds) + self.model.target_seconds(1, ctx)
        seconds += sum(self.model.ar_seconds(ctx + i) for i in range(1, len(tokens)))
        result = ArmOutput(tokens, target_forwards=len(tokens), draft_forwards=0, accept_lengths=[1] * len(tokens))
        result.replay_wall = time.perf_counter() - start
        self.seconds += result.replay_wall
        result.projected_wall = seconds
        return result

    def prepare_batch(self, config: ExperimentConfig, prompts: list[list[int]], eos: set[int]) -> None:
        """Nothing to build: the recorded answers are the batch's."""

    def generate_batch(self, prompts: list[list[int]], config: ExperimentConfig, eos: set[int], seeds: list,
                       live: int | None) -> tuple[list[ArmOutput], list[float], float]:
        """The recorded answers of a batched autoregressive run, and its projected latencies and
        wall time: every step one forward of the live rows' last tokens at the longest context
        (a static batch keeps all its rows until the longest answer ends; ``live``: a finished
        row's place goes to the next prompt, which is prefilled then)."""
        answers = [self.generate(p, config.max_new_tokens, eos) for p in prompts]
        prefills = [self.model.prefill_seconds(len(p), self.target.use(p).prefill_seconds) for p in prompts]
        width = min(len(prompts), live or len(prompts))
        clock = sum(prefills[:width])
        rows = {i: 0 for i in range(width)}  # live row -> tokens emitted
        waiting, latency = list(range(width, len(prompts))), [0.0] * len(prompts)
        joined = [0.0] * len(prompts)
        while rows:
            context = max(len(prompts[i]) + n for i, n in rows.items())
            clock += self.model.ar_batch_seconds(len(rows), context)
            for i in list(rows):
                rows[i] += 1
                if rows[i] == len(answers[i].tokens):
                    latency[i] = clock - joined[i]
                    if live is not None:  # a static batch pads a finished row to the end
                        del rows[i]
            if live is None and all(rows[i] >= len(answers[i].tokens) for i in rows):
                rows = {}
            while live is not None and waiting and len(rows) < width:
                i = waiting.pop(0)
                joined[i] = clock
                clock += prefills[i]
                rows[i] = 0
        return answers, latency, clock


class ReplayExperiment(Experiment):
    """An :class:`Experiment` whose arms replay ``trace`` (see the module docstring)."""

    def __init__(self, config: ExperimentConfig, trace: Trace, model: StepModel, out_dir: Path, **kwargs: Any) -> None:
        trace.check_matches(experiment_settings(config))
        arms, self.skipped = replayable_arms(config)
        if not arms:
            raise ReplayError("no arm of the experiment can be replayed (only specframe arms and autoregressive can)")
        self.skipped = [f"{name} (transformers' generate runs the target itself)" for name in self.skipped]
        if self.skipped:
            warn(f"not replayed: {', '.join(self.skipped)}")
        super().__init__(dataclasses.replace(config, arms=arms), out_dir, **kwargs)
        self.trace, self.model = trace, model
        self.exactness: dict[str, str] = {}
        self.runners: dict[str, Any] = {}

    def fingerprint(self) -> dict:
        """The experiment's fingerprint plus the identity of the trace and of the curve, so
        answers replayed over another trace or priced by another curve are never reused, and
        live answers (no ``replay`` key) never share the directory."""
        return {**super().fingerprint(), "replay": {"trace": self.trace.identity(), "curve": self.model.identity}}

    def run(self) -> RunOutcome:
        """Build every arm over the replay target (leaving out those that cannot replay), run,
        then note in run.json that every arm was replayed, and how."""
        self._build()
        outcome = super().run()
        RunFile(self.out_dir).update(replay={
            "trace": str(self.trace.path), "projection": self.model.describe(), "curve": self.model.curve_source,
            "arms": self.exactness, "not_replayed": self.skipped,
            "replay_seconds": {name: r.seconds for name, r in self.runners.items()},
            "recorded": self.trace.environment})
        return outcome

    def _build(self) -> None:
        """Load the target once and build each arm's runner; an arm whose drafter does not
        declare an exact or approximate replay is left out with a warning (a composite
        drafter's declaration is known only once it is built)."""
        cfg = self.config
        with no_loading_bars():
            pool = self.pool = ModelPool(cfg)
            model = pool.target()
            recorded = self.trace.environment.get("config_hash")
            if recorded and recorded != config_hash(model):
                raise TraceError(f"trace {self.trace.path} was recorded with a target whose config hash is {recorded}, "
                                 f"this one's is {config_hash(model)}: a different model")
            self.target = ReplayTarget(model, self.trace)
            left_out = []
            for arm in cfg.arms:
                try:
                    self.runners[arm.name] = self._runner(arm, pool, self.target)
                except ReplayError as err:
                    left_out.append(f"{arm.name} (its drafter {arm.drafter.name!r} does not replay)")
                    warn(f"not replayed: {err}")
                except (TraceError, ContextError):
                    raise
                except Exception as err:  # a drafter or policy that cannot be built: name the arm
                    what, fix = fault(err, "fix this arm's drafter / policy options in the experiment file")
                    raise ContextError(f"cannot build the arm: {what}", arm_where(arm), fix, err) from err
        self.skipped += left_out
        if not any(a.baseline is None and a.name in self.runners for a in cfg.arms):
            raise ReplayError("no specframe arm of the experiment can be replayed (see the warnings above)")
        self.config = dataclasses.replace(cfg, arms=[a for a in cfg.arms if a.name in self.runners])

    # ------------------------------------------------------------------ one arm at a time
    def load(self) -> None:
        """Load the target once and build the experiment's arms, as :meth:`run` does first;
        then :meth:`runner_for` builds further arms over the same target (``specframe tune``)."""
        self._build()

    def runner_for(self, arm: ArmConfig) -> Any:
        """A fresh runner of ``arm`` over the loaded target (:meth:`load`); its exactness goes to
        ``exactness``. An arm whose drafter does not replay raises :class:`ReplayError`."""
        replayable_arms(dataclasses.replace(self.config, arms=[arm]))  # refuses a sampling or lossy verifier
        return self._runner(arm, self.pool, self.target)

    def answer(self, arm: ArmConfig, runner: Any, question: Question) -> Any:
        """One replayed answer (an :class:`~specframe.experiments.runs.AnswerRecord`, repeat 0)
        of ``question`` by ``runner``, every turn, with the run's EOS and seeds."""
        if getattr(self, "_eos", None) is None:
            self.questions()
        return self._answer(arm, runner, self.encoder(), question, 0, self._eos, self.target)

    def questions(self) -> list[Question]:
        """The experiment's questions in file order, less those ``[data] on_overflow = "skip"``
        leaves out (the run's rule)."""
        from specframe.experiments.data import load_questions

        data = self.config.data
        questions = load_questions(data.path, data.category, data.limit)
        _, _, _, self._eos = self.prepare_arms([], questions)
        return questions

    def prepare_arms(self, arms: list[ArmConfig], questions: list[Question]) -> tuple[Any, Any, dict, set[int]]:
        """The replay's own runners over its trace-answering target (built once, up front)."""
        encoder = self.encoder()
        runners = {arm.name: self.runners[arm.name] for arm in arms}
        self._skip_overflowing(encoder, self.target, questions, runners)
        eos = stop_tokens(self.config, self.target)
        return encoder, self.target, runners, eos

    def _runner(self, arm: ArmConfig, pool: ModelPool, target: ReplayTarget) -> Any:
        if arm.baseline == "autoregressive":
            self.exactness[arm.name] = "exact"
            return ReplayAutoregressive(target, self.model)
        drafter = make_plugin("drafters", (arm.drafter.name, pool.substitute(arm.drafter.options)), target)
        self.exactness[arm.name] = check_drafter(drafter, arm_where(arm))
        _check_layers_of(self.trace, drafter, target.model, arm_where(arm))
        policy = ProjectedPolicy(make_plugin("policies", (arm.policy.name, arm.policy.options)), self.model, target)
        return ReplayRunner(SpecDecoder(target, drafter, policy, ReplayVerifier(NoOptions())), target, self.model)


def _check_layers_of(trace: Trace, drafter: Any, model: Any, where: str) -> None:
    """Refuse, in one line naming the drafter and the layers, a drafter that reads hidden
    layers the trace did not store (a head with other layer ids than the recorded ones)."""
    if not getattr(drafter, "needs_target_hidden", False):
        return
    first = next(iter(trace.prompts.values()), None)
    if first is None or len(first.prompt) < 2:
        return
    read = layers_read(drafter, first.prompt, placeholder_states(model, len(first.prompt) - 1))
    missing = sorted(read - set(trace.hidden_layers))
    if missing:
        raise TraceError(f"{where}: drafter {drafter.name!r} reads hidden layers {missing}, which trace "
                         f"{trace.path} does not hold (it stored {trace.hidden_layers}): record the trace "
                         "with this drafter in the experiment file")


def replay_experiment(config: ExperimentConfig, trace_dir: str | Path, out_dir: str | Path | None = None,
                      curve: str | Path | None = None, fresh: bool = False, progress: bool = True,
                      console: Any = None) -> RunOutcome:
    """Replay ``config`` over the trace in ``trace_dir`` (default output: ``<output dir>-replay``)."""
    trace = Trace.load(trace_dir)
    out = Path(out_dir) if out_dir is not None else Path(f"{config.output.dir}-replay")
    return ReplayExperiment(config, trace, step_model(trace, curve), out, progress=progress, console=console,
                            fresh=fresh).run()
