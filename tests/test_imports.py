"""Layer rules of the source tree, read statically with ``ast``.

Every import counts: module-level and inside functions (a lazy import is still a dependency),
absolute and relative. docs/architecture.md shows the same table.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import networkx as nx

REPO = Path(__file__).resolve().parent.parent
#: installed package -> source folder (pyproject.toml's package-dir)
SOURCES = {"specframe": "specframe", "specframe.strategies": "strategies",
           "specframe.drafters": "drafters", "specframe.verifiers": "verifiers"}
PLUGIN_PACKAGES = ("specframe.strategies", "specframe.drafters", "specframe.verifiers")
#: folder -> its layer; the modules directly in specframe/ are the core (docs/architecture.md).
#: A sub-folder listed before its parent would be a layer of its own; none is: every folder is one
#: layer (the serving commands, above replay, live in specframe/commands/, the serving interchange
#: they call in specframe/serving/, below the harness that reads engine arms).
FOLDERS = {"specframe.models": "models", "specframe.sizing": "sizing", "specframe.decode": "decode",
           "specframe.serving": "serving", "specframe.experiments": "harness", "specframe.replay": "replay",
           "specframe.commands": "commands", "specframe.tuning": "tuning", "specframe.testing": "testing"}
#: How many modules the core (specframe/*.py besides __init__ and cli) may hold.
MAX_CORE_MODULES = 12

#: THE rules, bottom up: layer -> the layers its modules may import besides their own (and the
#: standard library and third parties). Type-only imports count. A plugin imports public modules
#: only: no ``_private`` one, not even of its own package (what a built-in shares with its
#: siblings is public: specframe.sizing, specframe.building, specframe.sampled_children).
RULES = {
    "models": set(),                                                  # specframe/models/
    "core": {"models"},                                               # specframe/*.py
    "sizing": {"core", "models"},                                     # specframe/sizing/
    "decode": {"core", "models", "sizing"},                           # specframe/decode/
    "serving": {"core", "models", "sizing", "decode"},                # specframe/serving/
    "harness": {"core", "models", "sizing", "decode", "serving"},     # specframe/experiments/
    "replay": {"core", "models", "sizing", "decode", "serving", "harness"},  # specframe/replay/
    "commands": {"core", "models", "sizing", "decode", "serving", "harness", "replay"},  # specframe/commands/
    "tuning": {"core", "models", "sizing", "decode", "serving", "harness", "replay"},  # specframe/tuning/
    "cli": {"core", "models", "sizing", "decode", "serving", "harness", "replay", "commands",
            "tuning"},                                                # specframe/cli.py
    "plugin": {"core", "models", "sizing", "decode"},                 # strategies/ drafters/ verifiers/
    "testing": {"core", "models", "sizing", "decode", "plugin"},      # specframe/testing/ (the kit)
}


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def layer_of(module: str) -> str:
    """The layer of a ``specframe...`` module name."""
    if _under(module, PLUGIN_PACKAGES):
        return "plugin"
    if module == "specframe.cli":
        return "cli"
    return next((layer for folder, layer in FOLDERS.items() if _under(module, (folder,))), "core")


@dataclass(frozen=True)
class Import:
    """One import statement's dependency: ``importer`` needs ``module`` (``line`` of ``path``)."""

    importer: str
    module: str
    path: Path
    line: int
    typing_only: bool  # under ``if TYPE_CHECKING:``: a layer dependency, but no runtime cycle


def modules(root: Path, sources: dict[str, str] = SOURCES) -> dict[str, Path]:
    """Every module name under ``root`` -> its file."""
    out = {}
    for package, folder in sources.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = list(path.relative_to(root / folder).with_suffix("").parts)
            if package == "specframe" and parts[0] == "assets" and len(parts) > 1:  # shipped data
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([package, *parts])] = path
    return out


def _typing_only_nodes(tree: ast.AST) -> set[int]:
    guarded = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            guarded |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return guarded


