"""The commands behind ``specframe acceptance`` and ``specframe export`` (specframe.cli calls these).

``acceptance`` measures Sequoia's acceptance vector (by depth and rank) from a run's recorded
steps or, with ``--trace``, with a probe tree replayed over a trace; ``--fit N`` also fits the
static tree of N nodes and, over a trace, replays it beside the arm. ``export`` writes an arm in
an engine's vocabulary with its fidelity statement (docs/serving.md).
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

import click

from specframe.errors import one_line


def _config(path: Path) -> Any:
    from specframe.experiments.config import ConfigError, load_config

    try:
        return load_config(path)
    except ConfigError as err:
        raise click.ClickException(one_line(err)) from err


def _run_records(source: Path, arm: str) -> tuple[Any, list[dict], Path | None]:
    """``(config or None, the arm's recorded answers, run dir)`` of a run directory or of the
    run an experiment file's output dir holds (no records: an empty list)."""
    from specframe.experiments.metrics import load_run
    from specframe.experiments.runs import RunDir

    config = _config(source) if source.is_file() else None
    run_dir = config.output.dir if config is not None else source
    if not RunDir(run_dir).is_run():
        if config is None:
            raise click.ClickException(f"{source} is neither an experiment file nor a run directory")
        return config, [], None
    run = load_run(run_dir)
    if arm not in run["arms"] and config is None:
        raise click.ClickException(f"no answers for arm {arm!r} in {run_dir}; arms: {', '.join(run['arms'])}")
    return config, run["arms"].get(arm, []), Path(run_dir)


def acceptance_main(source: Path, arm: str, trace: Path | None, width: int, depth: int, fit: int | None,
                    max_depth: int, out: Path | None, console: Any) -> None:
    """Measure, print, fit (``--fit``) and write the acceptance file."""
    from specframe.serving.acceptance import AcceptanceError, describe, fit_static_tree, from_records, provenance
    from specframe.experiments.config import ArmConfig, ConfigError, PluginRef
    from specframe.serving.engines.vllm import tree_string
    from specframe.commands.probe import probe_acceptance, replay_taus

    command = "specframe " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    try:
        if trace is not None:
            if not source.is_file():
                raise click.UsageError("--trace needs the experiment file (CONFIG) whose arm it replays")
            config = _config(source)
            acc = probe_acceptance(config, trace, arm, width, depth, provenance(command))
        else:
            config, records, run_dir = _run_records(source, arm)
            if not records:
                raise click.ClickException(f"no recorded answers of arm {arm!r} for {source}: run it first, "
                                           "or pass --trace TRACE to probe it over a trace")
            acc = from_records(records, arm, str(run_dir), provenance=provenance(command))
    except (AcceptanceError, ConfigError) as err:
        raise click.ClickException(one_line(err)) from err
    console.print(describe(acc), markup=False)
    extra: dict = {}
    if fit is not None:
        paths = fit_static_tree(acc, fit, max_depth)
        fitted = {"budget": fit, "max_depth": max_depth, "choices": [list(p) for p in paths],
                  "vllm_speculative_token_tree": tree_string(paths)}
        console.print(f"fitted static tree ({fit} nodes, depth {max(len(p) for p in paths)}): {fitted['vllm_speculative_token_tree']}",
                      markup=False)
        if trace is not None:
            original = config.arm(arm)
            static = ArmConfig(name=f"{arm} fitted static", drafter=original.drafter,
                               policy=PluginRef("static", {"choices": fitted["choices"]}), verifier=original.verifier)
            taus = replay_taus(config, trace, [original, static])
            fitted["tau"] = taus
            console.print(f"replayed tau over {trace}: {arm} {taus[arm]:.3f}, fitted static {taus[static.name]:.3f}",
                          markup=False)
        extra["fitted"] = fitted
    if out is not None:
        acc.save(out, extra)
        console.print(f"wrote {out}", markup=False)


def export_main(source: Path, arm_name: str, engine: str, out: Path | None, acceptance: Path | None, console: Any) -> None:
    """Write the arm in the engine's form (``--out`` or stdout) and print its fidelity statement."""
    from specframe.serving.acceptance import Acceptance, AcceptanceError
    from specframe.experiments.config import ConfigError
    from specframe.serving.engines import EngineError, ExportContext, export_arm
    from specframe.serving.engines.fidelity import NOT_EXPRESSIBLE

    config, records, run_dir = _run_records(source, arm_name)
    try:
        if config is not None:
            arm, models = config.arm(arm_name), ExportContext.of(config).models
        else:
            arm, models = _arm_of_run(run_dir, arm_name)
        acc = Acceptance.load(acceptance) if acceptance is not None else None
        result = export_arm(arm, engine, ExportContext(models=models, acceptance=acc, records=records))
    except (ConfigError, EngineError, AcceptanceError) as err:
        raise click.ClickException(one_line(err)) from err
    text = result.render()
    if result.fidelity.level == NOT_EXPRESSIBLE:
        click.echo(result.report(), err=True)
        raise click.exceptions.Exit(1)
    if out is not None:
        out.write_text(text + "\n", encoding="utf-8")
        console.print(f"wrote {out}", markup=False)
    else:
        click.echo(text)
    click.echo(result.report(), err=out is None)


def _arm_of_run(run_dir: Path, name: str) -> tuple[Any, dict[str, str]]:
    """The arm ``name`` as run.json describes it, and the run's model aliases."""
    from specframe.experiments.config import ArmConfig, PluginRef
    from specframe.experiments.runs import RunDir

    meta = json.loads(RunDir(run_dir).run_file.read_text(encoding="utf-8"))
    desc = meta["arms"][name]
    refs = {k: PluginRef(desc[k]["name"], desc[k].get("options", {})) if desc.get(k) else None
            for k in ("policy", "drafter", "verifier")}
    arm = ArmConfig(name=name, baseline=desc.get("baseline"), baseline_options=desc.get("baseline_options") or {},
                    imported=desc.get("imported", {}), **refs)
    fingerprint = meta.get("fingerprint", {})
    models = {alias: spec.get("model") for alias, spec in fingerprint.get("models", {}).items()}
    if fingerprint.get("target"):
        models["target"] = fingerprint["target"].get("model")
    return arm, models
