"""The docs stay true: every hookspec is documented with its exact signature, and doc links resolve."""

from __future__ import annotations

import inspect
import re
import shutil
import subprocess
import typing
from pathlib import Path

import pytest

from specframe import hookspecs

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = DOCS.parent / "README.md"
HOOKS_MD = DOCS / "hooks.md"
CODE_BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def real_hooks() -> dict[str, typing.Callable]:
    """Every hook specification of specframe/hookspecs.py (functions marked by @hookspec)."""
    return {name: fn for name, fn in vars(hookspecs).items()
            if inspect.isfunction(fn) and hasattr(fn, "specframe_spec")}


def documented_hooks(text: str) -> dict[str, inspect.Signature]:
    """Signatures of the hooks documented in ``text``: each ``## `name` `` section's first
    ```python block must define ``name``; the block is compiled and read with inspect."""
    out = {}
    for match in re.finditer(r"^## `(\w+)`\n(.*?)(?=^## |\Z)", text, re.S | re.M):
        name, body = match.groups()
        block = CODE_BLOCK.search(body)
        assert block, f"hooks.md: section `{name}` has no ```python block with its signature"
        namespace: dict = {"hookspec": lambda fn: fn, **vars(typing)}
        exec(compile(block.group(1), f"hooks.md:{name}", "exec"), namespace)
        assert name in namespace, f"hooks.md: the first code block of section `{name}` does not define {name}()"
        out[name] = inspect.signature(namespace[name], eval_str=True)
    return out


def test_hookspecs_exist():
    """Guards the doc test against vacuity: the hookspecs module really has hooks."""
    assert {"register_tree_policies", "register_drafters", "register_verifiers", "register_commands"} <= set(real_hooks())


@pytest.mark.parametrize("name", sorted(real_hooks()))
def test_every_hook_is_documented_with_its_exact_signature(name):
    documented = documented_hooks(HOOKS_MD.read_text(encoding="utf-8"))
    assert name in documented, f"hook {name} is not documented in docs/hooks.md (add a '## `{name}`' section)"
    real = inspect.signature(real_hooks()[name], eval_str=True)
    assert documented[name] == real, f"docs/hooks.md documents {name}{documented[name]}, the hookspec is {name}{real}"


def test_no_documented_hook_is_missing_from_hookspecs():
    extra = set(documented_hooks(HOOKS_MD.read_text(encoding="utf-8"))) - set(real_hooks())
    assert not extra, f"docs/hooks.md documents hooks that hookspecs.py does not define: {sorted(extra)}"


def test_signature_comparison_detects_a_changed_signature():
    """The check can fail: a wrong annotation or an extra parameter is a different signature."""
    real = inspect.signature(hookspecs.register_commands, eval_str=True)
    wrong = documented_hooks("## `register_commands`\n```python\ndef register_commands(cli: int) -> None: ...\n```\n")
    extra = documented_hooks("## `register_commands`\n```python\ndef register_commands(cli: Any, x: int) -> None: ...\n```\n")
    assert wrong["register_commands"] != real and extra["register_commands"] != real


def _links() -> list[tuple[Path, str]]:
    out = []
    for page in sorted(DOCS.rglob("*.md")):
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            if not re.match(r"[a-z]+://", target):
                out.append((page, target))
    return out


def test_relative_doc_links_resolve():
    links = _links()
    assert links, "no relative links found: the link check would be vacuous"
    broken = [f"{page.relative_to(DOCS)} -> {target}" for page, target in links
              if not (page.parent / target).exists()]
    assert not broken, "broken links in docs/: " + ", ".join(broken)


def test_readme_python_example_runs():
    """README's Python example runs as shown (it asserts losslessness and reads tau)."""
    code = CODE_BLOCK.search(README.read_text(encoding="utf-8")).group(1)
    assert "assert out.tokens == ref.tolist()" in code and "out.tau" in code
    assert 10 <= len(code.strip().splitlines()) <= 15, "README's Python example should be 10-15 lines"
    exec(compile(code, "README.md", "exec"), {"print": lambda *a, **k: None})


