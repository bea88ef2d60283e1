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
from pathlib import Path
from typing import Any

import torch

from specframe.experiments.config import ExperimentConfig
from specframe.experiments.data import PromptEncoder, load_questions
from specframe.decode.engine import SpecDecoder, make_plugin
from specframe.experiments.loading import ModelPool, load_tokenizer, no_loading_bars
from specframe.models.gguf import pid_alive
from specframe.models.target import TargetModel
from specframe.replay.projection import fit_rest
from specframe.replay.trace import PromptTrace, Trace, prompt_key, save_hidden

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
    """Record ``config``'s target on every prompt of the experiment into ``out``.

    The trace is written into a temporary directory beside ``out`` and renamed into place
    when complete, so an interrupted recording leaves ``out`` as it was (an older trace, or
    nothing), never an old trace.json beside new hidden states."""
    final = Path(out)
    final.parent.mkdir(parents=True, exist_ok=True)
    clear_stale_temporaries(final)
    work = final.parent / f".{final.name}.tmp-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    try:
        trace = _record_into(config, work, progress, console)
        swap_into_place(work, final)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    trace.path = final
    return trace


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
    from specframe.sizing.profile import curve_for

    questions = load_questions(config.data.path, config.data.category, config.data.limit)
    threads = torch.get_num_threads()
    if config.threads:
        torch.set_num_threads(config.threads)
    try:
        with no_loading_bars():
            pool = ModelPool(config)
            model = pool.target()
            target = TargetModel(model)
            encoder = PromptEncoder(load_tokenizer(config), config.data.chat_template)
        first = encoder.encode(questions[0].turns, [], None)
        layers = hidden_layers(config, pool, target, first)
        curve = curve_for(target)
        eos = _eos(config, target)
        decoder = SpecDecoder.build(target, drafter=RECORD_DRAFTER, policy=RECORD_POLICY, verifier="greedy")
        extra = _extra_tokens(config)
        prompts: dict[str, PromptTrace] = {}
        rest: list[tuple[int, float]] = []
        ratios: list[float] = []
        total = sum(len(q.turns) for q in questions)
        with ProgressBar(total, 0, enabled=progress, console=console) as advance:
            for q in questions:
                answers: list[list[int]] = []
                prompt = None
                for turn in range(len(q.turns)):
                    prompt = encoder.encode(q.turns, answers, prompt)
                    entry = _record_prompt(decoder, target, prompt, config.max_new_tokens, extra, eos, layers,
                                           out, len(prompts), rest, ratios, curve)
                    entry.key = prompt_key(q.question_id, turn)
                    prompts[entry.key] = entry
                    answers.append(entry.continuation[: entry.stop])
                    advance(str(q.question_id))
        a, b = fit_rest(rest)
        scale = _median(ratios) if ratios else 1.0
        firsts = [p.prompt for p in list(prompts.values())[:3]]
        overhead = {"rest_fixed": a, "rest_per_node": b, "ar_ratio": _ar_ratio(target, firsts, curve),
                    "steps_fitted": len(rest), "curve_scale": scale}
        trace = Trace(_environment(config, model, target, curve, extra), experiment_settings(config), prompts,
                      overhead, layers)
        trace.save(out, curve)
        return trace
    finally:
        torch.set_num_threads(threads)


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def _eos(config: ExperimentConfig, target: TargetModel) -> set[int]:
    ids = target.eos_token_id
    if not config.stop_at_eos or ids is None:
        return set()
    return {int(ids)} if isinstance(ids, int) else {int(i) for i in ids}


def _record_prompt(decoder: SpecDecoder, target: TargetModel, prompt: list[int], max_new: int, extra: int,
                   eos: set[int], layers: list[int], out: Path, index: int,
                   rest: list[tuple[int, float]], ratios: list[float], curve: Any) -> PromptTrace:
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
    rest += [(v.stats.tree_size, v.stats.verify_time + v.stats.other_time) for v in steps[:-1]]
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
        entry.hidden_file, entry.hidden_sha1 = save_hidden(out, index, {i: states[i][0] for i in layers})
    return entry


def _environment(config: ExperimentConfig, model: Any, target: TargetModel, curve: Any, extra: int) -> dict:
    import transformers

    from specframe.sizing.profile import model_label

    return {"model": config.target.model, "model_label": model_label(model), "config_hash": config_hash(model),
            "dtype": str(target.dtype).replace("torch.", ""), "hidden_dtype": str(target.dtype).replace("torch.", ""),
            "device": str(target.device), "torch": torch.__version__, "transformers": transformers.__version__,
            "threads": torch.get_num_threads(), "machine": platform.machine(), "processor": platform.processor(),
            "curve_key": curve.key if curve is not None else None, "extra_tokens": extra,
            "recorded_with": f"{RECORD_DRAFTER[0]} + {RECORD_POLICY[0]} {RECORD_POLICY[1]}, greedy"}
