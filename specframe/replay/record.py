"""``specframe record``: run the target once per prompt and write a trace directory.

The continuation comes from a speculative run (n-gram drafter, chain of 4, greedy
verification: token-identical to greedy decoding and faster), decoded ``extra`` tokens past
``max_new_tokens`` with EOS ignored, so a replayed tree that reaches past the stop is verified
as the live target would. Hidden states, when a drafter of the experiment reads them, come
from one causal forward over prompt + continuation; only the layers those drafters read are
stored (found by handing each such drafter a prefill's states and watching which it indexes).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from specframe.experiments.config import ExperimentConfig
from specframe.experiments.data import PromptEncoder, load_questions
from specframe.decode.engine import SpecDecoder, make_plugin
from specframe.experiments.loading import ModelPool, load_tokenizer, no_loading_bars, stop_tokens
from specframe.models.gguf import pid_alive
from specframe.models.target import TargetModel
from specframe.replay.projection import fit_rest
from specframe.replay.trace import PromptTrace, Trace, TraceError, prompt_key, save_hidden

#: The recording arm: lossless, drafter-free, a few tokens a step.
RECORD_DRAFTER = ("ngram", {})
RECORD_POLICY = ("chain", {"gamma": 4})
#: Tokens decoded past max_new_tokens (at least; the largest policy budget of the file if more).
MIN_EXTRA = 16
MAX_EXTRA = 64


def experiment_settings(config: ExperimentConfig) -> dict:
    """What a trace must share with an experiment to replay it (see Trace.check_matches)."""
    digest = hashlib.sha1(Path(config.data.path).read_bytes()).hexdigest()[:12]
    return {"target_model": config.target.model, "target_dtype": config.target.dtype or "float32",
            "max_new_tokens": config.max_new_tokens, "stop_at_eos": config.stop_at_eos,
            "data": {"sha1": digest, "category": config.data.category, "limit": config.data.limit},
            "chat_template": config.data.chat_template}


def config_hash(model: Any) -> str:
    """A hash of the model's configuration (its architecture and sizes, not its weights)."""
    return hashlib.sha1(model.config.to_json_string(use_diff=False).encode()).hexdigest()[:12]


class _IndexSpy(list):
    """A hidden-states list that notes which layers a drafter reads."""

    def __init__(self, items: Any) -> None:
        super().__init__(items)
        self.read: set[int] = set()

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, int):
            self.read.add(i % len(self))
        return super().__getitem__(i)


def hidden_layers(config: ExperimentConfig, pool: ModelPool, target: TargetModel, prompt: list[int]) -> list[int]:
    """The hidden-state layers the experiment's drafters read (empty when none needs any).

    Each distinct drafter is built, since a composite declares ``needs_target_hidden`` on the
    instance (from its parts)."""
    if len(prompt) < 2:
        return []
    specs = {json.dumps([a.drafter.name, a.drafter.options], sort_keys=True, default=str): a.drafter
             for a in config.arms if a.drafter is not None}
    needing = []
    for ref in specs.values():
        drafter = make_plugin("drafters", (ref.name, pool.substitute(ref.options)), target)
        if getattr(drafter, "needs_target_hidden", False):
            needing.append(drafter)
    if not needing:
        return []
    target.reset()
    states = target.causal_forward(torch.tensor(prompt[:-1], device=target.device), True).hidden_states
    return sorted(set().union(*(layers_read(d, prompt, states) for d in needing)))


def layers_read(drafter: Any, prompt: list[int], states: Any) -> set[int]:
    """The hidden-state layers ``drafter`` indexes when it begins ``prompt`` with ``states``."""
    spy = _IndexSpy(states)
    drafter.begin(torch.tensor(prompt, dtype=torch.long), target_hidden=spy)
    return spy.read


def placeholder_states(model: Any, positions: int) -> list[torch.Tensor]:
    """Zero hidden states shaped like the model's own tuple (embeddings + one per layer), for
    finding which layers a drafter reads without running the model."""
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    param = next(model.parameters())
    zeros = torch.zeros(1, positions, int(cfg.hidden_size), dtype=param.dtype, device=param.device)
    return [zeros] * (int(cfg.num_hidden_layers) + 1)