def _tables(text: str) -> list[list[str]]:
    """The markdown tables of ``text`` outside fenced code blocks, each as its list of rows."""
    tables: list[list[str]] = []
    fenced, previous = False, False
    for line in text.splitlines():
        fenced ^= line.startswith("```")
        is_row = not fenced and line.startswith("|")
        if is_row and not previous:
            tables.append([])
        if is_row:
            tables[-1].append(line.strip())
        previous = is_row
    return tables


def test_readme_is_short_with_one_table():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 120, f"README.md has {len(text.splitlines())} lines; the limit is 120"
    assert len(_tables(text)) == 1, "README.md holds one table (the demo's); other measurements go to docs/results.md"


def test_readme_demo_table_is_the_one_in_results():
    """The README's demo table is a copy of docs/results.md's, so both show the same run."""
    readme_table = _tables(README.read_text(encoding="utf-8"))[0]
    results = (DOCS / "results.md").read_text(encoding="utf-8")
    demo_section = results.split("### The SmolLM2 demo", 1)[1].split("\n### ", 1)[0]
    assert _tables(demo_section) == [readme_table]


def test_ci_runs_the_readme_commands_in_a_fresh_venv():
    """CI takes both commands from the README (no copy that could drift), into a venv it
    clears on every run."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("readme_commands", DOCS.parent / ".ci" / "readme_commands.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    commands = module.readme_commands(README.read_text(encoding="utf-8"))
    assert commands["test"] == "HYPOTHESIS_PROFILE=ci python -m pytest -q -n auto --dist worksteal"
    assert commands["setup"].startswith("pip install torch==") and "pip install -e '.[" in commands["setup"]
    ci = (DOCS.parent / ".ci" / "run").read_text(encoding="utf-8")
    assert "python -m venv --clear" in ci.replace("python3", "python")
    assert commands["install"] + " && specframe demo" == commands["setup"]
    assert "readme_commands.py install" in ci and "readme_commands.py test" in ci
    # the tutorial's plugin too, as the README installs it: CI runs on a plugin author's machine
    assert commands["plugin"] == "pip install -e docs/examples/specframe-widetree"
    assert "readme_commands.py plugin" in ci
    assert ci.index('bash -c "$install"') < ci.index('bash -c "$plugin"') < ci.index('bash -c "$tests"')
    assert "pip install -e" not in ci, ".ci/run installs the project and the plugin only through the README's lines"


def _demo_shape(path: Path) -> str:
    """'P prompts x T tokens, A arms' of an experiment file, as the docs must state it."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib

    cfg = tomllib.loads(path.read_text())
    return f"{cfg['data']['limit']} prompts x {cfg['max_new_tokens']} tokens, {len(cfg['arm'])} arms"


DEMO_TOML = DOCS.parent / "examples" / "demo.toml"
TINY_TOML = DOCS.parent / "examples" / "demo-tiny.toml"
# Pages that say what `specframe demo` runs, and the demos each one sizes.
DEMO_PAGES = {
    DOCS.parent / "README.md": [DEMO_TOML],
    DOCS / "index.md": [DEMO_TOML],
    DOCS / "cli.md": [DEMO_TOML, TINY_TOML],
    DOCS / "experiments.md": [DEMO_TOML],
    DOCS / "reproducing-talon.md": [DEMO_TOML, TINY_TOML],
}
SIZING = re.compile(r"\d+ prompts x \d+ tokens, \d+ arms")


def stated_sizes(text: str) -> list[tuple[str, str]]:
    """Each "P prompts x T tokens, A arms" of ``text`` with the demo it sizes: the tiny pair when
    the nearest demo named before it is ``--pair tiny`` / ``demo-tiny.toml``, else the default."""
    flat = " ".join(text.split())  # a statement may wrap lines
    out = []
    for match in SIZING.finditer(flat):
        before = flat[:match.start()]
        tiny = max(before.rfind("--pair tiny"), before.rfind("demo-tiny.toml"))
        default = max(before.rfind("specframe demo`"), before.rfind("specframe demo "),
                      before.rfind("examples/demo.toml"))
        out.append(("tiny" if tiny > default else "default", match.group()))
    return out


