"""trees.html against the run's records: every step's tree (nodes, parents, tokens, text,
accepted path), the answer's spans, escaping of untrusted text, the page's own-code-only
policy; and, where Chromium and playwright are installed, the same in a browser."""

from __future__ import annotations

import base64
import hashlib
import html
import json
import os
import re
import shutil
import textwrap
from html.parser import HTMLParser
from pathlib import Path

import pytest

from specframe.experiments.config import load_config
from specframe.experiments.experiment import run_experiment
from specframe.experiments.report import write_report
from specframe.experiments.runs import RunDir, read_answers

SCRIPT = "<script>alert(1)</script>"
PROMPTS = [
    {"question_id": 0, "category": "a", "turns": [f"{SCRIPT} <img src=x onerror=alert(2)> & \"q\" 'x'"]},
    {"question_id": "q<1>", "category": "b", "turns": ["first turn", "second <b id=evil>turn</b>"]},
    {"question_id": 2, "category": "a", "turns": ["not explored"]},
]
CONFIG = """
name = "explorer"
max_new_tokens = 20
warmup = 0
repeats = 1
stop_at_eos = false
threads = 1

[target]
model = "random:llama"
dtype = "float32"
device = "cpu"
random = { vocab_size = 128, hidden = 32, layers = 2, seed = 0 }

[models.draft]
model = "perturbed:target"
random = { noise = 0.3, seed = 1 }

[drafter]
name = "model"
options = { model = "draft" }

[[arm]]
baseline = "autoregressive"

[[arm]]
policy = "chain"
policy_options = { gamma = 3 }

[[arm]]
policy = "talon"
policy_options = { budget = 16, mu = 0.03 }

[data]
path = "prompts.jsonl"

[output]
dir = "out"
trees_per_answer = 2
explorer_questions = 2
"""
TREE_ARMS = ("chain", "talon")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A 3-arm run on tiny random models (byte tokens: markup and control characters come
    out of the model too) and its report."""
    tmp = tmp_path_factory.mktemp("explorer")
    (tmp / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in PROMPTS))
    (tmp / "exp.toml").write_text(textwrap.dedent(CONFIG))
    outcome = run_experiment(load_config(tmp / "exp.toml"), progress=False)
    write_report(outcome.out_dir)
    return Path(outcome.out_dir)


def records(run_dir: Path, arm: str) -> dict:
    return {json.dumps(r["question_id"]): r for r in read_answers(RunDir(run_dir).answers(arm))}


def byte_text(token: int) -> str:
    """What the byte tokenizer of random models reads ``token`` as."""
    return bytes([token % 256]).decode("utf-8", errors="replace")


# ---------------------------------------------------------------------- a parser of the page
class Page(HTMLParser):
    """trees.html as data: templates by id; in each, the tree nodes (index, token, parent by
    nesting, classes, shown text) and the answer spans; plus every tag and the text outside
    templates."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.templates: dict[str, dict] = {}
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []
        self.scripts: list[str] = []
        self._stack: list[tuple[str, dict]] = []
        self._current: dict | None = None
        self._nodes: list[dict] = []  # open .n elements
        self._target: dict | None = None  # the node or span whose text we are reading
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = dict(attrs)
        self.tags.append((tag, a))
        cls = set((a.get("class") or "").split())
        entry = {"tag": tag, "cls": cls}
        self._stack.append((tag, entry))
        if tag == "script":
            self._in_script = True
            self.scripts.append("")
        if tag == "template":
            self._current = {"id": a["id"], "nodes": [], "spans": [], "info": ""}
            self.templates[a["id"]] = self._current
        elif self._current is not None and tag == "div" and "n" in cls:
            parent = next((n for n in reversed(self._nodes) if not n.get("bonus")), None)
            node = {"n": a.get("data-n"), "t": int(a["data-t"]), "parent": parent["n"] if parent else None,
                    "cls": cls, "bonus": "bonus" in cls, "text": "", "depth": len(self._nodes)}
            entry["node"] = node
            self._nodes.append(node)
            self._current["nodes"].append(node)
        elif self._current is not None and tag == "span" and "tok" in cls and self._nodes:
            self._target = self._nodes[-1]
            entry["reads"] = True
        elif self._current is not None and tag == "span" and "s" in cls:
            span = {"step": int(a["data-step"]), "start": int(a["data-start"]), "end": int(a["data-end"]),
                    "cls": cls, "text": ""}
            self._current["spans"].append(span)
            self._target = span
            entry["reads"] = True

    def handle_endtag(self, tag: str) -> None:
        while self._stack:
            name, entry = self._stack.pop()
            if entry.get("reads"):
                self._target = None
            if "node" in entry:
                self._nodes.pop()
            if name == "template":
                self._current = None
            if name == "script":
                self._in_script = False
            if name == tag:
                break

    def handle_data(self, data: str) -> None:
        if self._in_script:
            self.scripts[-1] += data
        elif self._target is not None:
            self._target["text"] += data
        elif self._current is not None:
            self._current["info"] += data
        else:
            self.text.append(data)


