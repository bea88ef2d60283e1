"""Outputs recorded by an earlier specframe resume with nothing recomputed.

``tests/data/premove/`` holds a run directory, a trace, a replayed run and a tune study that
the code made before its modules moved into their present packages (serving/, the split
experiment and config modules, the conformance package). A fingerprint, an arm definition or a
study's inputs that named a module path or hashed a module's source would change with such a
move and make every earlier directory refuse to resume or recompute it; these tests pin that
none does. The files were made under ``/tmp/specframe-premove``: the data file's absolute path
is part of a run's fingerprint by design, so the copy here is rewritten to its new place first.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from specframe.cli import cli

RECORDED = Path(__file__).parent / "data" / "premove"
MADE_AT = "/tmp/specframe-premove"


@pytest.fixture()
def premove(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the recorded outputs, its absolute data path rewritten to the copy's."""
    monkeypatch.setenv("SPECFRAME_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "premove"
    shutil.copytree(RECORDED, out)
    for path in out.rglob("*"):
        if path.is_file() and MADE_AT in path.read_text(encoding="utf-8"):
            path.write_text(path.read_text(encoding="utf-8").replace(MADE_AT, str(out)), encoding="utf-8")
    monkeypatch.chdir(out)
    return out


def _answers(run_dir: Path) -> dict[str, str]:
    return {p.name: p.read_text(encoding="utf-8") for p in sorted((run_dir / "answers").glob("*.jsonl"))}


def _invoke(*args: str) -> str:
    result = CliRunner().invoke(cli, [*args, "--no-progress"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_a_recorded_run_resumes_with_nothing_recomputed(premove):
    before = _answers(premove / "run")
    assert len(before) == 3  # not vacuous: three arms' answers were recorded
    output = _invoke("run", "exp.toml")
    assert "0 answers computed, 6 reused" in output
    assert _answers(premove / "run") == before


def test_a_recorded_replay_over_a_recorded_trace_replays_nothing_again(premove):
    before = _answers(premove / "replay")
    output = _invoke("run", "exp.toml", "--replay", "trace", "--out", "replay")
    assert "0 answers replayed" in output
    assert _answers(premove / "replay") == before


def test_a_recorded_tune_study_runs_no_new_trial(premove):
    pytest.importorskip("optuna")
    import optuna

    from specframe.tuning.study import JOURNAL, journal_storage

    def trials() -> list:
        study = optuna.load_study(study_name="ngram+chain", storage=journal_storage(premove / "tune" / JOURNAL))
        return [(t.number, t.params, t.values) for t in study.get_trials(deepcopy=False)]

    before = trials()
    def best() -> dict:
        # The confirmation replay runs again on every call, and its speedup holds measured host
        # time; the chosen trial, its searched scores and the confirmation's tokens are exact.
        found = json.loads((premove / "tune" / "tune.json").read_text())["arms"]["ngram+chain"]["best"]
        return {"trial": found["trial"], "searched": found["searched"],
                "confirmation": {k: found["confirmation"][k] for k in ("tau", "tokens", "forwards")}}

    before, chosen = trials(), best()
    assert len(before) == 2
    _invoke("tune", "exp.toml", "--trace", "trace", "--out", "tune", "--trials", "2", "--arms", "ngram+chain")
    assert trials() == before
    assert best() == chosen
