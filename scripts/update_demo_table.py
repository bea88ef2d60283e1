"""Put one `specframe demo` run's table into README.md and docs/results.md.

    specframe demo --fresh && python scripts/update_demo_table.py specframe-demo [--note "otherwise idle"]

Both files hold the demo's table between ``<!-- demo-table:start ... -->`` and
``<!-- demo-table:end -->`` markers; this replaces what lies between them with the "Overall"
table of RUN_DIR/report.md and the run's date (today, UTC), commit (``git rev-parse HEAD``),
CPU model, core count and GPU, so the two copies always show the same run with its machine.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"(<!-- demo-table:start[^>]*-->\n).*?(<!-- demo-table:end -->)", re.S)
SHOWS = ("the demo's summary table (`examples/demo.toml`: SmolLM2-135M-Instruct, {linears} linears, "
         "2 threads); the same table is in the README")


def overall_table(run_dir: Path) -> str:
    """The '## Overall' table of a run's report.md."""
    section = (run_dir / "report.md").read_text(encoding="utf-8").split("## Overall", 1)[1].strip()
    rows = []
    for line in section.splitlines():
        if not line.startswith("|"):
            break  # the first table only: per-category tables follow
        rows.append(line)
    return "\n".join(rows)


def linears_of(run_dir: Path) -> str:
    """What ran the target's linears, as the run's run.json names it (older runs: float32)."""
    import json

    run = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    return str(run.get("linears") or run.get("settings", {}).get("linears") or "float32")


def cpu_model() -> str:
    """The CPU's model name as lscpu / /proc/cpuinfo report it."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu() -> str:
    """The first CUDA device's name, or 'no GPU'."""
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"


def machine(note: str) -> str:
    """'CPU model, N cores, GPU[; note]' of this machine."""
    return f"{cpu_model()}, {os.cpu_count()} cores, {gpu()}" + (f"; {note}" if note else "")


def replace_block(path: Path, body: str) -> None:
    """Replace what lies between the demo-table markers of ``path`` by ``body``."""
    text = path.read_text(encoding="utf-8")
    if not BLOCK.search(text):
        raise SystemExit(f"{path}: no <!-- demo-table:start --> ... <!-- demo-table:end --> block")
    path.write_text(BLOCK.sub(lambda m: m.group(1) + body + "\n" + m.group(2), text, count=1), encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="the demo's output directory (default ./specframe-demo)")
    parser.add_argument("--note", default="", help="how loaded the machine was, e.g. 'otherwise idle'")
    parser.add_argument("--commit", default=None, help="the commit the demo ran on (default: HEAD)")
    parser.add_argument("--command", default="specframe demo --fresh", help="the command that made RUN_DIR")
    args = parser.parse_args()
    table = overall_table(args.run_dir)
    date = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    commit = args.commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                           capture_output=True, text=True, check=True).stdout.strip()
    where = machine(args.note)
    replace_block(ROOT / "README.md",
                  f"One `{args.command}` run, {date}, commit `{commit}`, on {where}:\n\n{table}")
    replace_block(ROOT / "docs" / "results.md",
                  f"- Date: {date}\n- Machine: {where}\n- Commit: `{commit}`\n- Command: `{args.command}`\n"
                  f"- Shows: {SHOWS.format(linears=linears_of(args.run_dir))}\n\n{table}")
    print(f"README.md and docs/results.md now show the run of {date} (commit {commit}) on {where}")


if __name__ == "__main__":
    main()
