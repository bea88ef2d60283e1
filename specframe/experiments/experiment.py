"""Run an experiment: every arm on the same prompts, interleaved, resumable, timed fairly.

Order of work: for each repeat, for each question, every arm in turn (A B C A B C ...), so
machine drift hits all arms alike. Each finished answer is appended to its arm's JSONL file and
fsynced, so a crash or Ctrl-C loses no finished prompt; running the same config again skips the
answers already on disk (keyed by arm, question_id and repeat). The run directory's files are
owned by :mod:`specframe.experiments.runs`; the report is separate (the CLI writes it after every run)::

    outcome = run_experiment("exp.toml")
    summary = specframe.experiments.report.write_report(outcome.out_dir)
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from specframe.experiments.baselines import BASELINES, ArmOutput
from specframe.experiments.config import BYTES_TOKENIZER, RANDOM_PREFIX, ArmConfig, ExperimentConfig, ModelSpec, lossy_label
from specframe.experiments.data import ByteTokenizer, PromptEncoder, Question, load_questions
from specframe.errors import ContextError, ExperimentError, one_line, warn
from specframe.options import build_options
from specframe.experiments.runlock import DirectoryInUseError, RunLock
from specframe.experiments.runs import AnswerRecord, AnswerStore, Choice, RunDir, RunFile, answer_key, read_answers, steps_columns
from specframe.experiments.runs.runfile import question_digest
from specframe.experiments.tokentext import TokenText

RecordHook = Callable[[str, dict], None]
#: How the run treats drafters that keep state across requests (``persistent_state``), in run.json
#: and the report: what their timed answers saw before them.
PROTOCOL = {
    "warmup": "untimed generations of question 1 per arm; a drafter that keeps state across requests "
              "is rebuilt fresh after them, so nothing it learned there reaches a timed answer",
    "state_across_requests": "each repeat starts from a fresh drafter; within a repeat its state carries "
                             "across questions in data-file order (a resumed run first regenerates the "
                             "repeat's earlier questions, untimed, to rebuild that state)",
}
MODEL_FIX = ("give a local model directory, a shipped name (demo-target, demo-draft) or a hub id "
             "already in the local Hugging Face cache; offline, HF_HUB_OFFLINE=1 makes a missing "
             "hub id fail at once instead of after retries")


# ---------------------------------------------------------------------- models
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
        if spec.packed_linears:
            from specframe.models.packed_linear import kernel_option, pack_linears

            pack_linears(model, kernel_option(spec.packed_linears))
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


# ---------------------------------------------------------------------- runners
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


def _load_fault(err: BaseException, arm: ArmConfig) -> tuple[str, str]:
    """``(what, how to fix)`` of an arm that failed to build; weight files are named."""
    if "safetensor" in type(err).__name__.lower():
        files = [str(f) for d in _option_dirs(arm) for f in sorted(d.glob("*.safetensors"))]
        return (f"cannot read the weights {', '.join(files) or '(*.safetensors)'}: {one_line(err)}",
                "the file is empty, truncated or not safetensors: copy or export the checkpoint again")
    return one_line(err), "fix this arm's drafter / policy / verifier options in the experiment file, or remove the arm"


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


# ---------------------------------------------------------------------- records
def _pick_trees(trees: list, k: int | None, text: TokenText | None = None, max_budget: int | None = None) -> list[dict]:
    """``k`` of the steps' :class:`~specframe.decode.engine.StepView` s spread over the generation
    (``None``: every step), as plain data: see :func:`tree_record`."""
    if not trees or (k is not None and k <= 0):
        return []
    if k is None:
        idx = list(range(len(trees)))
    else:
        idx = sorted({max(0, int(round((i + 1) * len(trees) / (k + 1))) - 1) for i in range(k)})
    return [tree_record(trees[i], i, text, max_budget) for i in idx]


def tree_record(view: Any, step: int, text: TokenText | None = None, max_budget: int | None = None) -> dict:
    """One verified step's tree as plain data: its step index (over all turns), tokens, parents,
    depths, ranks, cumulative draft log-probabilities ``logp``, the accepted node indices (root
    first), with ``text`` each node's decoded token and with ``max_budget`` the node budget the
    policy was given (its largest tree less what the context cut, root included)."""
    tree = view.tree
    out = {"step": step, "tokens": tree.tokens.tolist(), "parents": tree.parents.tolist(),
           "depths": tree.depths.tolist(), "ranks": tree.ranks.tolist(),
           "logp": [round(float(v), 5) for v in tree.logp.tolist()], "accepted": view.path}
    if text is not None:
        out["text"] = text.tokens(out["tokens"])
    if max_budget is not None:
        out["budget"] = int(max_budget) - int(getattr(view.stats, "budget_cut", 0))
    return out


def root_confidence(tree: Any) -> float | None:
    """The drafter's confidence at the root: the largest draft probability among the root's
    children (None for a tree that is only its root)."""
    first = tree.logp[tree.parents == 0]
    return round(float(first.max().exp()), 5) if len(first) else None


def policy_budget(runner: Any) -> int | None:
    """The largest tree of a specframe arm's policy, root included (None for baselines)."""
    policy = getattr(getattr(runner, "decoder", None), "policy", None)
    try:
        return int(policy.max_budget) if policy is not None else None
    except Exception:  # a policy without a known largest tree: the record leaves the budget out
        return None


