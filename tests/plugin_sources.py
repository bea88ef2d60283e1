"""A throw-away third-party policy for the plugin tests: its source, and a minimal installed
distribution (dist-info + module) that exposes it through the ``specframe`` entry point, so
test_plugins.py and test_suite_with_a_plugin.py install the same kind of plugin one way."""

from __future__ import annotations

from pathlib import Path

#: The plugin module's source; ``{name}`` is the policy's registered name.
POLICY_SOURCE = '''
from dataclasses import dataclass
import torch
import specframe


@dataclass
class OneStepOptions(specframe.BudgetOptions):
    """A budget whose default differs from the 6 the suite gives the built-ins."""
    budget: int = 2


class OneStepPolicy(specframe.TreePolicy):
    """Drafts exactly one token: the drafter's top-1 child of the root."""
    name = "{name}"
    Options = OneStepOptions

    def build(self, session, budget):
        tree = session.new_tree()
        logp = session.expand(tree, [0])[0]
        tok = int(logp.argmax())
        return tree.add_nodes(torch.tensor([0]), torch.tensor([tok]), logp[tok:tok + 1])


@specframe.hookimpl
def register_tree_policies(register):
    register(OneStepPolicy)
'''


def install_distribution(root: Path, name: str, dist: str, version: str, module: str, entry: str) -> Path:
    """Write the module ``module`` (policy ``name``) and the dist-info of ``dist`` ``version``, whose
    ``specframe`` entry point ``entry`` names the module, into ``root``; importable once ``root`` is
    on the path. Returns ``root``."""
    (root / f"{module}.py").write_text(POLICY_SOURCE.format(name=name))
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[specframe]\n{entry} = {module}\n")
    return root
