"""The fixed parts of trees.html: its style, its one script and the page around a body.

The page allows only its own style and script: a Content-Security-Policy names their SHA-256
hashes and nothing else (no network, no other inline code, no inline ``style=""``), so text
from a model or a prompt that slipped past the escaping still could not run. The script only
moves pre-rendered, escaped elements around (``<template>`` clones, ``textContent``); it never
parses a string as HTML.
"""

from __future__ import annotations

import base64
import hashlib
import html

STYLE = r"""
:root { --acc: #1a7f37; --acc-bg: #dafbe1; --bonus: #8250df; --line: #b8b8b8; --muted: #667; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0; color: #1f2328; }
header { padding: 10px 16px; border-bottom: 1px solid #ddd; background: #f6f8fa; }
header h1 { font-size: 17px; margin: 0 0 4px; }
header .controls { display: flex; gap: 16px; align-items: center; flex-wrap: wrap; }
.legend { color: var(--muted); font-size: 12px; margin-top: 4px; }
.legend .tok { font-family: ui-monospace, Menlo, Consolas, monospace; }
main { display: flex; gap: 12px; padding: 12px; align-items: flex-start; }
.pane { flex: 1 1 0; min-width: 0; border: 1px solid #ddd; border-radius: 6px; padding: 8px 10px; }
.pane > label { font-weight: 600; }
.prompt { background: #f6f8fa; border-radius: 4px; padding: 4px 8px; margin: 8px 0; }
.prompt pre, .turn { white-space: pre-wrap; word-break: break-word; margin: 0; }
.prompt pre { font-family: inherit; color: #444; max-height: 8em; overflow: auto; }
.caption { font-size: 11px; text-transform: uppercase; letter-spacing: .04em; color: var(--muted); margin-top: 6px; }
.turn { line-height: 1.8; }
.answer { max-height: 45vh; overflow-y: auto; }
.s { border-radius: 3px; padding: 1px 0; cursor: pointer; }
.s:nth-child(odd) { background: #eef3fb; }
.s:nth-child(even) { background: #fdf3e1; }
.s:hover { outline: 1px solid #888; }
.s.sel { background: #ffd33d; outline: 2px solid #9a6700; }
.s.notree { cursor: default; color: #555; }
.treebox { margin-top: 10px; border-top: 1px solid #ddd; padding-top: 8px; overflow-x: auto; }
.treebox .hint { color: var(--muted); }
.stepinfo { font-size: 13px; margin-bottom: 6px; }
.stepinfo b { font-weight: 600; }
.stepinfo .kv { display: inline-block; margin-right: 12px; }
.tree { padding: 4px 0 8px; }
.n { display: flex; align-items: flex-start; }
.kids { display: flex; flex-direction: column; }
.kids > .n { position: relative; padding-left: 18px; }
.kids > .n::before { content: ""; position: absolute; left: 0; top: 13px; width: 16px; border-top: 1px solid var(--line); }
.kids > .n::after { content: ""; position: absolute; left: 0; top: 0; bottom: 0; border-left: 1px solid var(--line); }
.kids > .n:first-child::after { top: 13px; }
.kids > .n:last-child::after { bottom: auto; height: 13px; }
.kids > .n:only-child::after { display: none; }
.kids > .n.acc::before { border-top: 2px solid var(--acc); }
.lab { display: inline-flex; align-items: baseline; gap: 5px; border: 1px solid #c9c9c9; border-radius: 4px;
       padding: 1px 5px; margin: 2px 0; background: #fff; white-space: pre; height: 22px; }
.tok { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 13px; }
.p { font-size: 11px; color: var(--muted); }
.n.acc > .lab { border: 2px solid var(--acc); background: var(--acc-bg); }
.n.root > .lab { background: #eaeef2; }
.n.bonus > .lab { border: 2px dashed var(--bonus); color: var(--bonus); }
.n.bonus > .lab .p { color: var(--bonus); }
"""