def _extra_tokens(config: ExperimentConfig) -> int:
    budgets = [MIN_EXTRA]
    for arm in config.arms:
        if arm.policy is not None:
            try:
                budgets.append(make_plugin("policies", (arm.policy.name, arm.policy.options)).max_budget)
            except Exception:  # a policy sized otherwise: the minimum applies
                continue
    return min(max(budgets), MAX_EXTRA)


def _timed_prefill(target: TargetModel, prompt: list[int]) -> float:
    if len(prompt) < 2:
        return 0.0
    target.reset()
    start = time.perf_counter()
    target.causal_forward(torch.tensor(prompt[:-1], device=target.device))
    if target.device.type == "cuda":
        torch.cuda.synchronize(target.device)
    return time.perf_counter() - start


def _ar_ratio(target: TargetModel, prompts: list[list[int]], curve: Any, tokens: int = 16) -> float:
    """Measured autoregressive step / the curve's T(1, L) (median over ``prompts``): an
    autoregressive step runs a causal forward, not the curve's tree forward, and its price
    drifts with the machine's state like the steps the curve scale calibrates."""
    from specframe.experiments.baselines import AutoregressiveRunner

    runner = AutoregressiveRunner(target)
    runner.generate(prompts[0], 2, set())  # untimed: the first small forward runs slow
    ratios = []
    for prompt in prompts:
        prefill = _timed_prefill(target, prompt + [0])
        start = time.perf_counter()
        runner.generate(prompt, tokens, set())
        per_token = (time.perf_counter() - start - prefill) / max(tokens - 1, 1)
        ratios.append(per_token / max(curve.time(1, len(prompt)), 1e-9))
    return _median(ratios)


def record_trace(config: ExperimentConfig, out: str | Path, progress: bool = True, console: Any = None) -> Trace:
    """Record ``config``'s target on every prompt of the experiment into ``out``, in this process
    (:func:`record_atomically`)."""
    return record_atomically(out, lambda work: _record_into(config, work, progress, console))


def record_atomically(out: str | Path, record: Callable[[Path], Trace]) -> Trace:
    """``record(work)`` writes a whole trace into ``work``, a temporary directory beside ``out``,
    which is then renamed into place, so an interrupted recording leaves ``out`` as it was (an
    older trace, or nothing), never an old trace.json beside new hidden states."""
    final = Path(out)
    final.parent.mkdir(parents=True, exist_ok=True)
    clear_stale_temporaries(final)
    work = final.parent / f".{final.name}.tmp-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    try:
        trace = record(work)
        swap_into_place(work, final)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    trace.path = final
    return trace


