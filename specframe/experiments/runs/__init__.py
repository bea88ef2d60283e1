"""Run directories: their layout, the append-only answers store, the run file and the answer record.

An experiment (:mod:`specframe.experiments.experiment`) writes answers through this package; metrics and
the report (:mod:`specframe.experiments.metrics`, :mod:`specframe.experiments.report`) read them back through it.
Nothing here imports the experiment, the metrics or the report.
"""

from __future__ import annotations

from specframe.experiments.runs.layout import (
    ANSWERS_DIR, ANSWERS_SUFFIX, DIVERGENCES_FILE, PLOTS_DIR, REPORT_FILE, RUN_FILE, SUMMARY_FILE, RunDir,
    slugify, write_json,
)
from specframe.experiments.runs.record import AnswerRecord, Choice, answer_key, steps_columns
from specframe.experiments.runs.runfile import RunFile
from specframe.experiments.runs.store import AnswerStore, read_answers

__all__ = [
    "ANSWERS_DIR", "ANSWERS_SUFFIX", "DIVERGENCES_FILE", "PLOTS_DIR", "REPORT_FILE", "RUN_FILE", "SUMMARY_FILE",
    "AnswerRecord", "AnswerStore", "Choice", "RunDir", "RunFile", "answer_key", "read_answers", "slugify",
    "steps_columns", "write_json",
]
