"""`specframe sweep` survives kills and failing configurations: durable results, a locked output
directory, chunks identified by their content, picklable errors, failure rows and --fail-fast.

One trace of the tiny random pair is recorded per module; every sweep replays it (a few prompts,
8 new tokens) in this process, so a chunk costs one tiny model load.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import pickle
import pkgutil
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from specframe.cli import cli
from specframe.experiments.config import ConfigError
from specframe.errors import SpecframeWarning
from specframe.replay import sweep as sweep_module
from specframe.replay.sweep import chunks, load_sweep, read_results, run_sweep
from specframe.experiments.runlock import RunLock
from specframe.testing.fixtures import tiny_experiment_toml

CONFIG = tiny_experiment_toml("tiny-sweep", 8, ngram_arm=False)

#: The configuration the injected fault breaks (see ``fault``).
FAULTY = "talon[budget=5,mu=0.1]"


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    """A directory with the experiment (exp.toml), its prompts and its trace (trace/)."""
    tmp = tmp_path_factory.mktemp("sweep-resilience")
    rows = [{"question_id": i, "category": "ab"[i % 2], "turns": [f"ab ab ab {i} ab ab"]} for i in range(2)]
    (tmp / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp / "exp.toml").write_text(textwrap.dedent(CONFIG))
    result = CliRunner().invoke(cli, ["record", str(tmp / "exp.toml"), "--out", str(tmp / "trace"), "--no-progress"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return tmp


def _sweep_file(trace: Path, tmp_path: Path, budgets: list, mus: list, chunk: object = 2) -> Path:
    """A sweep file over talon's budget x mu next to the experiment; output in ``tmp_path/out``."""
    path = trace / f"sweep-{tmp_path.name}.toml"
    path.write_text(textwrap.dedent(f"""
        base = "exp.toml"
        arms = ["talon"]
        chunk = {json.dumps(chunk)}
        [grid]
        "policy.budget" = {json.dumps(budgets)}
        "policy.mu" = {json.dumps(mus)}
        [output]
        dir = "{tmp_path / 'out'}"
        """))
    return path


def _invoke(sweep_path: Path, trace: Path, *extra: str):
    return CliRunner().invoke(cli, ["sweep", str(sweep_path), "--replay", str(trace / "trace"), "--workers", "1",
                                    "--no-progress", *extra])


def _lines(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]


@pytest.fixture
def fault():
    """Make ``FAULTY`` raise mid-replay (its policy's tree growth); ``fault.undo()`` mends it
    (a monkeypatch of its own, so undoing it leaves the test's other patches in place)."""
    from specframe.strategies.talon import TalonPolicy

    grow = TalonPolicy.grow

    def broken(self, session, growth):
        if self.options.budget == 5 and self.options.mu == 0.1:
            raise RuntimeError("injected fault")
        return grow(self, session, growth)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(TalonPolicy, "grow", broken)
        yield patch


@pytest.fixture
def replays(monkeypatch) -> list[list[str]]:
    """The configurations of every replayed experiment (one model load each), in order."""
    calls: list[list[str]] = []
    replay = sweep_module._replay_rows

    def counted(base, arms, *args):
        calls.append([a.name for a in arms])
        return replay(base, arms, *args)

    monkeypatch.setattr(sweep_module, "_replay_rows", counted)
    return calls


# ---------------------------------------------------------------------- durable results
def test_a_torn_last_results_line_is_dropped_with_a_warning_and_the_rerun_completes(trace, tmp_path) -> None:
    sweep = load_sweep(_sweep_file(trace, tmp_path, [3, 6], [0.03], chunk=2))
    out = tmp_path / "out"
    run_sweep(sweep, trace / "trace", out, workers=1)
    results = out / "results.jsonl"
    text = results.read_text()
    results.write_text(text[: len(text) - 40])  # killed while writing the last row
    with pytest.warns(SpecframeWarning, match="results.jsonl"):
        rows = run_sweep(sweep, trace / "trace", out, workers=1)
    assert sorted(r["name"] for r in rows) == sorted(c.name for c in sweep.configs)
    assert sorted(r["name"] for r in _lines(out)) == sorted(c.name for c in sweep.configs)


