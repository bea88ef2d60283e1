"""trees.html: every recorded step's draft tree, in words, beside the answer it produced.

For each arm with recorded trees and each explorer question (``[output] explorer_questions``),
the page holds the answer's text cut into one span per step, and each step's tree: decoded
token text with whitespace made visible, each node's draft probability, the accepted path,
the bonus token, and the step's budget, depth, width per layer and accepted count. Two panes
set two arms side by side on one question; clicking a span opens that step's tree, and (with
"same position" ticked) the other arm's step that emitted the same token position.

Everything is rendered here, from the answer records alone (the records carry the token
text, :mod:`specframe.experiments.explorer.tokentext`), and escaped here: the page's one script only
shows and hides these elements (:mod:`specframe.experiments.explorer.page`).
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Any, Iterator

from specframe.experiments.explorer.page import page
from specframe.experiments.explorer.tokentext import visible


def _esc(value: Any) -> str:
    """``value`` as HTML text or attribute value: every ``<``, ``>``, ``&`` and quote escaped."""
    return html.escape(str(value), quote=True)


def explorer_arms(run: dict) -> list[tuple[str, dict[str, dict]]]:
    """The arms trees.html shows, in run order: those whose repeat-0 answers carry token text
    and trees, each with its answers by question id (as JSON)."""
    out = []
    for name, records in run["arms"].items():
        kept = {json.dumps(r["question_id"]): r for r in records
                if r.get("repeat", 0) == 0 and r.get("token_text") and r.get("trees")}
        if kept:
            out.append((name, kept))
    return out


def step_spans(record: dict) -> Iterator[tuple[int, int, int, int]]:
    """``(turn, step, start, end)`` of every step: the token positions ``[start, end)`` it
    emitted, counted over the answer's turns joined (so two arms' positions line up)."""
    emitted = record.get("steps", {}).get("emitted", [])
    per_turn = record["choices"][0].get("decoding_steps") or [len(emitted)]
    step = start = 0
    for turn, count in enumerate(per_turn):
        for _ in range(count):
            end = start + emitted[step]
            yield turn, step, start, end
            step, start = step + 1, end


def render_answer(record: dict, prompts: list[str], tree_steps: set[int]) -> str:
    """The prompt(s) and the answer, each step's text one clickable span."""
    texts = [t for turn in record["token_text"] for t in turn]
    spans: dict[int, list[str]] = {}
    for turn, step, start, end in step_spans(record):
        cls = "s" if step in tree_steps else "s notree"
        title = f"step {step + 1}: tokens {start}\u2013{end - 1}" if end > start else f"step {step + 1}: no token"
        spans.setdefault(turn, []).append(
            f'<span class="{cls}" data-step="{step}" data-start="{start}" data-end="{end}" title="{_esc(title)}">'
            f"{_esc(visible(''.join(texts[start:end]), whitespace=False))}</span>")
    parts = []
    for turn in range(len(record["token_text"])):
        if turn < len(prompts):
            parts.append(f'<div class="prompt"><div class="caption">prompt{f" (turn {turn + 1})" if turn else ""}'
                         f'</div><pre>{_esc(visible(prompts[turn], whitespace=False))}</pre></div>')
        parts.append(f'<div class="caption">answer</div><div class="turn">{"".join(spans.get(turn, []))}</div>')
    return "".join(parts)


def node_probability(tree: dict, node: int) -> float | None:
    """The drafter's probability of ``node`` given its parent (from the cumulative ``logp``)."""
    logp = tree.get("logp")
    if not logp or node == 0:
        return None
    return math.exp(logp[node] - logp[tree["parents"][node]])


def width_per_layer(tree: dict) -> list[int]:
    """Nodes at depth 1, 2, ... of a recorded tree."""
    deepest = max(tree["depths"])
    return [sum(1 for d in tree["depths"] if d == k) for k in range(1, deepest + 1)]


def bonus_token(record: dict, tree: dict, start: int, end: int) -> tuple[int, str] | None:
    """``(token id, text)`` of the target's own token after the accepted path, when the step
    emitted one (a step cut at EOS or the token limit may not)."""
    if end - start != len(tree["accepted"]):
        return None
    ids = [t for turn in record["output_ids"] for t in turn]
    texts = [t for turn in record["token_text"] for t in turn]
    return ids[end - 1], texts[end - 1]


