"""summary.json, report.md (overall and per-category tables, figures) and the rich table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specframe.experiments.explorer import shape_extremes, write_explorer
from specframe.experiments.metrics import NEAR_TIE, load_run, summarize
from specframe.experiments.pairing import device_lines
from specframe.experiments.runs import RunDir, write_json

COLUMNS = ("arm", "answers", "tokens", "tau", "delta", "tokens/s", "TTFT ms", "prefill %", "speedup", "95% CI",
           "target fwd/token", "mismatches vs AR")
ACCURACY = "accuracy"  # shown after COLUMNS only when some arm was scored against references
QUALITY = ("NLL/token", "NLL gap")  # shown when answers were scored (a lossy arm, or score = true)


def with_accuracy(summary: dict) -> bool:
    """Whether any arm of ``summary`` has an accuracy (its questions carry reference answers)."""
    return any("accuracy" in a["overall"] for a in summary["arms"])


def with_quality(summary: dict) -> bool:
    """Whether any arm of ``summary`` was scored (its answers carry their NLL under the target)."""
    return any(a["overall"].get("nll") is not None for a in summary["arms"])


def columns(summary: dict) -> tuple[str, ...]:
    """The table columns of ``summary``: :data:`COLUMNS`, plus accuracy and the NLL columns
    when there are any."""
    return COLUMNS + ((ACCURACY,) if with_accuracy(summary) else ()) + (QUALITY if with_quality(summary) else ())


def quality_cells(metrics: dict) -> list[str]:
    """The NLL per token and its gap to the reference arm ("-" when not scored)."""
    gap, ci = metrics.get("nll_gap"), metrics.get("nll_gap_ci")
    cell = "-" if gap is None else f"{gap:+.3f}" + (f" [{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else "")
    return [_num(metrics.get("nll"), 3), cell]


def agreement_cell(arm: dict, metrics: dict, baseline: str | None) -> str:
    """The "mismatches vs AR" cell: a count for greedy lossless arms; a lossy arm is marked
    as such, with its share of answers identical to autoregressive's under greedy."""
    if arm["name"] == baseline:
        return "(reference)"
    if "lossy" in arm:
        mark = f"lossy: {arm['lossy']}"
        if metrics.get("identical") is None:
            return mark
        first = metrics.get("first_divergence")
        same = round(metrics["identical"] * metrics["compared"])
        return f"{mark}; identical {same}/{metrics['compared']}" + (f", first diff at {first:.1f}" if first is not None else "")
    if not arm["greedy"]:
        return "n/a (sampling)"
    if "mismatches" in metrics:
        return f"{metrics['mismatches']}/{metrics['compared']}"
    return "-"


def accuracy_cell(metrics: dict) -> str:
    """``"0.75 (15/20)"``: the share correct and the count; "-" without references."""
    if metrics.get("accuracy") is None:
        return "-"
    return f"{metrics['accuracy']:.2f} ({metrics['correct']}/{metrics['scored']})"