@pytest.fixture(scope="module")
def page(run_dir) -> tuple[str, Page]:
    raw = (run_dir / "trees.html").read_text(encoding="utf-8")
    parser = Page()
    parser.feed(raw)
    parser.close()
    return raw, parser


def _options(raw: str, select: str) -> list[str]:
    """The (unescaped) labels of the first ``<select ...>`` opening with ``select``."""
    body = re.search(select + r"(.*?)</select>", raw, re.S).group(1)
    return [html.unescape(label) for label in re.findall(r"<option[^>]*>([^<]*)</option>", body)]


def arm_index(raw: str, name: str) -> int:
    """The value of arm ``name`` in the panes' arm choice."""
    return _options(raw, '<select class="arm">').index(name)


def question_index(raw: str, qid: str) -> int:
    """The value of the question with id ``qid`` (as JSON) in the question choice."""
    shown = str(json.loads(qid))
    return next(i for i, label in enumerate(_options(raw, '<select id="question">')) if label.startswith(shown + " "))


# ---------------------------------------------------------------------- the records
def test_explorer_questions_record_every_step_and_its_text(run_dir):
    for arm in TREE_ARMS:
        recs = records(run_dir, arm)
        for qid in (json.dumps(0), json.dumps("q<1>")):
            rec = recs[qid]
            steps = len(rec["steps"]["emitted"])
            assert [t["step"] for t in rec["trees"]] == list(range(steps))
            ids = [t for turn in rec["output_ids"] for t in turn]
            assert "".join(p for turn in rec["token_text"] for p in turn) == "".join(byte_text(t) for t in ids)
            for tree in rec["trees"]:
                assert tree["text"] == [byte_text(t) for t in tree["tokens"]]
                assert 1 <= len(tree["tokens"]) <= tree["budget"]
            assert len(rec["steps"]["root_p"]) == steps
        other = recs[json.dumps(2)]
        assert len(other["trees"]) == 2 and "token_text" not in other
    run = json.loads(RunDir(run_dir).run_file.read_text())
    assert run["prompts"] == {json.dumps(q["question_id"]): q["turns"] for q in PROMPTS[:2]}


def test_root_confidence_is_the_top_child_probability(run_dir):
    import math

    for tree_rec in records(run_dir, "talon").values():
        for tree in tree_rec["trees"]:
            first = [lp for lp, p in zip(tree["logp"], tree["parents"]) if p == 0]
            assert tree_rec["steps"]["root_p"][tree["step"]] == pytest.approx(math.exp(max(first)), abs=1e-4)


# ---------------------------------------------------------------------- the page (parsed)
def test_report_links_the_page_and_shows_the_shape_plot(run_dir):
    report = (run_dir / "report.md").read_text()
    assert "(trees.html)" in report
    assert "plots/shape_confidence.png" in report and (run_dir / "plots" / "shape_confidence.png").stat().st_size
    assert (run_dir / "plots" / "trees.png").stat().st_size