def _label(text: str, note: str) -> str:
    return f'<span class="lab"><span class="tok">{_esc(visible(text))}</span><span class="p">{_esc(note)}</span></span>'


def render_tree(tree: dict, bonus: tuple[int, str] | None) -> str:
    """Nested node elements, root first, children by rank: each ``.n`` carries ``data-n`` (its
    index in the recorded tree), ``data-t`` (token id), ``data-r`` (rank) and ``data-q`` (draft
    probability given the parent); its parent is the ``.n`` around it. The accepted path is
    ``.acc``, the target's bonus token a ``.bonus`` child of the last accepted node."""
    parents = tree["parents"]
    kids: dict[int, list[int]] = {i: [] for i in range(len(parents))}
    for i, p in enumerate(parents):
        if p >= 0:
            kids[p].append(i)
    accepted = set(tree["accepted"])
    last = tree["accepted"][-1]
    texts = tree.get("text") or [str(t) for t in tree["tokens"]]

    def node(i: int) -> str:
        prob = node_probability(tree, i)
        cls = "n" + (" acc" if i in accepted else "") + (" root" if i == 0 else "")
        inner = [node(k) for k in sorted(kids[i], key=lambda k: (tree["ranks"][k], k))]
        if i == last and bonus is not None:
            inner.append(f'<div class="n bonus" data-t="{int(bonus[0])}">{_label(bonus[1], "bonus")}</div>')
        sub = f'<div class="kids">{"".join(inner)}</div>' if inner else ""
        q = "" if prob is None else f' data-q="{prob:.4f}"'
        return (f'<div class="{cls}" data-n="{i}" data-t="{int(tree["tokens"][i])}" data-r="{int(tree["ranks"][i])}"{q}>'
                f"{_label(texts[i], '' if prob is None else f'{prob:.2f}')}{sub}</div>")

    return node(0)  # recursion as deep as the tree: a few dozen levels at most


def render_step(record: dict, tree: dict, start: int, end: int, total: int) -> str:
    """A step's header (budget, size, depth, width per layer, accepted) and its tree."""
    steps = record.get("steps", {})
    step = tree["step"]
    bonus = bonus_token(record, tree, start, end)
    root_ps = steps.get("root_p") or []
    root_p = root_ps[step] if step < len(root_ps) else None
    facts = [
        ("step", f"{step + 1} of {total}"),
        ("budget", str(tree["budget"]) if "budget" in tree else "-"),
        ("tree", f"{len(tree['tokens'])} nodes"),
        ("depth", str(max(tree["depths"]))),
        ("width per layer", "\u00b7".join(map(str, width_per_layer(tree))) or "-"),
        ("accepted", f"{len(tree['accepted']) - 1}" + (" + bonus" if bonus else "")),
    ] + ([("root confidence", f"{root_p:.2f}")] if root_p is not None else [])
    info = "".join(f'<span class="kv">{_esc(k)} <b>{_esc(v)}</b></span>' for k, v in facts)
    return f'<div class="stepinfo">{info}</div><div class="tree" data-step="{step}">{render_tree(tree, bonus)}</div>'


def _question_label(qid: str, record: dict, prompts: list[str]) -> str:
    """``id · category: the prompt's first 70 characters`` (the question choice's text)."""
    first = visible(" ".join((prompts[0] if prompts else "").split()), whitespace=False)
    return f"{json.loads(qid)} \u00b7 {record.get('category', '')}: " + (first[:70] + ("\u2026" if len(first) > 70 else ""))