def _num(value: Any, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def first_token_cells(metrics: dict) -> list[str]:
    """The "TTFT ms" and "prefill %" cells ("-" where the answers did not record them: runs
    written before these fields, prefills no arm can time apart)."""
    ttft, share = metrics.get("ttft"), metrics.get("prefill_share")
    return [_num(None if ttft is None else ttft * 1000, 1), _num(None if share is None else share * 100, 1)]


def row(arm: dict, metrics: dict, baseline: str | None, accuracy: bool = False, quality: bool = False) -> list[str]:
    """One table row: the columns of :data:`COLUMNS` as text, the accuracy if ``accuracy``,
    the NLL columns if ``quality``."""
    sp = metrics.get("speedup")
    speed = "-" if sp is None else (f"{sp:.2f}" + (f" ± {metrics['speedup_std']:.2f}" if metrics.get("speedup_std") else ""))
    ci = metrics.get("speedup_ci")
    mism = agreement_cell(arm, metrics, baseline)
    return [
        arm["name"] + (" (replay)" if arm.get("replay") else ""), str(metrics["answers"]), str(metrics["tokens"]), _num(metrics["tau"]), _num(metrics["delta"]),
        _num(metrics["tokens_per_s"], 1), *first_token_cells(metrics), speed, "-" if not ci else f"[{ci[0]:.2f}, {ci[1]:.2f}]",
        _num(metrics["target_forwards_per_token"], 3), mism,
    ] + ([accuracy_cell(metrics)] if accuracy else []) + (quality_cells(metrics) if quality else [])


def _md_table(rows: list[list[str]], cols: tuple[str, ...] = COLUMNS) -> list[str]:
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
    return lines


def markdown(summary: dict, figures: dict[str, str], explorer: str | None = None,
             extremes: list[dict] | None = None) -> str:
    """The report text; ``explorer``: the path of trees.html relative to the report, if written;
    ``extremes``: its steps to point at (:func:`specframe.experiments.explorer.shape_extremes`)."""
    base = summary.get("baseline")
    acc, qual = with_accuracy(summary), with_quality(summary)
    cols = columns(summary)
    lines = [
        f"# Experiment: {summary.get('name')}", "",
        f"Target `{summary.get('target')}`, max_new_tokens {summary.get('max_new_tokens')}, "
        f"repeats {summary.get('repeats')}, torch {summary.get('torch')}.",
        f"Speedup is relative to the `{base}` arm on the same prompts." if base
        else "No `autoregressive` arm: speedups are not available.", "",
        "## Overall", "",
    ]
    if summary.get("replay"):
        rep = summary["replay"]
        lines[-3:-3] = [f"Arms marked (replay) were replayed over the trace `{rep['trace']}` without running the "
                        f"target (docs/replay.md); their times are projected: {rep['projection']}.", ""]
    lines += _md_table([row(a, a["overall"], base, acc, qual) for a in summary["arms"]], cols)
    categories = sorted({c for a in summary["arms"] for c in a["categories"]})
    if len(categories) > 1:
        lines += ["", "## Per category"]
        for cat in categories:
            lines += ["", f"### {cat}", ""]
            lines += _md_table([row(a, a["categories"][cat], base, acc, qual) for a in summary["arms"]
                                if cat in a["categories"]], cols)
    lines += device_lines(summary)
    lines += notices(summary)
    if explorer:
        lines += ["", "## Draft trees, step by step", "",
                  f"[{explorer}]({explorer}) (open it in a browser; it needs no network): each answer of the first "
                  "questions cut into its steps; click a step to see its draft tree in decoded text, with the drafter's "
                  "probabilities, the accepted path, the bonus token and the step's budget, depth and width per layer, "
                  "two arms side by side."]
        if extremes:
            lines += ["", "Each arm's deepest and widest tree there (an adaptive policy's shape follows the drafter's "
                      "confidence at the root):", ""]
            lines += [f"- `{e['arm']}`, {e['kind']}: [question {e['question_id']!r}, step {e['step'] + 1}]"
                      f"({explorer}#{e['anchor']}): depth {e['depth']}, widest layer {e['width']}"
                      + (f", root confidence {e['root_p']:.2f}" if e["root_p"] is not None else "") for e in extremes]
    if figures:
        lines += ["", "## Figures", ""]
        for title, rel in figures.items():
            lines += [f"### {title}", "", f"![{title}]({rel})", ""]
    lines += [
        "", "## Definitions", "",
        "- tau: tokens emitted per target forward, bonus token included.",
        "- delta: draft forwards per target forward.",
        "- speedup: autoregressive wall time / arm wall time over the same (question, repeat) answers; "
        "± is the standard deviation over repeats, the CI a bootstrap over questions.",
        "- TTFT ms: mean time from a generation's call to its first token, over the turns that recorded it.",
        "- prefill %: the target's forward over the prompt, as a share of the wall time of the turns that "
        "recorded it (\"-\": not recorded; transformers' arms merge the prefill into their first forward).",
        "- target fwd/token: target forwards per emitted token (1 / tau).",
        "- mismatches vs AR: greedy answers whose tokens differ from the autoregressive arm's.",
        *(["- accuracy: share of answers (last turn) whose final number matches the question's reference "
            "answer (GSM8K rule), with correct/scored; \"-\" for arms without references."] if acc else []),
        *([f"- NLL/token: mean negative log-likelihood (nats) of an arm's answers under the target, from its "
           f"verification forwards; NLL gap: that less the lossless reference arm "
           f"`{summary.get('nll_reference')}`'s (> 0: text the target finds less likely), with a 95% bootstrap "
           f"CI over questions (the sampling of answers alone moves it that much)."] if qual else []),
        "- lossy: the arm's verifier is not lossless (docs/verifiers.md): its answers may differ from exact "
        "decoding by design, so it shows, under greedy, its share of answers identical to autoregressive's and "
        "the mean token position where the others first differ, instead of a mismatch count.",
        "", "Full definitions: docs/experiments.md.", "",
    ]
    return "\n".join(lines)


def notice_lines(summary: dict) -> list[str]:
    """What the run capped or left out: budgets cut by the context, skipped prompts."""
    out = []
    replay = summary.get("replay")
    if replay:
        out.append(f"every arm was replayed over {replay['trace']} (curve: {replay['curve']}); auto-sized policies "
                   "(budget, mu or gamma = \"auto\") decide from the projected step times there, so their trees "
                   "can differ from a live run's (docs/replay.md)")
        if replay.get("not_replayed"):
            out.append(f"not replayed: {', '.join(replay['not_replayed'])}")
    protocol = summary.get("protocol") or {}
    stateful = [a["name"] for a in summary["arms"] if a["name"] in protocol.get("stateful_arms", [])]
    if stateful:
        out.append(f"arms {', '.join(stateful)} draft with state kept across requests: "
                   f"{protocol['state_across_requests']}; the warm-up: {protocol['warmup']}")
    for arm in summary["arms"]:
        cut = arm.get("budget_cuts") or {}
        if cut.get("steps"):
            out.append(f"arm {arm['name']}: the context cut the node budget in {cut['steps']} of {cut['of']} "
                       f"steps (by up to {cut['max_cut']} nodes): the target's maximum length is near")
    lossy = {a["name"] for a in summary["arms"] if "lossy" in a}
    by_design: dict[str, int] = {}
    for div in summary.get("divergences") or []:
        if div["arm"] in lossy:  # expected: counted once per arm below, listed in divergences.json
            by_design[div["arm"]] = by_design.get(div["arm"], 0) + 1
            continue
        out.append(f"arm {div['arm']}, question {div['question_id']!r} (repeat {div['repeat']}, turn {div['turn']}): "
                   f"differs from autoregressive at token {div['position']} ({div['arm_token']} instead of "
                   f"{div['reference_token']}); the target's top-2 logit margin there is {div['margin']:.3g}"
                   + (" (a float32 near-tie)" if div["margin"] < NEAR_TIE else ""))
    for name, count in by_design.items():
        out.append(f"arm {name} (lossy) differs from autoregressive in {count} answer(s), as its verifier allows "
                   "(divergences.json lists where, with the target's margin there)")
    for skip in summary.get("overflow_skipped") or []:
        out.append(f"question {skip['question_id']!r} skipped: prompt ({skip['prompt_tokens']} tokens) + "
                   f"max_new_tokens ({skip['max_new_tokens']}) exceeds the target's {skip['max_positions']} "
                   "positions ([data] on_overflow = \"skip\")")
    return out


def notices(summary: dict) -> list[str]:
    """The report's "Notices" section (empty when there is nothing to notice)."""
    found = notice_lines(summary)
    return ["", "## Notices", "", *(f"- {line}" for line in found)] if found else []


def write_report(out_dir: str | Path, plots: bool = True, allow_mixed_devices: bool = False) -> dict:
    """Recompute summary.json, the plots, trees.html and report.md from the answers in ``out_dir``.

    What ``specframe run`` / ``demo`` / ``report`` do after a run; returns the summary. Answers
    on devices of unlike kinds are refused unless ``allow_mixed_devices`` (docs/distributed.md).
    """
    run_dir = RunDir(out_dir)
    run = load_run(run_dir.path)
    summary = summarize(run, allow_mixed_devices)
    if run.get("replay"):  # specframe.replay marks its runs: every table says so
        summary["replay"] = run["replay"]
        for arm in summary["arms"]:
            arm["replay"] = run["replay"]["arms"].get(arm["name"], True)
    if run.get("protocol"):
        summary["protocol"] = run["protocol"]
    if run_dir.divergences.exists():
        summary["divergences"] = json.loads(run_dir.divergences.read_text(encoding="utf-8"))
    write_json(run_dir.summary, summary)
    figures: dict[str, str] = {}
    explorer = write_explorer(run, run_dir.explorer)
    if plots:
        from specframe.experiments.plots import make_plots

        figures = make_plots(run, summary, run_dir.plots)
        figures = {title: str(Path(p).relative_to(run_dir.path)) for title, p in figures.items()}
    extremes = shape_extremes(run) if explorer else []
    run_dir.report.write_text(markdown(summary, figures, explorer and explorer.name, extremes), encoding="utf-8")
    return summary


def summary_table(summary: dict, title: str | None = None) -> Any:
    """The overall table as a ``rich.table.Table``."""
    from rich.markup import escape
    from rich.table import Table

    # Arm names like "talon[mu=0.01]" would read as rich markup: escape every cell.
    table = Table(title=escape(title or f"{summary.get('name')}: {summary.get('target')}"))
    # Arm names are what a reader compares: never ellipsise them (a narrow or piped terminal
    # folds the numeric columns instead).
    longest = max((len(a["name"]) + (9 if a.get("replay") else 0) for a in summary["arms"]), default=3)
    acc, qual = with_accuracy(summary), with_quality(summary)
    for col in columns(summary):
        if col == "arm":
            table.add_column(col, justify="left", no_wrap=True, min_width=longest)
        else:
            table.add_column(col, justify="right", overflow="fold")
    for arm in summary["arms"]:
        table.add_row(*(escape(c) for c in row(arm, arm["overall"], summary.get("baseline"), acc, qual)))
    return table