SCRIPT = r"""
(function () {
  "use strict";
  var question = document.getElementById("question");
  var sync = document.getElementById("sync");
  var panes = Array.prototype.slice.call(document.querySelectorAll(".pane"));

  function clone(id) {
    var t = document.getElementById(id);
    return t ? t.content.cloneNode(true) : null;
  }
  function note(text) {
    var p = document.createElement("p");
    p.className = "hint";
    p.textContent = text;
    return p;
  }
  function showAnswer(pane) {
    var arm = pane.querySelector("select.arm").value;
    var box = pane.querySelector(".answer");
    var answer = clone("a-" + arm + "-" + question.value);
    box.replaceChildren(answer || note("This arm has no answer to this question."));
    pane.querySelector(".treebox").replaceChildren(note("Click a highlighted span of the answer to see the tree of the step that emitted it."));
  }
  function openStep(pane, span) {
    pane.querySelectorAll(".s.sel").forEach(function (s) { s.classList.remove("sel"); });
    span.classList.add("sel");
    var arm = pane.querySelector("select.arm").value;
    var tree = clone("t-" + arm + "-" + question.value + "-" + span.dataset.step);
    if (tree) tree.querySelectorAll(".n").forEach(describe);
    pane.querySelector(".treebox").replaceChildren(tree || note("No tree was recorded for this step."));
  }
  function describe(node) {
    var d = node.dataset, parts = ["token " + d.t];
    if (node.classList.contains("bonus")) parts.push("the target's own token after the accepted path");
    if (d.q) parts.push("p " + d.q + " given the parent");
    if (d.r && +d.r >= 0) parts.push("rank " + d.r);
    if (node.classList.contains("root")) parts.push("root: the last committed token");
    else if (node.classList.contains("acc")) parts.push("accepted");
    node.firstElementChild.title = parts.join(" \u00b7 ");
  }
  function spanAt(pane, position) {
    var spans = pane.querySelectorAll(".s");
    for (var i = 0; i < spans.length; i++) {
      var s = spans[i];
      if (+s.dataset.start <= position && position < +s.dataset.end) return s;
    }
    return null;
  }
  panes.forEach(function (pane) {
    pane.querySelector("select.arm").addEventListener("change", function () { showAnswer(pane); });
    pane.querySelector(".answer").addEventListener("click", function (event) {
      var span = event.target.closest(".s");
      if (!span) return;
      openStep(pane, span);
      if (!sync.checked) return;
      panes.forEach(function (other) {
        if (other === pane) return;
        var same = spanAt(other, +span.dataset.start);
        if (same) openStep(other, same);
      });
    });
  });
  question.addEventListener("change", function () { panes.forEach(showAnswer); });
  panes.forEach(showAnswer);
  // A link may name a step: trees.html#q=0&a=3&s=12 (question, arm, step; numbers only).
  var want = {};
  location.hash.slice(1).split("&").forEach(function (kv) {
    var pair = kv.split("=");
    if (/^[0-9]+$/.test(pair[1] || "")) want[pair[0]] = pair[1];
  });
  if (want.q !== undefined && want.a !== undefined && want.s !== undefined) {
    var left = panes[0], arm = left.querySelector("select.arm");
    question.value = want.q;
    arm.value = want.a;
    panes.forEach(showAnswer);
    var span = left.querySelector('.s[data-step="' + want.s + '"]');
    if (span) { openStep(left, span); span.scrollIntoView({block: "center"}); }
  }
})();
"""


def csp_hash(source: str) -> str:
    """The CSP source expression (``'sha256-...'``) that allows exactly ``source`` inline."""
    return "'sha256-" + base64.b64encode(hashlib.sha256(source.encode("utf-8")).digest()).decode() + "'"


def page(title: str, body: str) -> str:
    """The whole document: ``body`` (already escaped HTML) with the style, the script and a
    policy that allows only those two."""
    policy = (f"default-src 'none'; script-src {csp_hash(SCRIPT)}; style-src {csp_hash(STYLE)}; "
              "img-src 'none'; base-uri 'none'; form-action 'none'")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<meta http-equiv=\"Content-Security-Policy\" content=\"{policy}\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        f"<title>{html.escape(title)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n"
        f"{body}\n<script>{SCRIPT}</script>\n</body>\n</html>\n"
    )
