"""Every cell of a load run: the arms of an experiment file at each rate (docs/load.md).

Writes ``OUT/load.json`` (settings, arms, inputs), ``OUT/reference.json`` (each distinct
prompt's greedy decoding, computed once), ``OUT/cells/*.json`` (one per rate, arm and round,
atomic), ``OUT/summary.json``, ``OUT/table.md`` and ``OUT/plots/*.png``. A rerun reuses every
cell whose key (arm, round, settings, inputs) is unchanged. Within a rate the arms take turns
round by round, the order rotating, so that machine drift hits every arm alike.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

import torch

from specframe.experiments.config import ArmConfig, ConfigError, ExperimentConfig
from specframe.experiments.data import PromptEncoder, load_questions
from specframe.experiments.loading import ModelPool, load_tokenizer, stop_tokens
from specframe.experiments.runners import build_runner
from specframe.experiments.load.arrivals import arrival_times
from specframe.experiments.load.metrics import pooled, round_record
from specframe.experiments.load.prediction import by_live, pooled_by_live, prediction_table
from specframe.experiments.load.serve import serve_autoregressive, serve_speculative
from specframe.experiments.load.settings import LoadSettings
from specframe.experiments.load.store import cell_path, done_cell, read_json
from specframe.experiments.runs.layout import write_json

T = TypeVar("T")

#: ``progress(done, total, label)``: called before each cell and once at the end.
Progress = Callable[[int, int, str], None]


def check_arms(arms: list[ArmConfig]) -> None:
    """Load runs serve specframe arms and the ``autoregressive`` baseline; the error names the others."""
    odd = [a.name for a in arms if a.baseline not in (None, "autoregressive")]
    if odd:
        raise ConfigError(f"specframe load serves specframe arms and the 'autoregressive' baseline; "
                          f"arms {odd} are baselines it cannot batch: remove them")


def request_prompts(config: ExperimentConfig, count: int) -> list[list[int]]:
    """``count`` prompts: the data file's single-turn questions in order, cycling."""
    questions = load_questions(config.data.path, config.data.category, config.data.limit)
    if not questions:
        raise ConfigError(f"[data]: {config.data.path} holds no questions (after category and limit)")
    multi = [q.question_id for q in questions if len(q.turns) != 1]
    if multi:
        raise ConfigError(f"[data]: questions {multi[:5]} have several turns; a load run serves one turn per request")
    encoder = PromptEncoder(load_tokenizer(config), config.data.chat_template)
    encoded = [encoder.encode(q.turns, [], None) for q in questions]
    return [encoded[i % len(encoded)] for i in range(count)]