def test_results_rows_are_fsynced(trace, tmp_path, monkeypatch) -> None:
    sweep = load_sweep(_sweep_file(trace, tmp_path, [3, 6], [0.03], chunk=2))
    out = tmp_path / "out"
    synced: list[int] = []
    fsync = os.fsync

    def counting(fd):
        synced.append(os.fstat(fd).st_ino)
        return fsync(fd)

    monkeypatch.setattr(os, "fsync", counting)
    run_sweep(sweep, trace / "trace", out, workers=1)
    assert synced.count((out / "results.jsonl").stat().st_ino) == len(_lines(out)) == 2


def test_a_second_sweep_on_the_same_directory_is_refused_naming_the_pid(trace, tmp_path) -> None:
    path = _sweep_file(trace, tmp_path, [3], [0.03])
    with RunLock(tmp_path / "out"):  # a live sweep holds the directory
        result = _invoke(path, trace)
    assert result.exit_code == 1
    assert f"pid {os.getpid()}" in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "out" / "results.jsonl").exists()


# ---------------------------------------------------------------------- chunk identity
def test_chunks_keep_their_directory_across_a_killed_sweep(trace, tmp_path, monkeypatch) -> None:
    sweep = load_sweep(_sweep_file(trace, tmp_path, [3, 4], [0.03, 0.1], chunk=2))
    out = tmp_path / "out"
    calls: list[list[str]] = []
    run_chunk = sweep_module.run_chunk
    monkeypatch.setattr(sweep_module, "run_chunk", lambda base, arms, *a: calls.append([c.name for c in arms])
                        or run_chunk(base, arms, *a))

    def killed(rows):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_sweep(sweep, trace / "trace", out, workers=1, on_done=killed)
    first = [c.name for c in chunks(sweep.configs, 2)[0]]
    assert calls == [first]
    rows = run_sweep(sweep, trace / "trace", out, workers=1)
    assert calls[1:] == [[c.name for c in group] for group in chunks(sweep.configs, 2)[1:]]  # not the first again
    assert sorted(r["name"] for r in _lines(out)) == sorted(c.name for c in sweep.configs) == sorted(
        r["name"] for r in rows)
    # Each chunk's directory is named by its configurations and holds exactly them.
    groups = {sweep_module.chunk_id(g): g for g in chunks(sweep.configs, 2)}
    assert {p.name for p in (out / "chunks").iterdir()} == set(groups)
    for name, group in groups.items():
        arms = json.loads((out / "chunks" / name / "run.json").read_text())["arms"]
        assert set(arms) == {"autoregressive", *(c.name for c in group)}


# ---------------------------------------------------------------------- picklable errors
def _exception_classes() -> list[type]:
    """Every exception class defined in specframe and its built-in plugins (drafters/,
    verifiers/ and strategies/ install as specframe.drafters, ... : walked under those names)."""
    found = {}
    for package_name in ("specframe", "specframe.drafters", "specframe.verifiers", "specframe.strategies"):
        package = importlib.import_module(package_name)
        modules = [package] + [importlib.import_module(m.name)
                               for m in pkgutil.walk_packages(package.__path__, package_name + ".")]
        for module in modules:
            for obj in vars(module).values():
                if isinstance(obj, type) and issubclass(obj, BaseException) and obj.__module__ == module.__name__:
                    found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return [found[k] for k in sorted(found)]


def _instance(cls: type) -> BaseException:
    """``cls`` built with text for its string parameters and an exception for its cause."""
    try:
        parameters = list(inspect.signature(cls).parameters.values())
    except (TypeError, ValueError):  # a builtin __init__: takes a message
        parameters = []
    if not parameters or all(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in parameters):
        return cls("something went wrong")
    args = []
    for p in parameters:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        hint = str(p.annotation)
        if "Exception" in hint:
            args.append(ValueError("the original error"))
        elif "int" in hint or "float" in hint:
            args.append(3)
        else:
            args.append(f"text of {p.name}")
    return cls(*args)


def test_every_specframe_exception_pickles() -> None:
    classes = _exception_classes()
    names = {c.__name__ for c in classes}
    assert {"ContextError", "ConfigError", "DirectoryInUseError", "DraftBuildError", "CheckpointError"} <= names
    for cls in classes:
        err = _instance(cls)
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is cls and str(back) == str(err), cls