def render_body(run: dict, arms: list[tuple[str, dict[str, dict]]]) -> str:
    """The page body: the controls, two panes, and a ``<template>`` per answer and per tree."""
    prompts = run.get("prompts") or {}
    qids = explorer_questions(run, arms)
    first = {q: next(recs[q] for _, recs in arms if q in recs) for q in qids}
    options = "".join(f'<option value="{i}">{_esc(_question_label(q, first[q], prompts.get(q, [])))}</option>'
                      for i, q in enumerate(qids))
    panes = []
    for pane in range(2):
        pick = min(pane, len(arms) - 1)
        arm_opts = "".join(f'<option value="{i}"{" selected" if i == pick else ""}>{_esc(name)}</option>'
                           for i, (name, _) in enumerate(arms))
        panes.append(f'<section class="pane" data-pane="{pane}"><label>arm <select class="arm">{arm_opts}</select>'
                     f'</label><div class="answer"></div><div class="treebox"></div></section>')
    templates = []
    for a, (_, recs) in enumerate(arms):
        for qi, q in enumerate(qids):
            rec = recs.get(q)
            if rec is None:
                continue
            trees = {t["step"]: t for t in rec["trees"]}
            templates.append(f'<template id="a-{a}-{qi}">{render_answer(rec, prompts.get(q, []), set(trees))}</template>')
            spans = list(step_spans(rec))
            for _, step, start, end in spans:
                if step in trees:
                    templates.append(f'<template id="t-{a}-{qi}-{step}">'
                                     f"{render_step(rec, trees[step], start, end, len(spans))}</template>")
    title = f"Draft trees: {run.get('name', '')}"
    header = (f"<header><h1>{_esc(title)}</h1><div class=\"controls\"><label>question "
              f"<select id=\"question\">{options}</select></label><label><input type=\"checkbox\" id=\"sync\" checked> "
              "open the same position in the other pane</label></div>"
              "<div class=\"legend\">Each shaded span of an answer is one step (one target forward). In a tree: "
              "green = accepted path, dashed = the target's bonus token, number = the drafter's probability given "
              "the parent; hover a node for its token id and rank. Whitespace is drawn as "
              "<span class=\"tok\">\u2423</span> (space), <span class=\"tok\">\u21b5</span> (newline), "
              "<span class=\"tok\">\u2192</span> (tab).</div></header>")
    return f"{header}<main>{''.join(panes)}</main><div hidden>{''.join(templates)}</div>"


def explorer_questions(run: dict, arms: list[tuple[str, dict[str, dict]]]) -> list[str]:
    """The page's questions (ids as JSON), in data-file order: those some arm has an answer to."""
    prompts = run.get("prompts") or {}
    order = list(prompts) + sorted({q for _, recs in arms for q in recs} - set(prompts))
    return [q for q in order if any(q in recs for _, recs in arms)]


def shape_extremes(run: dict) -> list[dict]:
    """Per arm on the page whose trees change shape: its deepest and its widest recorded step
    (``{"arm", "kind", "question_id", "step", "depth", "width", "root_p", "anchor"}``; ``anchor``
    opens that step in trees.html). Where TALON's adaptive shape can be seen, step by step."""
    arms = explorer_arms(run)
    qids = explorer_questions(run, arms)
    out = []
    for a, (name, recs) in enumerate(arms):
        points = []
        for q, rec in recs.items():
            root_p = rec.get("steps", {}).get("root_p") or []
            for tree in rec["trees"]:
                width = max(width_per_layer(tree), default=0)
                p = root_p[tree["step"]] if tree["step"] < len(root_p) else None
                points.append((max(tree["depths"]), width, p, q, tree["step"]))
        if len({(d, w) for d, w, *_ in points}) < 2:
            continue  # one fixed shape: nothing to point at
        for kind, key in (("deepest", lambda t: (t[0], -t[1])), ("widest", lambda t: (t[1], -t[0]))):
            depth, width, p, q, step = max(points, key=key)
            out.append({"arm": name, "kind": kind, "question_id": json.loads(q), "step": step, "depth": depth,
                        "width": width, "root_p": p, "anchor": f"q={qids.index(q)}&a={a}&s={step}"})
    return out


def write_explorer(run: dict, path: str | Path) -> Path | None:
    """Write trees.html for ``run`` (:func:`specframe.experiments.metrics.load_run`'s dict);
    None (and no file) when no arm recorded trees with token text."""
    arms = explorer_arms(run)
    path = Path(path)
    if not arms:
        path.unlink(missing_ok=True)  # a stale page would show another run's trees
        return None
    path.write_text(page(f"Draft trees: {run.get('name', '')}", render_body(run, arms)), encoding="utf-8")
    return path
