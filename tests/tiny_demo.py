"""The tiny pair's demo config cut small for the Ray tests (3 questions, 16 tokens, a few arms):
one helper so `run --ray` and `record --ray` shard the same experiment."""

from __future__ import annotations

import re
from pathlib import Path

from specframe.cli import REPO_EXAMPLES

DEMO = REPO_EXAMPLES / "demo-tiny.toml"
#: The demo's arms kept (each distinct kind of drafting: none, a draft model, a head, n-grams).
ARMS = ("autoregressive", "chain", "talon", "eagle3+talon")


def demo_config(tmp: Path, extra: str = "", settings: str = "", name: str = "exp.toml") -> Path:
    """The cut demo config at ``tmp / name``: ``extra`` arms appended, ``settings`` (top-level
    keys) added to the run's."""
    text = DEMO.read_text()
    text = text.replace("max_new_tokens = 96", "max_new_tokens = 16").replace("limit = 10", "limit = 3")
    text = text.replace("threads = 1\n", f"threads = 1\n{settings}\n")
    text = text.replace('path = "prompts/code.jsonl"', f'path = "{DEMO.parent / "prompts" / "code.jsonl"}"')
    head, *arms = re.split(r"\n(?=\[\[arm\]\])", text.split("\n[data]")[0])
    tail = "\n[data]" + text.split("\n[data]")[1]
    kept = [a for a in arms if arm_name(a) in ARMS]
    assert [arm_name(a) for a in kept] == list(ARMS), [arm_name(a) for a in arms]
    path = tmp / name
    path.write_text("\n".join([head, *kept]) + extra + tail)
    return path


def arm_name(block: str) -> str:
    """The name specframe gives an ``[[arm]]`` block of the demo."""
    base = re.search(r'baseline = "([^"]+)"', block)
    if base:
        return base.group(1)
    policy = re.search(r'policy = "([^"]+)"', block).group(1)
    drafter = re.search(r'drafter = "([^"]+)"', block)
    return f"{drafter.group(1)}+{policy}" if drafter else policy