def make_record(arm: ArmConfig, question: Question, repeat: int, model_id: str, greedy: bool,
                turns: list[tuple[list[int], ArmOutput, float, str]], trees_k: int,
                text: TokenText | None = None, max_budget: int | None = None, explore: bool = False) -> AnswerRecord:
    """One answer in Spec-Bench's format plus per-step statistics.

    ``turns``: per turn ``(prompt ids, output, wall seconds, decoded text)``. ``trees_k``: how
    many steps' trees to keep. ``text``: decodes the kept trees' node tokens. ``explore``: an
    explorer question's answer: every step's tree, and (with ``text``) each output token's text,
    what trees.html reads.
    """
    outs = [t[1] for t in turns]
    steps = [s for o in outs for s in (o.steps or [])]
    trees = [t for o in outs for t in o.trees]
    choice = Choice(turns=[t[3] for t in turns], new_tokens=[len(o.tokens) for o in outs],
                    wall_time=[round(t[2], 7) for t in turns],
                    accept_lengths=[a for o in outs for a in o.accept_lengths],
                    decoding_steps=[o.target_forwards for o in outs])
    columns = steps_columns(steps)
    if steps and len(trees) == len(steps):  # the shape plot's x: read after the clock stopped
        columns["root_p"] = [root_confidence(v.tree) for v in trees]
    scored = all(o.nll is not None for o in outs)
    return AnswerRecord(
        question_id=question.question_id, category=question.category,
        answer_id=f"{arm.slug}/{question.question_id}/{repeat}", model_id=model_id, arm=arm.name,
        repeat=repeat, greedy=greedy, tstamp=time.time(), choice=choice,
        draft_forwards=[o.draft_forwards for o in outs], prompt_tokens=[len(t[0]) for t in turns],
        output_ids=[o.tokens for o in outs], steps=columns,
        trees=_pick_trees(trees, None if explore else trees_k, text, max_budget),
        token_text=[text.pieces(o.tokens) for o in outs] if explore and text is not None else [],
        # per turn: the tokens' negative log-likelihood under the target (nats, summed)
        extra={"nll": [round(o.nll, 6) for o in outs]} if scored else {},
    )


# ---------------------------------------------------------------------- the run
@dataclass
class RunOutcome:
    """What a run did: where, how many answers it computed and how many it found on disk.

    The run writes answers, run.json and divergences.json; the summary, report.md and plots
    come from :func:`specframe.experiments.report.write_report` (the CLI calls it after every run).
    """

    out_dir: Path
    computed: int
    skipped: int