def recorded_for(config: ExperimentConfig) -> str:
    """What a trace is recorded for, as a hash: the experiment's settings, its target (model,
    dtype, device, kernels) and threads, the arms' drafters (they decide which hidden layers
    are stored) and the tokens recorded past the stop."""
    drafters = sorted({json.dumps([a.drafter.name, a.drafter.options], sort_keys=True, default=str)
                       for a in config.arms if a.drafter is not None})
    data = {"settings": experiment_settings(config), "target": asdict(config.target), "threads": config.threads,
            "drafters": drafters, "extra": _extra_tokens(config)}
    return hashlib.sha1(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def complete_trace(config: ExperimentConfig, out: str | Path) -> Trace | None:
    """The trace at ``out`` when it was recorded for ``config`` (:func:`recorded_for`), else
    None (none there, damaged, or another experiment's). A trace is only ever renamed into
    place whole, so one found is complete: ``record`` keeps it unless told ``--fresh``."""
    try:
        trace = Trace.load(out)
    except TraceError:
        return None
    return trace if trace.environment.get("recorded_for") == recorded_for(config) else None


def swap_into_place(work: Path, final: Path) -> None:
    """Rename the finished directory ``work`` to ``final``, replacing an older one: the old one
    is renamed aside first and removed after, so a crash in between leaves a whole trace
    under one of the two names (the aside one is found by :func:`clear_stale_temporaries`)."""
    aside = final.parent / f".{final.name}.old-{os.getpid()}"
    if final.exists():
        os.replace(final, aside)
    os.replace(work, final)
    shutil.rmtree(aside, ignore_errors=True)


def clear_stale_temporaries(final: Path) -> None:
    """Remove temporary and set-aside directories of ``final`` left by recordings that died
    (their pid is gone); if ``final`` itself is missing, a set-aside whole trace comes back."""
    for path in final.parent.glob(f".{final.name}.*-*"):
        kind, _, pid = path.name[len(final.name) + 2:].partition("-")
        if kind not in ("tmp", "old") or not pid.isdigit() or pid_alive(int(pid)):
            continue
        if kind == "old" and not final.exists():
            os.replace(path, final)
            continue
        shutil.rmtree(path, ignore_errors=True)


def _record_into(config: ExperimentConfig, out: Path, progress: bool, console: Any) -> Trace:
    from specframe.experiments.progress import ProgressBar

    questions = load_questions(config.data.path, config.data.category, config.data.limit)
    threads = torch.get_num_threads()
    if config.threads:
        torch.set_num_threads(config.threads)
    try:
        recorder = Recorder(config, questions)
        turns: list[RecordedTurn] = []
        with ProgressBar(sum(len(q.turns) for q in questions), 0, enabled=progress, console=console) as advance:
            for q in questions:
                for turn in recorder.record_question(q, len(turns), lambda i, layers: save_hidden(out, i, layers)):
                    turns.append(turn)
                    advance(str(q.question_id))
        ratio, device = recorder.ar_ratio([t.entry.prompt for t in turns[:3]])
        trace = assemble_trace(config, recorder.environment(), recorder.layers, turns, ratio, device)
        trace.save(out, recorder.curve)
        return trace
    finally:
        torch.set_num_threads(threads)


@dataclass
class RecordedTurn:
    """One turn as recorded: its trace entry, and the timings the trace's overhead is fitted
    from (``rest``: (tree size, verify + other seconds) per step but the last; ``ratios``:
    each step's measured target time over the curve's)."""

    entry: PromptTrace
    rest: list[tuple[int, float]]
    ratios: list[float]


class Recorder:
    """The target loaded for recording (in one process, or in one Ray worker) and what every
    turn's recording shares: the stored hidden layers, the cost curve, EOS, the recording
    decoder and the tokens recorded past the stop. ``device_index`` is the index every entry's
    device records (a Ray worker's GPU or number; 0 in one process)."""

    def __init__(self, config: ExperimentConfig, questions: list, device_index: int = 0) -> None:
        from specframe.sizing.profile import curve_for

        self.config, self.device_index = config, device_index
        with no_loading_bars():
            pool = ModelPool(config)
            self.model = pool.target()
            self.target = TargetModel(self.model)
            self.encoder = PromptEncoder(load_tokenizer(config), config.data.chat_template)
        first = self.encoder.encode(questions[0].turns, [], None)
        self.layers = hidden_layers(config, pool, self.target, first)
        self.curve = curve_for(self.target)
        self.eos = stop_tokens(config, self.target)
        self.decoder = SpecDecoder.build(self.target, drafter=RECORD_DRAFTER, policy=RECORD_POLICY, verifier="greedy")
        self.extra = _extra_tokens(config)

    def record_question(self, question: Any, index: int, save: Any) -> list[RecordedTurn]:
        """Every turn of ``question`` (a turn's prompt holds the answers before it); ``index``
        is its first turn's place among the trace's prompts, and ``save(index, layers)`` keeps
        a turn's hidden states, returning ``(file, sha1)``."""
        from specframe.experiments.device import describe_device

        device = describe_device(self.target.device, self.device_index)
        out, answers, prompt = [], [], None
        for turn in range(len(question.turns)):
            prompt = self.encoder.encode(question.turns, answers, prompt)
            recorded = _record_prompt(self.decoder, self.target, prompt, self.config.max_new_tokens, self.extra,
                                      self.eos, self.layers, lambda layers: save(index + turn, layers), self.curve)
            recorded.entry.key = prompt_key(question.question_id, turn)
            recorded.entry.device = device
            out.append(recorded)
            answers.append(recorded.entry.continuation[: recorded.entry.stop])
        return out

    def ar_ratio(self, prompts: list[list[int]]) -> tuple[float, dict]:
        """The measured autoregressive step over the curve's (:func:`_ar_ratio`), and the device
        that measured it."""
        from specframe.experiments.device import describe_device

        return _ar_ratio(self.target, prompts, self.curve), describe_device(self.target.device, self.device_index)

    def environment(self) -> dict:
        """The trace's environment block, as this recorder sees it."""
        return _environment(self.config, self.model, self.target, self.curve, self.extra)


def assemble_trace(config: ExperimentConfig, environment: dict, layers: list[int], turns: list[RecordedTurn],
                   ar_ratio: float, ar_device: dict) -> Trace:
    """The trace of ``turns`` (in data-file order): the per-step rest fitted over every turn's
    steps, the curve's scale their median ratio, and ``ar_ratio`` with the device that measured
    it (each turn's own timings name their device in its entry)."""
    rest = [pair for t in turns for pair in t.rest]
    ratios = [r for t in turns for r in t.ratios]
    a, b = fit_rest(rest)
    overhead = {"rest_fixed": a, "rest_per_node": b, "ar_ratio": ar_ratio, "steps_fitted": len(rest),
                "curve_scale": _median(ratios) if ratios else 1.0}
    overhead["ar_ratio_device"] = ar_device
    prompts = {t.entry.key: t.entry for t in turns}
    return Trace(environment, experiment_settings(config), prompts, overhead, layers)


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def _record_prompt(decoder: SpecDecoder, target: TargetModel, prompt: list[int], max_new: int, extra: int,
                   eos: set[int], layers: list[int], save: Any, curve: Any) -> RecordedTurn:
    """One turn: its continuation (``extra`` past the stop), prefill time and hidden states."""
    room = target.max_positions - len(prompt)
    steps: list = []
    gen = decoder.generate(torch.tensor(prompt), max_new_tokens=max(min(max_new + extra, room), 1),
                           eos_token_id=None, on_step=steps.append)
    cont = list(gen.tokens)
    stop = min(max_new, len(cont))
    for i, tok in enumerate(cont[:stop]):
        if tok in eos:
            stop = i + 1
            break
    rest = [(v.stats.tree_size, v.stats.verify_time + v.stats.kv_time) for v in steps[:-1]]
    ratios: list[float] = []
    context = len(prompt)
    for v in steps:  # measured target time against the curve's, at the step's context
        if curve is not None and v.stats.target_time > 0:
            ratios.append(v.stats.target_time / max(curve.time(v.stats.tree_size, context - 1), 1e-9))
        context += v.stats.emitted
    entry = PromptTrace(key="", prompt=list(prompt), continuation=cont, stop=stop,
                        prefill_seconds=_timed_prefill(target, prompt))
    if layers:
        target.reset()
        full = torch.tensor(prompt + cont, device=target.device)
        states = target.causal_forward(full, True).hidden_states
        entry.hidden_file, entry.hidden_sha1 = save({i: states[i][0] for i in layers})
    return RecordedTurn(entry, rest, ratios)


def _environment(config: ExperimentConfig, model: Any, target: TargetModel, curve: Any, extra: int) -> dict:
    import transformers

    from specframe.sizing.profile import model_label

    return {"model": config.target.model, "model_label": model_label(model), "config_hash": config_hash(model),
            "dtype": str(target.dtype).replace("torch.", ""), "hidden_dtype": str(target.dtype).replace("torch.", ""),
            "device": str(target.device), "torch": torch.__version__, "transformers": transformers.__version__,
            "threads": torch.get_num_threads(), "machine": platform.machine(), "processor": platform.processor(),
            "curve_key": curve.key if curve is not None else None, "extra_tokens": extra,
            "recorded_with": f"{RECORD_DRAFTER[0]} + {RECORD_POLICY[0]} {RECORD_POLICY[1]}, greedy",
            "recorded_for": recorded_for(config)}
