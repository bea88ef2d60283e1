"""Two revisions of specframe, one benchmark, interleaved: is the new code as fast as the old?

A benchmark run imports one specframe; comparing two revisions in one process is impossible,
so this script alternates whole runs, ``before, after, before, after, ...``, with each
revision's own copy of the source (``git archive``) on ``PYTHONPATH`` and its own benchmark
script as the working directory. Machine drift then hits both revisions alike (rounds
alternate which one goes first). From every run it reads the benchmark's table rows (first
token an arm name, second a number: tokens/s in the benchmarks here; or markdown rows whose
cells up to the first with letters name the arm) and prints, per arm, each
revision's median, the after/before ratio and the spread of the per-round ratios (the noise
line). Example::

    python benchmarks/ab_revisions.py --before main~3 --rounds 3 -- \\
        python benchmarks/auto_sizing.py --pair smollm2 --drafter ngram --table chain --limit 6

``--after`` defaults to the working tree (uncommitted changes included).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: A table row: an arm name, spaces, a number (the first column of figures).
ROW = re.compile(r"^(?P<arm>[A-Za-z][\w.+/\-\[\]=,@]*)\s+(?P<value>\d+(?:\.\d+)?)\s")
NUMBER = re.compile(r"^\d+(?:\.\d+)?$")


def table_row(line: str) -> tuple[str, float] | None:
    """``(arm, first figure)`` of a table row: ``arm  12.3 ...`` as printed, or a markdown row
    ``| 4 | equal | 12.3 | ...`` (the cells up to the first one with letters name the arm)."""
    match = ROW.match(line)
    if match:
        return match["arm"], float(match["value"])
    if not line.startswith("|"):
        return None
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    named = next((i for i, c in enumerate(cells) if re.search(r"[A-Za-z]", c)), None)
    if named is None or named + 1 >= len(cells) or not NUMBER.match(cells[named + 1]):
        return None
    return " ".join(cells[: named + 1]), float(cells[named + 1])
PLUGIN_FOLDERS = ("strategies", "drafters", "verifiers")


def checkout(rev: str | None, into: Path) -> Path:
    """The source of ``rev`` (None: the working tree, tracked and untracked files) under ``into``."""
    into.mkdir(parents=True)
    if rev is None:
        files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, check=True,
                               capture_output=True, text=True).stdout.split()
        for name in files:
            if (ROOT / name).is_file():
                (into / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / name, into / name)
    else:
        archive = subprocess.run(["git", "archive", rev], cwd=ROOT, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


#: Put first on PYTHONPATH: an editable install of specframe (``pip install -e``) finds its
#: package through a meta-path finder that runs before PYTHONPATH is searched; drop it.
SITECUSTOMIZE = """import sys
sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable___specframe")]
"""


def importable(tree: Path, into: Path) -> Path:
    """A folder whose ``specframe`` package is ``tree``'s, with the plugin folders inside it
    (pyproject's package-dir maps them so in an install)."""
    package = into / "specframe"
    package.mkdir(parents=True)
    (into / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
    for entry in (tree / "specframe").iterdir():
        (package / entry.name).symlink_to(entry)
    for folder in PLUGIN_FOLDERS:
        (package / folder).symlink_to(tree / folder)
    return into


def run(command: list[str], tree: Path, path: Path) -> tuple[dict[str, float], float]:
    """One benchmark run in ``tree`` with ``path`` first on PYTHONPATH: its rows and seconds."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(path), os.environ.get("PYTHONPATH", "")])}
    start = time.perf_counter()
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed in {tree}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    rows = {}
    for line in done.stdout.splitlines():
        found = table_row(line)
        if found and found[0] not in rows:
            rows[found[0]] = found[1]
    return rows, seconds


def check_source(path: Path) -> str:
    """Where ``import specframe`` resolves under ``path`` (must be that copy)."""
    env = {**os.environ, "PYTHONPATH": str(path)}
    code = "import specframe.drafters as d, specframe as s; print(s.__file__, d.__file__)"
    done = subprocess.run([sys.executable, "-c", code], cwd=path, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"cannot import specframe from {path}:\n{done.stderr[-2000:]}")
    return done.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="git revision of the old code")
    parser.add_argument("--after", default=None, help="git revision of the new code (default: the working tree)")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each revision, alternating")
    parser.add_argument("--base", default="autoregressive",
                        help="an arm to divide by within each run (speedups; default autoregressive, if printed)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the benchmark command, run in each revision")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the benchmark command after --")
    with tempfile.TemporaryDirectory(prefix="specframe-ab-") as tmp:
        trees = {}
        for label, rev in (("before", args.before), ("after", args.after)):
            tree = checkout(rev, Path(tmp) / label / "repo")
            path = importable(tree, Path(tmp) / label / "path")
            print(f"{label}: {rev or 'working tree'} -> {check_source(path)}", flush=True)
            trees[label] = (tree, path)
        results: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
        for r in range(args.rounds):
            order = ("before", "after") if r % 2 == 0 else ("after", "before")
            for label in order:
                rows, seconds = run(command, *trees[label])
                results[label].append(rows)
                print(f"round {r + 1} {label:6s} {seconds:7.1f} s  " + "  ".join(f"{a} {v:g}" for a, v in rows.items()),
                      flush=True)
        report(results)
        if all(args.base in rows for runs in results.values() for rows in runs):
            print(f"\nwithin each run, divided by {args.base} (drift between runs cancels):")
            report({label: [{a: v / rows[args.base] for a, v in rows.items() if a != args.base} for rows in runs]
                    for label, runs in results.items()}, digits=3)


def report(results: dict[str, list[dict[str, float]]], digits: int = 2) -> None:
    """Per arm: each revision's median, after/before of the medians, and the per-round ratios."""
    arms = [a for a in results["before"][0] if all(a in rows for runs in results.values() for rows in runs)]
    print(f"\n{'arm':28s} {'before':>9s} {'after':>9s} {'after/before':>13s}  per-round ratios")
    for arm in arms:
        before = [rows[arm] for rows in results["before"]]
        after = [rows[arm] for rows in results["after"]]
        ratios = [a / b for a, b in zip(after, before) if b]
        print(f"{arm:28s} {statistics.median(before):9.{digits}f} {statistics.median(after):9.{digits}f} "
              f"{statistics.median(after) / statistics.median(before):13.3f}  "
              + " ".join(f"{x:.3f}" for x in ratios))


if __name__ == "__main__":
    main()