@contextlib.contextmanager
def _no_loading_bars():
    """Hide transformers' per-model "Loading weights" bars under our own progress bar."""
    from transformers.utils import logging

    enabled = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            logging.enable_progress_bar()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Experiment:
    """One configured run; :meth:`run` does the work (see the module docstring)."""

    def __init__(self, config: ExperimentConfig, out_dir: str | Path | None = None,
                 on_record: RecordHook | None = None, progress: bool = True, console: Any = None,
                 fresh: bool = False) -> None:
        self.config = config
        self.out_dir = Path(out_dir) if out_dir is not None else config.output.dir
        self.on_record = on_record
        self.progress = progress
        self.console = console
        self.fresh = fresh
        # JSON question ids whose answers record every step's tree and token text (trees.html)
        self._explored: set[str] = set()

    def run(self) -> RunOutcome:
        """Lock the output directory and compute every missing answer (not the report).

        A directory held by another live run raises :class:`ExperimentError`; ``fresh``
        discards earlier results once the lock is held.
        """
        try:
            lock = RunLock(self.out_dir).__enter__()
        except DirectoryInUseError as err:
            raise ExperimentError(str(err)) from None
        try:
            if self.fresh:
                RunDir(self.out_dir).discard()
            return self._run_locked()
        finally:
            lock.__exit__(None, None, None)

    def fingerprint(self) -> dict:
        """The run's fingerprint in run.json (:meth:`ExperimentConfig.fingerprint`, plus the
        content digests of the models' local files, so other weights under the same name are
        never answered from this run; a replay adds the identity of its trace and curve)."""
        if getattr(self, "_model_files", None) is None:
            from specframe.experiments.runs.artifacts import model_files

            self._model_files = model_files({"target": self.config.target, **self.config.models})
        return {**self.config.fingerprint(), **({"model_files": self._model_files} if self._model_files else {})}

    def encoder(self) -> PromptEncoder:
        """The prompt encoder of the target's tokenizer (loaded once per run)."""
        if getattr(self, "_encoder", None) is None:
            self._encoder = PromptEncoder(load_tokenizer(self.config), self.config.data.chat_template)
        return self._encoder

    @staticmethod
    def _arm_definition(arm: ArmConfig) -> dict:
        """The arm as run.json keeps it: its definition, and the digests of the local files its
        options name (a rebuilt datastore or retrained head makes the arm a changed one)."""
        from specframe.experiments.runs.artifacts import arm_artifacts

        found = arm_artifacts({scope: ref.options for scope, ref in
                               (("policy", arm.policy), ("drafter", arm.drafter), ("verifier", arm.verifier)) if ref})
        return {**arm.describe(), **({"artifacts": found} if found else {})}

    def _inputs(self, questions: list[Question]) -> dict[str, str]:
        """Question id (as JSON) -> digest of its text and its tokenized first prompt."""
        enc = self.encoder()
        return {json.dumps(q.question_id): question_digest(q.question_id, q.category, q.turns,
                                                            enc.encode(q.turns, [], None))
                for q in questions}

    def _run_locked(self) -> RunOutcome:
        cfg = self.config
        questions = load_questions(cfg.data.path, cfg.data.category, cfg.data.limit)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        run_file = RunFile(self.out_dir)
        run_file.check(cfg.name, self.fingerprint(), {a.name: self._arm_definition(a) for a in cfg.arms},
                       inputs=self._inputs(questions), max_new_tokens=cfg.max_new_tokens, repeats=cfg.repeats,
                       target=cfg.target.model, source=str(cfg.source or ""), torch=torch.__version__)
        references = {json.dumps(q.question_id): q.answer for q in questions if q.answer is not None}
        if references:  # what the report scores answers against (task accuracy)
            run_file.update(references={**run_file.read().get("references", {}), **references})
        overflowed = run_file.overflow_skipped_ids()
        questions = [q for q in questions if json.dumps(q.question_id) not in overflowed]
        explored = questions[:cfg.output.explorer_questions]
        self._explored = {json.dumps(q.question_id) for q in explored}
        if explored:  # trees.html shows their prompts beside the answers
            run_file.update(prompts={**run_file.read().get("prompts", {}),
                                     **{json.dumps(q.question_id): q.turns for q in explored}})
        store = AnswerStore(self.out_dir)
        done = {arm.name: store.done(arm.name) for arm in cfg.arms}
        todo = [(r, q, a) for r in range(cfg.repeats) for q in questions for a in cfg.arms
                if answer_key(q.question_id, r) not in done[a.name]]
        skipped = cfg.repeats * len(questions) * len(cfg.arms) - len(todo)
        computed = 0
        if todo:
            threads = torch.get_num_threads()
            if cfg.threads:
                # Oversubscribed CPUs make multi-threaded kernels spin: pinning helps a lot.
                torch.set_num_threads(cfg.threads)
            try:
                computed = self._compute(todo, questions, store, skipped)
            finally:
                store.close()
                torch.set_num_threads(threads)
        self._write_divergences(questions)
        return RunOutcome(self.out_dir, computed, skipped)

    def _write_divergences(self, questions: list[Question]) -> None:
        """Record where greedy arms left the autoregressive answers, with the target's logit
        margin there (a float tie or a bug?); the report lists them. Loads the target only when
        there is a divergence."""
        from specframe.experiments.divergence import find_divergence

        cfg = self.config
        run_dir = RunDir(self.out_dir)
        path = run_dir.divergences
        ref_arm = next((a for a in cfg.arms if a.baseline == "autoregressive"), None)
        ref = {} if ref_arm is None else {answer_key(r["question_id"], r["repeat"]): r
                                          for r in read_answers(run_dir.answers(ref_arm.name))}
        differing = []
        for arm in cfg.arms:
            if arm is ref_arm:
                continue
            for record in read_answers(run_dir.answers(arm.name)):
                base = ref.get(answer_key(record["question_id"], record["repeat"]))
                if record.get("greedy") and base is not None and record["output_ids"] != base["output_ids"]:
                    differing.append((arm.name, record, base))
        if not differing:
            path.unlink(missing_ok=True)
            return
        model = ModelPool(cfg).target()
        encoder = self.encoder()
        by_id = {json.dumps(q.question_id): q for q in questions}
        found = []
        for arm_name, record, base in differing:
            question, prompt = by_id.get(json.dumps(record["question_id"])), None
            if question is None:
                continue
            for turn, (want, got) in enumerate(zip(base["output_ids"], record["output_ids"])):
                prompt = encoder.encode(question.turns, base["output_ids"][:turn], prompt)
                div = find_divergence(model, arm_name, record["question_id"], record["repeat"], turn, prompt, want, got)
                if div is not None:
                    found.append(div.to_dict())
                    break
        path.write_text(json.dumps(found, indent=1) + "\n", encoding="utf-8")

    def _prepare(self, arms: list[ArmConfig], questions: list[Question]):
        cfg = self.config
        encoder = self.encoder()
        pool = ModelPool(cfg)
        from specframe.models.target import TargetModel

        target = TargetModel(pool.target())
        runners = {arm.name: build_runner(arm, pool, target, cfg) for arm in arms}
        self._skip_overflowing(encoder, target, questions, runners)
        eos: set[int] = set()
        if cfg.stop_at_eos and target.eos_token_id is not None:
            ids = target.eos_token_id
            eos = {int(ids)} if isinstance(ids, int) else {int(i) for i in ids}
        return encoder, target, runners, eos

    def _skip_overflowing(self, encoder: PromptEncoder, target: Any, questions: list[Question], runners: dict) -> None:
        """Apply ``[data] on_overflow`` to questions that do not fit the context: the target's, or
        a draft model's when one has fewer positions.

        ``error`` raises; ``skip`` removes the question from ``questions`` (for every arm, so
        the comparison stays paired) and lists it in run.json, which the report shows.
        """
        self._limit = context_limit(target, runners)
        skipped = []
        for q in list(questions):
            prompt = encoder.encode(q.turns, [], None)
            longest = self._longest_prompt(encoder, q, prompt) if self.config.data.on_overflow == "skip" else prompt
            if self.config.data.on_overflow == "skip" and prompt and len(longest) + self.config.max_new_tokens > self._limit[0]:
                skipped.append({"question_id": q.question_id, "prompt_tokens": len(longest),
                                **({"turn": len(q.turns)} if len(q.turns) > 1 else {}),
                                "max_new_tokens": self.config.max_new_tokens,
                                "max_positions": self._limit[0], "limited_by": self._limit[1]})
                questions.remove(q)
                continue
            self._check_length(prompt, target, q)
        if skipped:
            RunFile(self.out_dir).add_overflow_skipped(skipped)
            warn(f"{len(skipped)} prompt(s) skipped: prompt + max_new_tokens exceeds the {self._limit[0]} positions "
                 f"of {self._limit[1]} ([data] on_overflow = \"skip\"; listed in the report)")

    def _longest_prompt(self, encoder: PromptEncoder, q: Question, first: list[int]) -> list[int]:
        """The prompt of ``q``'s last turn when every earlier answer is ``max_new_tokens`` long:
        the most context any arm can need for it (so "skip" leaves a question out up front, for
        every arm, instead of failing on a later turn). With a chat template an answer is
        re-rendered as text; its tokens are taken to re-encode to at most as many."""
        prompt, answers = first, []
        for _ in range(1, len(q.turns)):
            answers.append([] if encoder.chat_template else [0] * self.config.max_new_tokens)
            prompt = encoder.encode(q.turns, answers, prompt)
        extra = (len(q.turns) - 1) * self.config.max_new_tokens if encoder.chat_template else 0
        return prompt + [0] * extra

    def _fits(self, prompt: list[int], target: Any) -> bool:
        return len(prompt) + self.config.max_new_tokens <= self._positions(target)[0]

    def _positions(self, target: Any) -> tuple[int, str]:
        """``(positions, whose)``: the context every arm fits in (set when the arms are built)."""
        return getattr(self, "_limit", None) or (target.max_positions, "the target")

    def _check_length(self, prompt: list[int], target: Any, q: Question) -> None:
        if not prompt:
            raise ExperimentError(f"the prompt encodes to no tokens (question {q.question_id!r}): "
                                  "remove the question or give it text")
        if not self._fits(prompt, target):
            fix = ("lower max_new_tokens, or set [data] on_overflow = \"skip\" to leave such prompts out"
                   if self.config.data.on_overflow != "skip" else
                   "lower max_new_tokens (on_overflow = \"skip\" left out the questions whose turns could not fit "
                   "with answers of max_new_tokens tokens; this one's chat rendering grew past that bound)")
            positions, whose = self._positions(target)
            raise ExperimentError(
                f"prompt too long for {whose} (question {q.question_id!r}): prompt ({len(prompt)} tokens) + "
                f"max_new_tokens ({self.config.max_new_tokens}) exceeds the {positions} positions of {whose}: {fix}"
            )

    def _compute(self, todo: list, questions: list[Question], store: AnswerStore, skipped: int) -> int:
        cfg = self.config
        pending = [a for a in cfg.arms if any(t[2] is a for t in todo)]
        self._say(f"loading the target and {len(pending)} arm(s) ...")
        with _no_loading_bars():
            encoder, target, runners, eos = self._prepare(pending, questions)
        # on_overflow = "skip" may have removed questions: drop their work too.
        kept = {json.dumps(q.question_id) for q in questions}
        todo = [t for t in todo if json.dumps(t[1].question_id) in kept]
        self._record_greedy(runners)
        if not todo:
            return 0
        if cfg.warmup:
            self._say(f"warm-up: {cfg.warmup} untimed generation(s) per arm ...")
        self._warmup(pending, runners, encoder, questions[0], eos)
        computed = 0
        if cfg.batch_size > 1:
            with self._progress(total=skipped + len(todo), completed=skipped) as advance:
                return self._compute_batched(todo, questions, runners, encoder, target, eos, store, advance)
        order = {json.dumps(q.question_id): i for i, q in enumerate(questions)}
        state = _StatePositions()
        with self._progress(total=skipped + len(todo), completed=skipped) as advance:
            for repeat, question, arm in todo:
                runner, index = runners[arm.name], order[json.dumps(question.question_id)]
                if keeps_state(runner) and not state.follows(arm.name, repeat, index):
                    # A fresh drafter, then the repeat's earlier questions untimed: the state a
                    # run that never stopped would have here (the warm-up's is gone too).
                    fresh_drafter(runner)
                    for earlier in questions[:index]:
                        self._answer(arm, runner, encoder, earlier, repeat, eos, target)
                record = store.append(self._answer(arm, runner, encoder, question, repeat, eos, target))
                state.mark(arm.name, repeat, index)
                computed += 1
                advance(arm.name)
                if self.on_record is not None:
                    self.on_record(arm.name, record)
        return computed

    def _compute_batched(self, todo: list, questions: list[Question], runners: dict, encoder: PromptEncoder,
                         target: Any, eos: set[int], store: AnswerStore, advance: Callable) -> int:
        """``batch_size`` > 1: the questions in chunks of B, every arm decoding each chunk in turn.

        A record's ``wall_time`` is its share of the batch's wall time by tokens, so the report's
        tokens/s is the batch's throughput; ``extra["batch"]`` keeps the batch size, the
        sequence's latency (batch start to its last token) and the batch's wall time.
        ``batch_refill``: one chunk per repeat (all its questions), decoded with at most B
        sequences live (continuous batching), the latency being a sequence's time from its
        prefill to its last token. Chunks are cut from every question of a repeat in file order,
        so a drafter that keeps state across requests sees the same chunks before each of its
        answers whether or not the run was resumed (it decodes the earlier ones untimed).
        """
        from specframe.experiments.batch_baselines import autoregressive_batch, autoregressive_refill

        cfg = self.config
        work = {(r, answer_key(q.question_id, r), a.name) for r, q, a in todo}
        size = len(questions) if cfg.batch_refill else cfg.batch_size  # refill: one window of them all
        chunks = [(repeat, questions[i : i + size]) for repeat in sorted({r for r, _, _ in todo})
                  for i in range(0, len(questions), size)]
        live = cfg.batch_size if cfg.batch_refill else None
        computed = 0
        for n, (repeat, chunk) in enumerate(chunks):
            for arm in cfg.arms:
                qs = [q for q in chunk if (repeat, answer_key(q.question_id, repeat), arm.name) in work]
                runner = runners[arm.name]
                if keeps_state(runner):
                    if not self._batch_state_needed(chunks[n:], repeat, arm, work):
                        continue
                    if n == 0 or chunks[n - 1][0] != repeat:
                        fresh_drafter(runner)  # a repeat starts from a fresh drafter
                    qs = list(chunk)  # the whole chunk: later answers of the repeat build on it
                if not qs:
                    continue
                prompts = [self._single_turn_prompt(encoder, q, target) for q in qs]
                seeds = [self._generator(repeat, 0, q.question_id) for q in qs]
                if hasattr(runner, "generate_batch"):
                    runner.prepare_batch(cfg, prompts, eos)  # before the clock: rows built, warmed up
                _sync(target.device)
                start = time.perf_counter()
                projected = None
                if hasattr(runner, "generate_batch"):
                    outs, latency, projected = runner.generate_batch(prompts, cfg, eos, seeds, live)
                elif arm.baseline == "autoregressive" and live:
                    tokens = autoregressive_refill(target, prompts, cfg.max_new_tokens, eos, live)
                    outs = [ArmOutput(t, len(t), 0, [1] * len(t)) for t in tokens]
                    latency = None
                elif arm.baseline == "autoregressive":
                    tokens = autoregressive_batch(target.model, prompts, cfg.max_new_tokens, eos)
                    outs = [ArmOutput(t, len(t), 0, [1] * len(t)) for t in tokens]
                    latency = None
                else:
                    raise ExperimentError(f"batch_size = {cfg.batch_size}: arm {arm.name!r} does not decode "
                                          "with the engine, so it cannot batch; set batch_size = 1")
                _sync(target.device)
                wall = time.perf_counter() - start if projected is None else projected
                total = max(1, sum(len(o.tokens) for o in outs))
                for i, (q, prompt, out) in enumerate(zip(qs, prompts, outs)):
                    if (repeat, answer_key(q.question_id, repeat), arm.name) not in work:
                        continue  # decoded for the drafter's state only: answered by an earlier run
                    share = wall * len(out.tokens) / total
                    model_id = f"{Path(cfg.target.model).name}-{arm.slug}"
                    record = make_record(arm, q, repeat, model_id, runner.greedy,
                                         [(prompt, out, share, encoder.decode(out.tokens))], 0)
                    record.extra["batch"] = {"size": min(len(qs), cfg.batch_size), **({"refill": True} if live else {}),
                                             "latency": round(latency[i] if latency else wall, 7),
                                             "wall": round(wall, 7)}
                    record.extra["device"] = self.device(target)
                    store.append(record)
                    computed += 1
                    advance(arm.name)
                    if self.on_record is not None:
                        self.on_record(arm.name, record)
        return computed

    @staticmethod
    def _batch_state_needed(rest: list, repeat: int, arm: ArmConfig, work: set) -> bool:
        """True when ``arm`` has work in this or a later chunk of ``repeat``."""
        return any((repeat, answer_key(q.question_id, repeat), arm.name) in work
                   for r, chunk in rest if r == repeat for q in chunk)

    def _single_turn_prompt(self, encoder: PromptEncoder, q: Question, target: Any) -> list[int]:
        """The prompt of a one-turn question (batched runs decode one turn per sequence)."""
        if len(q.turns) != 1:
            raise ExperimentError(f"batch_size = {self.config.batch_size}: question {q.question_id!r} has "
                                  f"{len(q.turns)} turns; batched runs take single-turn questions only "
                                  "(set batch_size = 1 for multi-turn data)")
        prompt = encoder.encode(q.turns, [], None)
        self._check_length(prompt, target, q)
        return prompt

    def _say(self, text: str) -> None:
        if self.progress:
            from rich.console import Console

            (self.console or Console(stderr=True)).print(text, markup=False)

    def _record_greedy(self, runners: dict) -> None:
        """Note the greedy arms, and the arms whose drafter keeps state across requests (the
        report states the protocol they were timed under)."""
        run_file = RunFile(self.out_dir)
        run_file.record_greedy({name: bool(r.greedy) for name, r in runners.items()})
        lossy = {a.name: label for a in self.config.arms if a.name in runners and (label := lossy_label(a))}
        if lossy:  # the report marks these arms (their answers may differ by design)
            run_file.update(lossy={**run_file.read().get("lossy", {}), **lossy})
        stateful = sorted(set(run_file.read().get("protocol", {}).get("stateful_arms", []))
                          | {name for name, r in runners.items() if keeps_state(r)})
        run_file.update(protocol={**PROTOCOL, "stateful_arms": stateful})

    def _warmup(self, arms: list[ArmConfig], runners: dict, encoder: PromptEncoder, q: Question, eos: set[int]) -> None:
        """``warmup`` untimed generations of ``q`` per arm; then every drafter that keeps state
        across requests is rebuilt, so the warm-up leaves no trace in a timed answer."""
        prompt = encoder.encode(q.turns, [], None)
        for _ in range(self.config.warmup):
            for arm in arms:
                _generate(arm, runners[arm.name], prompt, self.config.max_new_tokens, eos, self._generator(0, 0),
                          f"question {q.question_id!r}, warm-up")
        for arm in arms:
            if keeps_state(runners[arm.name]):
                fresh_drafter(runners[arm.name])

    def _generator(self, repeat: int, turn: int, question_id: Any = None) -> torch.Generator:
        # Every arm gets the same seed for the same (question, repeat, turn): a fair draw.
        qhash = zlib.crc32(json.dumps(question_id).encode()) if question_id is not None else 0
        seed = (self.config.seed * 1_000_003 + repeat * 10_007 + turn * 101 + qhash) % (1 << 63)
        torch.manual_seed(seed)
        # A CPU generator: plugins draw on the generator's device, so draws match CPU and GPU.
        return torch.Generator().manual_seed(seed)

    def _answer(self, arm: ArmConfig, runner: Any, encoder: PromptEncoder, q: Question, repeat: int,
                eos: set[int], target: Any) -> AnswerRecord:
        turns, answers, prompt = [], [], None
        for k in range(len(q.turns)):
            prompt = encoder.encode(q.turns, answers, prompt)
            self._check_length(prompt, target, q)
            gen = self._generator(repeat, k, q.question_id)
            _sync(target.device)
            start = time.perf_counter()
            out = _generate(arm, runner, prompt, self.config.max_new_tokens, eos, gen,
                            f"question {q.question_id!r}, repeat {repeat}" + (f", turn {k + 1}" if k else ""))
            _sync(target.device)
            wall = time.perf_counter() - start
            # A replayed arm (specframe.replay) reports the wall time its live run is projected to take.
            wall = getattr(out, "projected_wall", wall)
            turns.append((prompt, out, wall, encoder.decode(out.tokens)))
            answers.append(out.tokens)
        explore = repeat == 0 and json.dumps(q.question_id) in self._explored
        trees_k = self.config.output.trees_per_answer if repeat == 0 else 0
        model_id = f"{Path(self.config.target.model).name}-{arm.slug}"
        record = make_record(arm, q, repeat, model_id, runner.greedy, turns, trees_k, text=TokenText(encoder.tokenizer),
                             max_budget=policy_budget(runner), explore=explore)
        record.extra["device"] = self.device(target)
        return record

    def device(self, target: Any) -> dict:
        """The device this process's answers run on (every record keeps it: the report pairs
        speedups per device); ``device_index`` is set by a Ray worker (its GPU, or its number)."""
        if getattr(self, "_device", None) is None:
            from specframe.experiments.cluster.device import describe_device

            self._device = describe_device(target.device, getattr(self, "device_index", None))
        return self._device

    def _progress(self, total: int, completed: int):
        return _ProgressBar(total, completed, enabled=self.progress, console=self.console)


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