# ---------------------------------------------------------------------- failing configurations
def test_one_failing_configuration_of_twelve_is_recorded_and_rerun_alone(trace, tmp_path, fault, replays) -> None:
    path = _sweep_file(trace, tmp_path, [3, 4, 5, 6], [0.01, 0.03, 0.1], chunk=4)
    names = [c.name for c in load_sweep(path).configs]
    assert len(names) == 12 and FAULTY in names
    result = _invoke(path, trace)
    assert result.exit_code == 1, result.output
    rows = {r["name"]: r for r in _lines(tmp_path / "out")}
    assert len(_lines(tmp_path / "out")) == 12 and set(rows) == set(names)
    assert [n for n, r in rows.items() if r.get("failed")] == [FAULTY]
    assert "injected fault" in rows[FAULTY]["error"] and "overall" not in rows[FAULTY]
    assert "failed configurations (1):" in result.output
    assert f"{FAULTY}: " in result.output and "injected fault" in result.output
    assert "best for overall" in result.output  # the 11 others are reported

    fault.undo()
    replays.clear()
    again = _invoke(path, trace)
    assert again.exit_code == 0, again.output
    assert replays == [[FAULTY]]  # the failed configuration alone, in its chunk's directory
    lines = _lines(tmp_path / "out")
    assert len(lines) == 13 and lines[-1]["name"] == FAULTY and "failed" not in lines[-1]
    latest = read_results(tmp_path / "out")
    assert len(latest) == 12 and not any(r.get("failed") for r in latest)
    assert "failed configurations" not in again.output


def test_fail_fast_stops_at_the_first_failure(trace, tmp_path, fault) -> None:
    path = _sweep_file(trace, tmp_path, [5, 6], [0.1, 0.03], chunk=2)  # the fault is in the first chunk
    result = _invoke(path, trace, "--fail-fast")
    assert result.exit_code == 1, result.output
    rows = {r["name"]: r for r in _lines(tmp_path / "out")}
    assert set(rows) == {"talon[budget=5,mu=0.1]", "talon[budget=5,mu=0.03]"}  # the second chunk never ran
    assert rows[FAULTY]["failed"] and "failed" not in rows["talon[budget=5,mu=0.03]"]
    assert "2 configuration(s) not run" in result.output


def _dies_on_the_faulty_chunk(base, arms, *rest) -> list[dict]:
    """A stand-in for run_chunk whose process dies (as an OOM kill would) on FAULTY's chunk."""
    if any(a.name == FAULTY for a in arms):
        os._exit(3)
    return [{"name": a.name, "ok": True} for a in arms]


def test_a_dead_worker_process_fails_only_its_chunk(trace, tmp_path) -> None:
    sweep = load_sweep(_sweep_file(trace, tmp_path, [5, 6], [0.1], chunk=1))
    jobs = [(None, group, "", "", None, 1) for group in chunks(sweep.configs, 1)]
    with pytest.warns(SpecframeWarning, match="worker process died"):  # the shared pool broke
        rows = [r for batch in sweep_module._local_results(jobs, 2, work=_dies_on_the_faulty_chunk) for r in batch]
    by_name = {r["name"]: r for r in rows}
    assert len(rows) == 2 and set(by_name) == {FAULTY, "talon[budget=6,mu=0.1]"}
    assert by_name[FAULTY]["failed"] and "died" in by_name[FAULTY]["error"]
    assert by_name["talon[budget=6,mu=0.1]"] == {"name": "talon[budget=6,mu=0.1]", "ok": True}  # retried alone


# ---------------------------------------------------------------------- sweep file checks
@pytest.mark.parametrize("chunk", [0, -2, "4", 2.5])
def test_a_chunk_size_that_is_no_positive_integer_is_refused(trace, tmp_path, chunk) -> None:
    with pytest.raises(ConfigError, match=f"'chunk' must be a positive integer.*got {chunk!r}"):
        load_sweep(_sweep_file(trace, tmp_path, [3], [0.03], chunk=chunk))


def test_duplicate_grid_values_are_refused_naming_the_configuration(trace, tmp_path) -> None:
    path = _sweep_file(trace, tmp_path, [4, 4], [0.03])
    with pytest.raises(ConfigError, match=r"configuration 'talon\[budget=4,mu=0.03\]' is duplicated"):
        load_sweep(path)
    result = _invoke(path, trace)
    assert result.exit_code == 1 and "is duplicated" in result.output