@pytest.mark.parametrize("page", sorted(DEMO_PAGES), ids=lambda p: p.name)
def test_docs_describe_the_demos_that_ship(page):
    """Every page that sizes a demo says what examples/demo.toml (and demo-tiny.toml) run; the
    sizes are read from the files (they drifted: 10 prompts, 96 tokens and 9 arms stood for the
    SmolLM2 demo after it became 7 x 64 with 5 arms)."""
    shapes = {"default": _demo_shape(DEMO_TOML), "tiny": _demo_shape(TINY_TOML)}
    stated = stated_sizes(page.read_text(encoding="utf-8"))
    for which, text in stated:
        assert text == shapes[which], f"{page.name} says the {which} demo runs {text}; its file runs {shapes[which]}"
    for path in DEMO_PAGES[page]:
        which = "tiny" if path == TINY_TOML else "default"
        assert (which, shapes[which]) in stated, f"{page.name} does not say what the {which} demo runs ({shapes[which]})"


def test_demo_sizing_check_can_fail():
    """A stale size is caught, and a tiny-pair size is attributed to the tiny pair."""
    assert stated_sizes("`specframe demo` runs 10 prompts x 96 tokens, 9 arms") == [("default", "10 prompts x 96 tokens, 9 arms")]
    assert stated_sizes("`specframe demo --pair tiny` runs 10 prompts x 96 tokens, 9 arms")[0][0] == "tiny"
    assert _demo_shape(DEMO_TOML) != _demo_shape(TINY_TOML), "the two demos must differ for the check to mean anything"


def test_reproducing_talon_names_every_arm_of_the_demos():
    """docs/reproducing-talon.md names every arm of both demos, as the experiment files name them."""
    from specframe.experiments.config import load_config

    text = (DOCS / "reproducing-talon.md").read_text(encoding="utf-8")
    for path in (DEMO_TOML, TINY_TOML):
        missing = [arm.name for arm in load_config(path).arms if f"`{arm.name}`" not in text]
        assert not missing, f"reproducing-talon.md does not name the arms {missing} of {path.name}"


RESULT_FIELDS = {
    "Date": re.compile(r"^- Date: \d{4}-\d{2}-\d{2}\b", re.M),
    "Machine": re.compile(r"^- Machine: .*\b\d+[- ]cores?\b.*\bGPU\b", re.M),
    "Commit": re.compile(r"^- Commit: `([0-9a-f]{7,40})`", re.M),
    "Command": re.compile(r"^- Command: .*`[^`]+`", re.M),
    "Shows": re.compile(r"^- Shows: \S", re.M),
}


def unlabelled_tables(text: str) -> list[str]:
    """'section: missing fields' for every section of a results page (split at its headings)
    that holds a table without all five fields: date, machine (with cores and GPU), commit,
    command and what the table shows."""
    problems = []
    for section in re.split(r"^(?=#{2,4} )", text, flags=re.M):
        if not _tables(section):
            continue
        missing = [name for name, pattern in RESULT_FIELDS.items() if not pattern.search(section)]
        if missing:
            problems.append(f"{section.splitlines()[0]!r}: no {', '.join(missing)}")
    return problems


def test_every_result_table_names_date_machine_commit_and_command():
    text = (DOCS / "results.md").read_text(encoding="utf-8")
    assert len(_tables(text)) >= 5, "docs/results.md lost its tables: the check would be vacuous"
    assert not unlabelled_tables(text), "docs/results.md: " + "; ".join(unlabelled_tables(text))


