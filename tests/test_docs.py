"""The docs stay true: every hookspec is documented with its exact signature, and doc links resolve."""

from __future__ import annotations

import inspect
import re
import typing
from pathlib import Path

import pytest

from specframe import hookspecs

DOCS = Path(__file__).resolve().parent.parent / "docs"
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


def test_index_python_example_runs():
    """The 'Python in one screen' block of docs/index.md runs as shown (it asserts losslessness)."""
    text = (DOCS / "index.md").read_text(encoding="utf-8")
    section = text.split("## Python in one screen", 1)[1]
    code = CODE_BLOCK.search(section).group(1)
    assert "assert out.tokens == ref.tolist()" in code
    exec(compile(code, "docs/index.md", "exec"), {"print": lambda *a, **k: None})


def _demo_shape(path: Path) -> str:
    """'P prompts x T tokens, A arms' of an experiment file, as the docs must state it."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib

    cfg = tomllib.loads(path.read_text())
    return f"{cfg['data']['limit']} prompts x {cfg['max_new_tokens']} tokens, {len(cfg['arm'])} arms"


def test_docs_describe_the_demo_that_ships():
    """Every place that sizes `specframe demo` says what examples/demo.toml runs (they drifted
    once: 8 prompts, 64 tokens and 8 arms in the docs against 10, 96 and 9 in the file). Only
    the default demo is sized in the form "P prompts x T tokens, A arms"."""
    shape = _demo_shape(DOCS.parent / "examples" / "demo.toml")
    places = [DOCS / "index.md", DOCS / "cli.md", DOCS / "experiments.md", DOCS.parent / "README.md"]
    sizing = re.compile(r"\d+ prompts x \d+ tokens, \d+ arms")
    for place in places:
        text = place.read_text()
        stated = sizing.findall(" ".join(text.split()))  # a statement may wrap lines
        assert stated, f"{place.name} does not say what `specframe demo` runs ({shape})"
        assert set(stated) == {shape}, f"{place.name} says {sorted(set(stated))}, examples/demo.toml runs {shape}"
