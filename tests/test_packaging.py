"""The wheel ships every module of the source tree and its package data: the packages are
found, not listed (a hand-written list once left out ``specframe.experiments.load``, which
only a non-editable install showed: the suite runs from an editable one)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Root folders installed as ``specframe.<folder>`` (pyproject.toml's package-dir).
PLUGIN_FOLDERS = ("strategies", "drafters", "verifiers")
SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")


def shipped_by_the_tree() -> set[str]:
    """Each file the wheel must hold, as its path inside the wheel: every module under
    specframe/ and the plugin folders, the C++ kernel sources and the shipped assets."""
    want = set()
    for folder, prefix in [("specframe", "specframe"), *((f, f"specframe/{f}") for f in PLUGIN_FOLDERS)]:
        for path in (ROOT / folder).rglob("*.py"):
            if "__pycache__" not in path.parts:
                want.add(f"{prefix}/{path.relative_to(ROOT / folder).as_posix()}")
    want |= {f"specframe/models/csrc/{p.name}" for p in (ROOT / "specframe/models/csrc").glob("*.cpp")}
    want |= {f"specframe/{p.relative_to(ROOT / 'specframe').as_posix()}"
             for p in (ROOT / "specframe/assets").rglob("*") if p.is_file()}
    return want


@pytest.mark.packaging
def test_the_wheel_holds_every_module_and_the_package_data(tmp_path):
    src = tmp_path / "src"
    for folder in ("specframe", *PLUGIN_FOLDERS):
        shutil.copytree(ROOT / folder, src / folder, ignore=SKIP)
    for name in ("pyproject.toml", "setup.py", "README.md"):
        if (ROOT / name).is_file():
            shutil.copy2(ROOT / name, src / name)
    out = tmp_path / "wheel"
    # setuptools' own build backend, in a copy of the tree (no build/ or egg-info left in the checkout).
    subprocess.run([sys.executable, "-c", f"from setuptools import build_meta; build_meta.build_wheel({str(out)!r})"],
                   cwd=src, check=True, capture_output=True, timeout=120)
    (wheel,) = out.glob("specframe-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(shipped_by_the_tree() - names)
    assert not missing, f"{len(missing)} files of the source tree are not in the wheel, e.g. {missing[:8]}"
    assert not [n for n in names if n.startswith(("tests/", "examples/", "docs/"))]
