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

import json
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from specframe.errors import ExperimentError, warn
from specframe.experiments.batching import answer_in_batches
from specframe.experiments.config import ArmConfig, ExperimentConfig, lossy_label
from specframe.experiments.data import PromptEncoder, Question, load_questions
from specframe.experiments.divergence import write_divergences
from specframe.experiments.loading import ModelPool, load_tokenizer, no_loading_bars, stop_tokens, sync
from specframe.experiments.progress import ProgressBar
from specframe.experiments.records import make_record, policy_budget
from specframe.experiments.runlock import DirectoryInUseError, RunLock
from specframe.experiments.runners import (StatePositions, build_runner, context_limit, fresh_drafter,
                                           guarded_generate, keeps_state)
from specframe.experiments.runs import AnswerRecord, AnswerStore, RunDir, RunFile, answer_key
from specframe.experiments.runs.runfile import question_digest
from specframe.models.linears import planned_label
from specframe.experiments.explorer.tokentext import TokenText

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
                       target=cfg.target.model, source=str(cfg.source or ""), torch=torch.__version__,
                       linears=planned_label(cfg.target.linears, cfg.target.packed_linears),
                       exact=cfg.target.exact)
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
        write_divergences(self.config, self.out_dir, questions, self.encoder())
        return RunOutcome(self.out_dir, computed, skipped)

    def prepare_arms(self, arms: list[ArmConfig], questions: list[Question]) -> tuple[PromptEncoder, Any, dict, set[int]]:
        """Load the models once and build each of ``arms``' runner over them: returns the prompt
        encoder, the target, the runners by arm name and the stop tokens. Questions that do not
        fit the context are handled here (``[data] on_overflow``). A subclass that holds models
        across calls (a replay, an A/B of two targets, a Ray worker) overrides it."""
        cfg = self.config
        encoder = self.encoder()
        pool = ModelPool(cfg)
        from specframe.models.target import TargetModel

        target = TargetModel(pool.target())
        runners = {arm.name: build_runner(arm, pool, target, cfg) for arm in arms}
        self._skip_overflowing(encoder, target, questions, runners)
        eos = stop_tokens(self.config, target)
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
        with no_loading_bars():
            encoder, target, runners, eos = self.prepare_arms(pending, questions)
        # on_overflow = "skip" may have removed questions: drop their work too.
        kept = {json.dumps(q.question_id) for q in questions}
        todo = [t for t in todo if json.dumps(t[1].question_id) in kept]
        self._record_greedy(runners)
        if not todo:
            return 0
        if cfg.warmup:
            self._say(f"warm-up: {cfg.warmup} untimed generation(s) per arm ...")
        self.warm_up(pending, runners, encoder, questions[0], eos)
        computed = 0
        if cfg.batch_size > 1:
            with self._progress(total=skipped + len(todo), completed=skipped) as advance:
                return answer_in_batches(self, todo, questions, runners, encoder, target, eos, store, advance)
        order = {json.dumps(q.question_id): i for i, q in enumerate(questions)}
        state = StatePositions()
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

    def single_turn_prompt(self, encoder: PromptEncoder, q: Question, target: Any) -> list[int]:
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

    def warm_up(self, arms: list[ArmConfig], runners: dict, encoder: PromptEncoder, q: Question, eos: set[int]) -> None:
        """``warmup`` untimed generations of ``q`` per arm; then every drafter that keeps state
        across requests is rebuilt, so the warm-up leaves no trace in a timed answer."""
        prompt = encoder.encode(q.turns, [], None)
        for _ in range(self.config.warmup):
            for arm in arms:
                guarded_generate(arm, runners[arm.name], prompt, self.config.max_new_tokens, eos,
                                 self.seed_generator(0, 0), f"question {q.question_id!r}, warm-up")
        for arm in arms:
            if keeps_state(runners[arm.name]):
                fresh_drafter(runners[arm.name])

    def seed_generator(self, repeat: int, turn: int, question_id: Any = None) -> torch.Generator:
        """The generator of one (repeat, turn, question), seeded from the run's seed."""
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
            gen = self.seed_generator(repeat, k, q.question_id)
            sync(target.device)
            start = time.perf_counter()
            out = guarded_generate(arm, runner, prompt, self.config.max_new_tokens, eos, gen,
                            f"question {q.question_id!r}, repeat {repeat}" + (f", turn {k + 1}" if k else ""))
            sync(target.device)
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
            from specframe.experiments.device import describe_device

            self._device = describe_device(target.device, getattr(self, "device_index", None))
        return self._device

    def _progress(self, total: int, completed: int):
        return ProgressBar(total, completed, enabled=self.progress, console=self.console)


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