def check_trees_against_records(run_dir: Path, raw: str, parsed: Page, arms, decode) -> int:
    """Every explored answer's trees on the page equal its recorded steps: node count, tokens,
    parents, depths, accepted path, and the node text (which ``decode(token)`` gives, where the
    text is printable); returns how many trees were checked."""
    checked = 0
    for arm in arms:
        a = arm_index(raw, arm)
        for qid, rec in records(run_dir, arm).items():
            if "token_text" not in rec:
                continue
            q = question_index(raw, qid)
            assert [t["step"] for t in rec["trees"]] == list(range(len(rec["steps"]["emitted"])))
            for tree in rec["trees"]:
                shown = parsed.templates[f"t-{a}-{q}-{tree['step']}"]
                nodes = [n for n in shown["nodes"] if not n["bonus"]]
                assert len(nodes) == len(tree["tokens"]) == rec["steps"]["tree_size"][tree["step"]]
                by_index = {int(n["n"]): n for n in nodes}
                assert sorted(by_index) == list(range(len(tree["tokens"])))
                for i, node in by_index.items():
                    assert node["t"] == tree["tokens"][i]
                    assert (int(node["parent"]) if node["parent"] is not None else -1) == tree["parents"][i]
                    assert node["depth"] == tree["depths"][i]
                    text = decode(tree["tokens"][i])
                    assert tree["text"][i] == text
                    if text.isprintable() and " " not in text and text:
                        assert node["text"] == text
                    elif text == " ":
                        assert node["text"] == "\u2423"
                accepted = [int(n["n"]) for n in nodes if "acc" in n["cls"]]
                assert sorted(accepted) == sorted(tree["accepted"])
                assert len(tree["accepted"]) - 1 == rec["steps"]["accepted"][tree["step"]]
                assert f"tree {len(tree['tokens'])} nodes" in shown["info"]
                assert f"accepted {len(tree['accepted']) - 1}" in shown["info"]
                checked += 1
    return checked


def test_every_tree_on_the_page_equals_its_recorded_step(run_dir, page):
    raw, parsed = page
    checked = check_trees_against_records(run_dir, raw, parsed, TREE_ARMS, byte_text)
    assert checked == sum(len(r["trees"]) for arm in TREE_ARMS for r in records(run_dir, arm).values()
                          if "token_text" in r) > 20
    # a question outside the explorer is not on the page: two questions, two answers per tree arm
    assert [label.split(" ")[0] for label in _options(raw, '<select id="question">')] == ["0", "q<1>"]
    assert sorted(t for t in parsed.templates if t.startswith("a-")) == ["a-0-0", "a-0-1", "a-1-0", "a-1-1"]


def test_the_tiny_demo_pages_trees_equal_its_records(tmp_path):
    """The tiny demo pair (a real tokenizer) on one question: every arm's trees on the page."""
    import dataclasses

    from specframe import load_tokenizer

    cfg = load_config(Path(__file__).parents[1] / "examples" / "demo-tiny.toml")
    cfg = dataclasses.replace(cfg, max_new_tokens=24, warmup=0, data=dataclasses.replace(cfg.data, limit=1),
                              output=dataclasses.replace(cfg.output, explorer_questions=1))
    outcome = run_experiment(cfg, out_dir=tmp_path / "out", progress=False)
    write_report(outcome.out_dir)
    raw = (tmp_path / "out" / "trees.html").read_text(encoding="utf-8")
    parsed = Page()
    parsed.feed(raw)
    tokenizer = load_tokenizer(cfg.target.model)
    arms = [a.name for a in cfg.arms if not a.baseline]
    checked = check_trees_against_records(Path(outcome.out_dir), raw, parsed, arms,
                                          lambda t: tokenizer.decode([t], skip_special_tokens=False))
    assert checked == sum(len(r["trees"]) for arm in arms for r in records(Path(outcome.out_dir), arm).values())
    assert checked > 20
    assert check_shape_pointers(Path(outcome.out_dir), raw, parsed, arms) >= 1  # talon's shape changes


def test_the_bonus_token_is_the_token_after_the_accepted_path(run_dir, page):
    raw, parsed = page
    a = arm_index(raw, "talon")
    rec = records(run_dir, "talon")[json.dumps(0)]
    ids = [t for turn in rec["output_ids"] for t in turn]
    position = 0
    for tree, emitted in zip(rec["trees"], rec["steps"]["emitted"]):
        shown = parsed.templates[f"t-{a}-{question_index(raw, json.dumps(0))}-{tree['step']}"]
        bonus = [n for n in shown["nodes"] if n["bonus"]]
        accepted_tokens = [tree["tokens"][i] for i in tree["accepted"][1:]]
        assert ids[position:position + len(accepted_tokens)] == accepted_tokens[:emitted]
        if emitted == len(accepted_tokens) + 1:
            assert [n["t"] for n in bonus] == [ids[position + emitted - 1]]
            assert bonus[0]["parent"] == str(tree["accepted"][-1])
        else:
            assert not bonus
        position += emitted