class _StatePositions:
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


def _generate(arm: ArmConfig, runner: Any, prompt: list[int], max_new_tokens: int, eos: set[int],
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


class _ProgressBar:
    """rich progress over prompts x arms (x repeats); a no-op when disabled."""

    def __init__(self, total: int, completed: int, enabled: bool, console: Any) -> None:
        self.total, self.completed, self.enabled, self.console = total, completed, enabled, console

    def __enter__(self):
        if not self.enabled:
            return lambda arm: None
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self._bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                             TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[arm]}"),
                             console=self.console, transient=False)
        self._bar.__enter__()
        task = self._bar.add_task("prompts x arms", total=self.total, completed=self.completed, arm="")
        from rich.markup import escape

        return lambda arm: self._bar.update(task, advance=1, arm=escape(arm))

    def __exit__(self, *exc) -> None:
        if self.enabled:
            self._bar.__exit__(*exc)


def run_experiment(config: ExperimentConfig | str | Path, out_dir: str | Path | None = None, fresh: bool = False,
                   on_record: RecordHook | None = None, progress: bool = True, console: Any = None) -> RunOutcome:
    """Load (if a path), validate and run an experiment; ``fresh`` discards old answers first.

    Writes answers, not the report: follow with :func:`specframe.experiments.report.write_report`.
    """
    if not isinstance(config, ExperimentConfig):
        from specframe.experiments.config import load_config

        config = load_config(config)
    target_dir = Path(out_dir) if out_dir is not None else config.output.dir
    # The discard of ``fresh`` happens under the directory's lock (see Experiment.run).
    return Experiment(config, target_dir, on_record=on_record, progress=progress, console=console,
                      fresh=fresh).run()