def test_result_table_check_can_fail():
    labelled = ("### T\n\n- Date: 2026-12-03\n- Machine: Intel Xeon, 2 cores, no GPU\n- Commit: `9dc699c`\n"
                "- Command: `specframe demo`\n- Shows: the demo\n\n| a | b |\n|---|---|\n| 1 | 2 |\n")
    assert unlabelled_tables(labelled) == []
    assert unlabelled_tables(labelled.replace("- Commit: `9dc699c`\n", "")) == ["'### T': no Commit"]
    assert unlabelled_tables(labelled.replace("2 cores, ", "")) == ["'### T': no Machine"]
    assert unlabelled_tables(labelled + "### U\n\n| c |\n|---|\n") == ["'### U': no Date, Machine, Commit, Command, Shows"]


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=DOCS.parent, capture_output=True, text=True)


def test_result_commits_exist():
    """Every commit docs/results.md names is one of this repository's (where its history is here)."""
    if shutil.which("git") is None or _git("rev-parse", "--is-shallow-repository").stdout.strip() != "false":
        pytest.skip("needs git and the repository's full history")
    text = (DOCS / "results.md").read_text(encoding="utf-8")
    unknown = [sha for sha in RESULT_FIELDS["Commit"].findall(text)
               if _git("cat-file", "-e", f"{sha}^{{commit}}").returncode != 0]
    assert not unknown, f"docs/results.md names commits this repository does not have: {unknown}"


def test_demo_table_script_takes_the_overall_table_and_fills_both_markers(tmp_path):
    """scripts/update_demo_table.py copies the report's first table (not the per-category ones)
    between the markers, leaving the text around them alone."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("update_demo_table", DOCS.parent / "scripts" / "update_demo_table.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    (tmp_path / "report.md").write_text("# Experiment\n\n## Overall\n\n| arm |\n|---|\n| talon |\n\n"
                                        "## Per category\n\n### qa\n\n| arm |\n|---|\n| chain |\n")
    assert script.overall_table(tmp_path) == "| arm |\n|---|\n| talon |"
    page = tmp_path / "page.md"
    page.write_text("before\n<!-- demo-table:start (note) -->\nold\n<!-- demo-table:end -->\nafter\n")
    script.replace_block(page, "new")
    assert page.read_text() == "before\n<!-- demo-table:start (note) -->\nnew\n<!-- demo-table:end -->\nafter\n"


# ---------------------------------------------------------------------- the public names
def _public_name_rows() -> list[tuple[str, str]]:
    """(name, module) of every row of docs/hooks.md's public-name tables."""
    text = (ROOT / "docs" / "hooks.md").read_text(encoding="utf-8").split("## The public names", 1)[1]
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[1].startswith("`specframe"):
            module = cells[1].strip("`")
            rows += [(name.strip("` "), module) for name in cells[0].split(",")]
    return rows


def test_hooks_md_lists_every_public_name_with_its_module():
    import importlib

    import specframe

    rows = _public_name_rows()
    assert len(rows) > 40
    for name, module in rows:
        assert hasattr(importlib.import_module(module), name), f"docs/hooks.md: {module} has no {name}"
    listed = {name for name, _ in rows}
    assert set(specframe.__all__) <= listed, f"not in docs/hooks.md: {sorted(set(specframe.__all__) - listed)}"
    for name in specframe.__all__:
        assert getattr(specframe, name) is getattr(importlib.import_module(dict(rows)[name]), name)


def test_every_import_the_docs_teach_resolves():
    import importlib
    import importlib.util

    pattern = re.compile(r"from (specframe[\w.]*) import \(?([\w, ]+)")
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "docs" / "examples").rglob("*.py"))]
    seen = 0
    for page in pages:
        for module, names in pattern.findall(page.read_text(encoding="utf-8")):
            imported = importlib.import_module(module)
            for name in (n.strip().split(" as ")[0] for n in names.split(",") if n.strip()):
                assert hasattr(imported, name) or importlib.util.find_spec(f"{module}.{name}"), \
                    f"{page.relative_to(ROOT)}: from {module} import {name} fails"
                seen += 1
    assert seen > 10