def _widest(depths: list[int]) -> int:
    return max((depths.count(k) for k in range(1, max(depths) + 1)), default=0)


def check_shape_pointers(run_dir: Path, raw: str, parsed: Page, arms) -> int:
    """report.md names, for each arm whose explored trees take more than one (depth, widest
    layer) shape, its deepest and its widest step, and each link opens a tree of that depth or
    width; an arm of one shape gets no line. Returns how many arms got lines."""
    report = (run_dir / "report.md").read_text()
    pointed = 0
    for arm in arms:
        trees = [t for r in records(run_dir, arm).values() if "token_text" in r for t in r["trees"]]
        lines = [line for line in report.splitlines() if line.startswith(f"- `{arm}`, ")]
        if len({(max(t["depths"]), _widest(t["depths"])) for t in trees}) < 2:
            assert not lines, f"{arm} has one shape but the report points at {lines}"
            continue
        pointed += 1
        for kind, measure in (("deepest", lambda d: max(d)), ("widest", _widest)):
            line = next(line for line in lines if line.startswith(f"- `{arm}`, {kind}:"))
            q, a, step = map(int, re.search(r"\(trees\.html#q=(\d+)&a=(\d+)&s=(\d+)\)", line).groups())
            assert a == arm_index(raw, arm)
            shown = [n["depth"] for n in parsed.templates[f"t-{a}-{q}-{step}"]["nodes"] if not n["bonus"]]
            assert measure(shown) == max(measure(t["depths"]) for t in trees)
    return pointed


def test_the_report_points_only_at_arms_whose_shape_changes(run_dir, page):
    raw, parsed = page
    check_shape_pointers(run_dir, raw, parsed, TREE_ARMS)
    assert "- `chain`" not in (run_dir / "report.md").read_text()  # a chain has one shape


def test_answer_spans_are_the_steps_and_read_as_the_answer(run_dir, page):
    raw, parsed = page
    for arm in TREE_ARMS:
        a = arm_index(raw, arm)
        for qid in (json.dumps(0), json.dumps("q<1>")):
            rec = records(run_dir, arm)[qid]
            spans = parsed.templates[f"a-{a}-{question_index(raw, qid)}"]["spans"]
            assert [s["step"] for s in spans] == list(range(len(rec["steps"]["emitted"])))
            assert [s["end"] - s["start"] for s in spans] == rec["steps"]["emitted"]
            text = "".join(s["text"] for s in spans)
            text = re.sub(r"\\x([0-9a-f]{2})", lambda m: chr(int(m.group(1), 16)), text)
            assert text == "".join(p for turn in rec["token_text"] for p in turn)


def test_markup_in_prompts_and_tokens_is_only_text(page):
    raw, parsed = page
    assert SCRIPT not in raw
    assert "<img" not in raw
    assert "<b id=evil>" not in raw
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in raw
    # one script element, the page's own: no src, nothing else executable
    assert [t for t, _ in parsed.tags if t == "script"] == ["script"]
    assert not [a for t, a in parsed.tags if t == "script" and a]
    assert not [t for t, _ in parsed.tags if t in ("iframe", "object", "embed", "img", "link", "base", "form", "svg")]
    assert not [k for _, a in parsed.tags for k in a if k.startswith("on")]
    assert not [v for _, a in parsed.tags for v in a.values() if v and "javascript:" in v.lower()]
    # the parsed page holds the prompt as text (with the script tag in it)
    assert any(SCRIPT in t["info"] or SCRIPT in t.get("info", "") for t in parsed.templates.values())
    # no raw control characters: the model's bytes are drawn visibly
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", raw)


def test_the_policy_allows_only_the_pages_own_script_and_style(page):
    raw, parsed = page
    policy = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]+)">', raw).group(1)
    rules = dict((part.strip().split(" ", 1) + [""])[:2] for part in policy.split(";"))
    assert rules["default-src"] == "'none'"

    def digest(text: str) -> str:
        return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"

    assert rules["script-src"] == digest(parsed.scripts[0])
    style = re.search(r"<style>(.*?)</style>", raw, re.S).group(1)
    assert rules["style-src"] == digest(style)
    assert "http" not in policy and "unsafe" not in policy
    # nothing is fetched: no network, no CDN
    assert not [a for _, a in parsed.tags if {"src", "href", "srcset", "action"} & set(a)]


