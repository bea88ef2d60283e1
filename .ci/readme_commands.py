"""Print one of the README's two set-up commands, so CI runs what a new user copies.

    python3 .ci/readme_commands.py setup    # installs what is needed and runs the demo
    python3 .ci/readme_commands.py install  # the set-up line up to the demo: the install alone
    python3 .ci/readme_commands.py test     # runs the tests
    python3 .ci/readme_commands.py plugin   # installs the tutorial's plugin, as "Add your own policy" says

The first two are the first two ```bash blocks under the README's "## Set up" heading; the third
is the ``pip install -e docs/examples/...`` that the "## Add your own policy" section gives. Anything
else there is an error, so CI cannot drift from the page.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
WHICH = ("setup", "test")
#: How the set-up line ends: the demo, after the install.
DEMO = " && specframe demo"
#: The tutorial plugin's install, as the "Add your own policy" section's command opens.
PLUGIN = re.compile(r"`(pip install -e docs/examples/[\w.-]+)(?: && [^`]*)?`")


def readme_commands(text: str) -> dict[str, str]:
    """``{"setup": ..., "test": ...}``: the one-line bash blocks that open the Set up section."""
    section = text.split("\n## Set up", 1)
    if len(section) != 2:
        raise SystemExit("README.md has no '## Set up' section")
    body = section[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", body, flags=re.S)
    if len(blocks) < 2:
        raise SystemExit(f"README.md's Set up section has {len(blocks)} bash blocks; it needs 2 (set-up, tests)")
    commands = [block.strip() for block in blocks[:2]]
    for which, command in zip(WHICH, commands):
        if "\n" in command:
            raise SystemExit(f"README.md's {which} command is not one line: {command!r}")
    found = dict(zip(WHICH, commands))
    if not found["setup"].endswith(DEMO):
        raise SystemExit(f"README.md's set-up command does not end with {DEMO.strip()!r}: {found['setup']!r}")
    found["install"] = found["setup"][: -len(DEMO)]
    found["plugin"] = plugin_command(text)
    return found


def plugin_command(text: str) -> str:
    """The tutorial plugin's ``pip install -e`` from the README's "Add your own policy" section."""
    section = text.split("\n## Add your own policy", 1)
    if len(section) != 2:
        raise SystemExit("README.md has no '## Add your own policy' section")
    found = PLUGIN.search(section[1].split("\n## ", 1)[0])
    if found is None:
        raise SystemExit("README.md's 'Add your own policy' section gives no `pip install -e docs/examples/...`")
    return found.group(1)


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in (*WHICH, "install", "plugin"):
        raise SystemExit(f"usage: readme_commands.py {{{'|'.join((*WHICH, 'install', 'plugin'))}}}")
    print(readme_commands(README.read_text(encoding="utf-8"))[sys.argv[1]])