def imports(root: Path, sources: dict[str, str] = SOURCES) -> tuple[list[Import], list[str]]:
    """Every import of a ``specframe`` module in the tree, and the imports that name no module."""
    known = modules(root, sources)
    found, unknown = [], []
    for importer, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        typing_only = _typing_only_nodes(tree)
        package = importer if path.name == "__init__.py" else importer.rpartition(".")[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
                # ``from pkg import sub`` needs pkg.sub when that is a module, else pkg itself
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
            else:
                continue
            for target in dict.fromkeys(targets):
                if not _under(target, ("specframe",)):
                    continue
                if target not in known:
                    unknown.append(f"{path.relative_to(root)}:{node.lineno}: {importer} imports {target}, "
                                   "which is no module of the tree")
                    continue
                found.append(Import(importer, target, path, node.lineno, id(node) in typing_only))
    return found, unknown


def allowed(importer: str, module: str) -> bool:
    """Whether RULES let ``importer`` import ``module``."""
    if importer == module:
        return True
    have, want = layer_of(importer), layer_of(module)
    if have == "plugin":
        if any(part.startswith("_") for part in module.split(".")):
            return False  # a private module, even of its own package
        own = next(p for p in PLUGIN_PACKAGES if _under(importer, (p,)))
        return _under(module, (own,)) or (want != "plugin" and want in RULES["plugin"])
    return want == have or want in RULES[have]


def violations(root: Path, sources: dict[str, str] = SOURCES) -> list[str]:
    """Every broken layer rule and every import cycle among specframe/ modules, one line each."""
    found, problems = imports(root, sources)
    for imp in found:
        if not allowed(imp.importer, imp.module):
            problems.append(f"{imp.path.relative_to(root)}:{imp.line}: {imp.importer} ({layer_of(imp.importer)}) "
                            f"imports {imp.module} ({layer_of(imp.module)})")
    # Type-only imports count: a cycle through ``if TYPE_CHECKING:`` is still two modules that
    # cannot be read (or moved) apart.
    graph = nx.DiGraph((i.importer, i.module) for i in found
                       if i.importer != i.module and not _under(i.importer, PLUGIN_PACKAGES))
    for component in nx.strongly_connected_components(graph):
        if len(component) > 1:
            cycle = [a for a, _b in nx.find_cycle(graph.subgraph(component))]
            problems.append("import cycle: " + " -> ".join(cycle + cycle[:1]))
    return problems


# ---------------------------------------------------------------------- the real tree
def test_the_source_tree_keeps_the_layer_rules():
    found, _unknown = imports(REPO)
    assert len(found) > 100 and {layer_of(i.importer) for i in found} == set(RULES)  # not vacuous
    core = sorted(p.name for p in (REPO / "specframe").glob("*.py") if p.name not in ("__init__.py", "cli.py"))
    assert len(core) <= MAX_CORE_MODULES, f"{len(core)} modules directly in specframe/: {core}"
    problems = violations(REPO)
    assert not problems, "layer rules broken (see tests/test_imports.py RULES):\n" + "\n".join(problems)


def test_train_eagle_comes_from_the_drafters_plugin_hook():
    """The CLI imports no command by name: ``train-eagle`` arrives through ``register_commands``."""
    import click
    from click.testing import CliRunner

    import specframe

    group = click.Group("specframe")
    specframe.get_registry().register_commands(group)
    assert group.commands["train-eagle"].callback.__module__ == "specframe.drafters.eagle_train"
    result = CliRunner().invoke(group, ["train-eagle", "--help"])
    assert result.exit_code == 0 and "--draft-vocab-size" in result.output


# ---------------------------------------------------------------------- the checker can fail
FAKE_TREE = {
    "specframe/__init__.py": "",
    "specframe/tree.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .decode.engine import lazy\nX = 1\n",
    "specframe/_private.py": "",
    "specframe/models/__init__.py": "",
    "specframe/models/target.py": "from specframe.tree import X\n",
    "specframe/decode/__init__.py": "",
    "specframe/decode/engine.py": "from ..tree import X\n\ndef lazy():\n    from specframe.drafters.fast import F\n",
    "specframe/experiments/__init__.py": "",
    "specframe/experiments/report.py": "from . import metrics\n",
    "specframe/experiments/metrics.py": "def load():\n    from .report import render\n",
    "specframe/experiments/experiment.py": "import specframe.testing.models\nfrom ..decode.engine import lazy\n",
    "specframe/cli.py": "from specframe.experiments.experiment import run\n",
    "specframe/testing/__init__.py": "",
    "specframe/testing/models.py": "from specframe.drafters.fast import F\nfrom specframe.decode.engine import lazy\n",
    "drafters/__init__.py": "from . import fast\n",
    "drafters/fast.py": ("from specframe.tree import X\nfrom specframe import _private\n\ndef f():\n"
                         "    from specframe.strategies.chain import C\n    from specframe.cli import cli\n"
                         "    from specframe.strategies._auto import A\n"
                         "    from specframe.experiments.report import R\n"
                         "    from .gone import G\n"),
    "strategies/__init__.py": "",
    "strategies/_auto.py": "",
    "strategies/chain.py": "from specframe.decode.engine import lazy\n",
    "strategies/talon.py": "from ._auto import A\n",
    "verifiers/__init__.py": "",
}


def test_the_checker_finds_injected_violations(tmp_path):
    for name, text in FAKE_TREE.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    problems = violations(tmp_path)
    report = "\n".join(problems)
    expected = [
        "specframe.tree (core) imports specframe.decode.engine (decode)",            # upward, type-only
        "specframe.models.target (models) imports specframe.tree (core)",            # the bottom imports up
        "specframe.decode.engine (decode) imports specframe.drafters.fast (plugin)",  # lazy, inside a function
        "import cycle: ",                                                            # report <-> metrics (lazy)
        "import cycle: ",                                                            # tree <-> engine (type-only)
        "specframe.experiments.experiment (harness) imports specframe.testing.models (testing)",
        "specframe.drafters.fast (plugin) imports specframe._private (core)",       # not public
        "specframe.drafters.fast (plugin) imports specframe.strategies.chain (plugin)",  # another plugin
        "specframe.drafters.fast (plugin) imports specframe.cli (cli)",
        "specframe.drafters.fast (plugin) imports specframe.experiments.report (harness)",
        "imports specframe.drafters.gone, which is no module of the tree",          # a broken relative import
        "specframe.drafters.fast (plugin) imports specframe.strategies._auto (plugin)",  # a built-in's private module
        "specframe.strategies.talon (plugin) imports specframe.strategies._auto (plugin)",  # even its own package's
    ]
    for line in expected:
        assert line in report, f"missing {line!r} in:\n{report}"
    cycles = {frozenset(p.removeprefix("import cycle: ").split(" -> ")) for p in problems if p.startswith("import cycle")}
    assert cycles == {frozenset({"specframe.experiments.report", "specframe.experiments.metrics"}),
                      frozenset({"specframe.tree", "specframe.decode.engine"})}
    # what the rules allow stays quiet: cli -> harness, harness -> decode, testing -> plugin and
    # decode, plugin -> decode and its own package
    for quiet in ("specframe.cli (cli) imports", "specframe.testing.models (testing) imports specframe.decode",
                  "specframe.experiments.experiment (harness) imports specframe.decode",
                  "specframe.drafters (plugin) imports", "specframe.strategies.chain (plugin) imports"):
        assert quiet not in report, f"{quiet!r} was flagged:\n{report}"
    assert len(problems) == len(expected)


def test_no_private_name_is_exported():
    """Every ``__all__`` of the tree names public names only: a name another layer needs is public."""
    exported = []
    for module, path in modules(REPO).items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
                try:
                    names = ast.literal_eval(node.value)
                except ValueError:  # computed (specframe/__init__.py: its lazy table's public names)
                    continue
                exported += [f"{module}.{name}" for name in names if name.startswith("_")]
    assert not exported, f"private names in __all__: {exported}"
