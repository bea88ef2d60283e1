"""Docs, docstrings and comments describe the product, not how it was developed.

History belongs in git log: no "this session", "earlier today", "fourth run", "where it
stands". The draft session (``DraftSession``, a policy's ``session`` argument, "the session's
root token") is part of the product, so the check forbids *phrases* of the development process
rather than the word: "session" only counts after a word that makes it a sitting of work
(this, earlier, fourth, GPU, ...), and never inside an identifier (``DraftSession``,
``session_id``) since a match needs a whole word.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC_FILES = ["README.md", "docs/**/*.md", "benchmarks/**/*.md", "specframe/**/*.md", "examples/**/*.toml",
             "docs/**/*.toml"]
CODE_DIRS = ["specframe", "strategies", "drafters", "verifiers", "benchmarks", "scripts", "docs/examples"]
CODE_SUFFIXES = {".py", ".sh", ".cpp"}

_ORDINAL = r"(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|\d+(?:st|nd|rd|th))"
_LATER_ORDINAL = r"(?:third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|\d+(?:st|nd|rd|th)|final)"
_WORK_SESSION = (r"(?:this|that|these|those|previous|prior|earlier|later|next|last|current|past|our|my"
                 r"|gpu|cpu|development|work|coding|project's|" + _ORDINAL + r"|final)")
# Each entry: what it catches -> a case-insensitive pattern, matched on text whose whitespace
# runs (line wraps included) are single spaces.
PROCESS_PHRASES = {
    "a sitting of work ('this session', 'fourth session')": rf"\b{_WORK_SESSION} sessions?\b",
    "a session of a day": r"\bsessions? of (?:that|the|this) day\b|\bsessions? of \d{4}-\d\d-\d\d\b",
    "'this turn'": r"\b(?:this|that) turn\b",
    "a day relative to the writing ('earlier today', 'that day')":
        r"\b(?:earlier|later) (?:today|this week)\b|\byesterday\b|\bthat day\b|\bthis (?:morning|afternoon|evening)\b",
    "a numbered run ('fourth run', 'final run')": rf"\b{_LATER_ORDINAL} (?:run|attempt|try)\b",
    "a diary entry": r"\bwe tried\b|\blast time\b|\bnow fixed\b|\bthis commit\b|\buntil \d{4}-\d\d-\d\d\b"
                     r"|\bwhere it stands\b",
    "the project's own machines or loans": r"\bdevelopment (?:cpu|machines?|hosts?)\b|\blent\b",
    "an issue of the tracker": r"\bissue #?\d+\b|\bthe issue's\b",
}
_PATTERN = re.compile("|".join(f"(?:{p})" for p in PROCESS_PHRASES.values()), re.I)


def process_phrases(text: str) -> list[str]:
    """The development-process phrases of ``text``, each with a little context."""
    flat = " ".join(text.split())
    return [flat[max(0, m.start() - 30):m.end() + 30] for m in _PATTERN.finditer(flat)]


def code_prose(source: str) -> str:
    """The comments and docstrings (and other bare string statements) of Python ``source``."""
    comments = [tok.string for tok in tokenize.generate_tokens(io.StringIO(source).readline)
                if tok.type == tokenize.COMMENT]
    strings = [node.value.value for node in ast.walk(ast.parse(source))
               if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
               and isinstance(node.value.value, str)]
    return "\n".join(comments + strings)


def prose_of(path: Path, text: str | None = None) -> str:
    """What a reader reads in ``path``: a page whole, a Python file's comments and docstrings, a
    shell or C++ file whole (its strings are commands and code, not sentences)."""
    text = path.read_text(encoding="utf-8") if text is None else text
    return code_prose(text) if path.suffix == ".py" else text


def scanned_files() -> list[Path]:
    files = {p for pattern in DOC_FILES for p in ROOT.glob(pattern)}
    for folder in CODE_DIRS:
        files |= {p for p in (ROOT / folder).rglob("*") if p.suffix in CODE_SUFFIXES}
    return sorted(p for p in files if p.is_file() and "__pycache__" not in p.parts and ".egg-info" not in str(p))


def test_scan_covers_pages_and_code():
    files = {p.relative_to(ROOT).as_posix() for p in scanned_files()}
    assert {"README.md", "docs/results.md", "specframe/decode/engine.py", "strategies/talon.py",
            "drafters/ngram.py", "benchmarks/auto_sizing.py", "examples/demo.toml"} <= files


def test_docs_and_comments_do_not_speak_of_the_development_process():
    found = [f"{p.relative_to(ROOT)}: ...{hit}..." for p in scanned_files() for hit in process_phrases(prose_of(p))]
    assert not found, "history belongs in git log; a measurement goes to docs/results.md:\n" + "\n".join(found)


@pytest.mark.parametrize("phrase", ["this session", "This  Session", "the fourth session", "earlier sessions",
                                    "second session of that day", "this turn", "earlier today", "fourth run",
                                    "the final run", "Where it stands", "until 2026-12-02", "this project's sessions",
                                    "the development CPU", "issue 16", "earlier\nthat day"])
def test_process_phrases_are_caught(phrase):
    assert process_phrases(f"Some text, {phrase}, more text."), phrase


@pytest.mark.parametrize("text", ["`DraftSession` builds trees", "the session's root token", "session.new_tree()",
                                  'fixture(scope="session")', "a session_id field", "build(session, budget)",
                                  "no drafter calls behind the session's back", "a second run on the same directory",
                                  "each later turn sees the answers", "resumes an earlier run", "every arm in turn",
                                  "a second pass over the tree"])
def test_code_names_and_product_words_are_allowed(text):
    assert process_phrases(text) == [], text


def test_inserting_this_session_anywhere_fails_the_check():
    """Show the check can fail everywhere it looks: "this session" added to any scanned page, as a
    comment line to any code file, or as a docstring, is found."""
    missed = []
    for path in scanned_files():
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".py":
            variants = ["# this session\n" + text, '"""Measured in this session."""\n' + text]
        elif path.suffix in (".md", ".toml", ".sh"):
            variants = [text + "\n# this session\n"]
        else:
            variants = [text + "\n// this session\n"]
        missed += [str(path) for variant in variants if not process_phrases(prose_of(path, variant))]
    assert not missed, f"'this session' inserted here went unnoticed: {missed}"


def test_inserting_a_phrase_into_a_file_copy_fails_the_check(tmp_path):
    """The same through files on disk: a copy of a doc page and of a module with the phrase added."""
    page, module = tmp_path / "page.md", tmp_path / "module.py"
    page.write_text((ROOT / "docs" / "concepts.md").read_text(encoding="utf-8") + "\nMeasured in this session.\n")
    module.write_text((ROOT / "specframe" / "decode" / "engine.py").read_text(encoding="utf-8").replace(
        "\nclass ", "\n# tuned this session\nclass ", 1))
    assert process_phrases(prose_of(page)) and process_phrases(prose_of(module))
    assert not process_phrases(prose_of(ROOT / "docs" / "concepts.md"))