def test_a_run_without_recorded_text_writes_no_page(tmp_path, run_dir):
    from specframe.experiments.explorer import write_explorer
    from specframe.experiments.metrics import load_run

    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    for path in RunDir(copy).answers_dir.glob("*.jsonl"):
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        path.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "token_text"}) + "\n" for r in rows))
    assert write_explorer(load_run(copy), copy / "trees.html") is None
    assert not (copy / "trees.html").exists()


# ---------------------------------------------------------------------- in a browser
def _missing_browser(why: str) -> None:
    """Skip naming what is missing, or fail where CI installs the browser
    (``SPECFRAME_REQUIRE_BROWSER=1``), so the browser test never passes there as a skip."""
    if os.environ.get("SPECFRAME_REQUIRE_BROWSER") == "1":
        pytest.fail(f"SPECFRAME_REQUIRE_BROWSER=1 but {why}")
    pytest.skip(why)


def _browser():
    """playwright's sync API and the system Chromium, or a skip naming what is missing."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing_browser("playwright is not installed (pip install playwright)")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        _missing_browser("no chromium executable (apt-get install chromium)")
    return sync_playwright, chromium


def test_in_a_browser_a_click_opens_the_steps_tree(run_dir, page):
    sync_playwright, chromium = _browser()
    raw, parsed = page
    talon, chain = arm_index(raw, "talon"), arm_index(raw, "chain")
    rec = records(run_dir, "talon")[json.dumps(0)]
    tree = max(rec["trees"], key=lambda t: len(t["tokens"]))
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            tab = browser.new_page()
            problems: list[str] = []
            tab.on("pageerror", lambda e: problems.append(str(e)))
            tab.on("console", lambda m: problems.append(m.text) if m.type in ("error", "warning") else None)
            tab.on("dialog", lambda d: (problems.append("dialog: " + d.message), d.dismiss()))
            tab.goto((run_dir / "trees.html").as_uri())
            tab.select_option("#question", str(question_index(raw, json.dumps(0))))
            left, right = tab.locator(".pane").nth(0), tab.locator(".pane").nth(1)
            left.locator("select.arm").select_option(str(talon))
            right.locator("select.arm").select_option(str(chain))
            left.locator(f'.s[data-step="{tree["step"]}"]').click()
            nodes = left.locator(".treebox .n[data-n]")
            assert nodes.count() == len(tree["tokens"])
            shown = {int(nodes.nth(i).get_attribute("data-n")): nodes.nth(i).locator(":scope > .lab .tok").inner_text()
                     for i in range(nodes.count())}
            for i, text in enumerate(tree["text"]):
                if text.isprintable() and " " not in text and text:
                    assert shown[i] == text
            accepted = left.locator(".treebox .n.acc")
            assert sorted(int(accepted.nth(i).get_attribute("data-n")) for i in range(accepted.count())) == \
                sorted(tree["accepted"])
            # the other pane opened the chain's step that emitted the same position
            start = int(left.locator(".s.sel").get_attribute("data-start"))
            other = right.locator(".s.sel")
            assert int(other.get_attribute("data-start")) <= start < int(other.get_attribute("data-end"))
            assert right.locator(".treebox .n[data-n]").count() >= 1
            # the prompt is shown as text, and nothing ran but the page's script
            assert SCRIPT in left.locator(".prompt").inner_text()
            assert tab.evaluate("document.querySelectorAll('script').length") == 1
            # a link naming a step opens it in the left pane (a new tab: a hash change alone does not reload)
            linked = browser.new_page()
            linked.on("pageerror", lambda e: problems.append(str(e)))
            linked.goto((run_dir / "trees.html").as_uri() + f"#q=0&a={chain}&s=2")
            assert linked.locator(".pane").nth(0).locator(".s.sel").get_attribute("data-step") == "2"
            assert linked.locator(".pane").nth(0).locator(".treebox .n[data-n]").count() == 4  # a gamma-3 chain
            assert not problems
        finally:
            browser.close()