def _digest(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


class LoadRun:
    """One ``specframe load`` run over ``config``'s arms (see the module docstring)."""

    def __init__(self, config: ExperimentConfig, settings: LoadSettings, out_dir: Path,
                 progress: Progress | None = None) -> None:
        check_arms(config.arms)
        self.config, self.settings, self.out_dir = config, settings, Path(out_dir)
        self.progress = progress or (lambda done, total, label: None)
        self._pool: Any = None
        self._runners: dict[str, Any] = {}

    def run(self) -> dict:
        """Compute the missing cells, then write summary.json, table.md and the plots."""
        cfg, s = self.config, self.settings
        self.out_dir.mkdir(parents=True, exist_ok=True)
        prompts = self._prompts = request_prompts(cfg, s.requests)
        inputs = {"prompts": _digest(prompts), "max_new_tokens": cfg.max_new_tokens, "stop_at_eos": cfg.stop_at_eos,
                  "target": cfg.target.model, "dtype": cfg.target.dtype}
        write_json(self.out_dir / "load.json", {"name": cfg.name, "settings": s.describe() | {"rates": s.rates, "rounds": s.rounds},
                                                "arms": {a.name: a.describe() for a in cfg.arms}, "inputs": inputs})
        cells = [(rate, arm, r) for rate in s.rates for r in range(s.rounds) for arm in rotated(cfg.arms, r)]
        results: dict[tuple[float, str], list[dict]] = {}
        threads = torch.get_num_threads()
        if cfg.threads:
            torch.set_num_threads(cfg.threads)  # as `run` does: oversubscribed kernels spin
        try:
            for done, (rate, arm, r) in enumerate(cells):
                key = {"arm": arm.describe(), "rate": rate, "round": r, "settings": s.describe(), "inputs": inputs}
                cell = done_cell(self.out_dir, rate, arm.name, r, key)
                if cell is None:
                    label = f"{arm.name} @ {rate:g}/s" + (f", round {r + 1}/{s.rounds}" if s.rounds > 1 else "")
                    self.progress(done, len(cells), label)
                    cell = self._compute(rate, arm, r, prompts, key)
                results.setdefault((rate, arm.name), []).append(cell)
        finally:
            torch.set_num_threads(threads)
        self.progress(len(cells), len(cells), "done")
        return self._write_summary(results)

    # ------------------------------------------------------------------ cells
    def _compute(self, rate: float, arm: ArmConfig, round_: int, prompts: list[list[int]], key: dict) -> dict:
        """Serve one round of a cell, check it against the greedy references, store it atomically."""
        s, cfg = self.settings, self.config
        arrivals = arrival_times(s.arrivals, rate, s.requests, s.seed)
        reference = self._references(prompts)
        runner = self._runner(arm)
        eos = self._eos()
        if arm.baseline is None:
            served = serve_speculative(runner.load_batch, prompts, arrivals, s.max_live, cfg.max_new_tokens, eos)
        else:
            served = serve_autoregressive(self._target(), prompts, arrivals, s.max_live, cfg.max_new_tokens, eos)
        record = round_record(served, reference)
        self._divergences(record["requests"], arm.name, round_, prompts, reference, served.tokens)
        cell = {"key": key, "arm": arm.name, "rate": rate, "round": round_,
                "allocator": arm.batch_allocator.name if arm.batch_allocator else None,
                "series": {"step_at": served.step_at, "step_live": served.step_live}, **record}
        cell["by_live"] = by_live(served)  # the allocator's model beside the measurement
        write_json(cell_path(self.out_dir, rate, arm.name, round_), cell)
        return cell

    def _divergences(self, rows: list[dict], arm: str, round_: int, prompts: list[list[int]],
                     reference: list[list[int]], answers: list[list[int]]) -> None:
        """Give every request that left its greedy decoding where it did (``diverged_at``, the
        greedy ``reference_token`` and its ``token``) and the target's top-2 logit ``margin``
        there, as a run's divergences.json does: a float32 near-tie, or a bug?"""
        from specframe.experiments.divergence import find_divergence

        for i, row in enumerate(rows):
            if row["mismatch"]:
                div = find_divergence(self._target().model, arm, i, round_, 0, prompts[i], reference[i], answers[i])
                row.update(diverged_at=div.position, reference_token=div.reference_token, token=div.arm_token,
                           margin=div.margin)

    def _target(self) -> Any:
        if self._pool is None:
            from specframe.models.target import TargetModel

            self._pool = ModelPool(self.config)
            self._target_model = TargetModel(self._pool.target())
        return self._target_model

    def _eos(self) -> set[int]:
        return stop_tokens(self.config, self._target())

    def _runner(self, arm: ArmConfig) -> Any:
        """The arm's runner, its batch decoder built with the arm's allocator and warmed up once."""
        if arm.name in self._runners or arm.baseline is not None:
            return self._runners.get(arm.name)
        from specframe.decode.batch import BatchDecoder

        target = self._target()
        runner = build_runner(arm, self._pool, target, self.config)
        spec = (arm.batch_allocator.name, arm.batch_allocator.options) if arm.batch_allocator else "equal"
        runner.load_batch = BatchDecoder(runner.decoder, spec)
        if self.config.warmup:  # untimed: first-call costs (and a priced arm's curves) before any cell
            runner.load_batch.prepare(self.settings.max_live)
            runner.load_batch.generate(self._prompts[: self.settings.max_live], 2, None, max_live=self.settings.max_live)
        self._runners[arm.name] = runner
        return runner

    def _references(self, prompts: list[list[int]]) -> list[list[int]]:
        """Each request's own greedy decoding (one sequence at a time), computed once per
        distinct prompt and kept in reference.json."""
        if getattr(self, "_reference", None) is not None:
            return self._reference
        from specframe.experiments.batch_baselines import autoregressive_refill

        path = self.out_dir / "reference.json"
        key = _digest([prompts, self.config.max_new_tokens, sorted(self._eos())])
        stored = read_json(path)
        if not (isinstance(stored, dict) and stored.get("key") == key):
            distinct = sorted({tuple(p) for p in prompts})
            outs = [autoregressive_refill(self._target(), [list(p)], self.config.max_new_tokens, self._eos(), 1)[0]
                    for p in distinct]
            stored = {"key": key, "answers": {json.dumps(list(p)): o for p, o in zip(distinct, outs)}}
            write_json(path, stored)
        self._reference = [stored["answers"][json.dumps(list(p))] for p in prompts]
        return self._reference

    # ------------------------------------------------------------------ outputs
    def _write_summary(self, results: dict[tuple[float, str], list[dict]]) -> dict:
        from specframe.experiments.load.plots import make_plots
        from specframe.experiments.load.table import markdown_table

        s = self.settings
        summary = {"name": self.config.name, "settings": s.describe() | {"rates": s.rates, "slo_tpot_ms": s.slo_tpot_ms, "rounds": s.rounds},
                   "max_new_tokens": self.config.max_new_tokens, "arms": [a.name for a in self.config.arms],
                   "cells": [{"rate": rate, "arm": arm, "allocator": rounds[0].get("allocator"),
                              **pooled(rounds, s.slo_tpot_ms)}
                             for (rate, arm), rounds in sorted(results.items(), key=lambda kv: kv[0][0])]}
        for entry in summary["cells"]:
            entry["by_live"] = pooled_by_live(results[entry["rate"], entry["arm"]])
        write_json(self.out_dir / "summary.json", summary)
        (self.out_dir / "table.md").write_text(markdown_table(summary), encoding="utf-8")
        (self.out_dir / "prediction.md").write_text(prediction_table(summary, predicted_only=False), encoding="utf-8")
        # Each list is in round order (the cells run round by round): round 0 stands for the rounds.
        series = {k: (rounds[0]["series"]["step_at"], rounds[0]["series"]["step_live"]) for k, rounds in results.items()}
        make_plots(summary, series, self.out_dir)
        return summary


def rotated(arms: Sequence[T], round_: int) -> list[T]:
    """The arms in round ``round_``'s order: the given order turned left by the round."""
    k = round_ % len(arms)
    return [*arms[k:], *arms[:k]]
