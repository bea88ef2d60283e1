"""The device an answer ran on lives in the harness (no Ray in it), and names its CPU as the
cost-curve cache keys do: one ``cpu_name`` in specframe, the models layer's."""

from __future__ import annotations

import ast
from pathlib import Path

import specframe
from specframe.models import cache_keys

SOURCE = Path(specframe.__file__).resolve().parent


def test_an_answer_names_the_cpu_the_cache_keys_name(monkeypatch):
    from specframe.experiments.device import describe_device

    monkeypatch.setattr(cache_keys, "cpu_name", lambda: "Test CPU 9000")
    assert describe_device("cpu")["name"] == "Test CPU 9000"
    monkeypatch.setattr(cache_keys, "cpu_name", lambda: "")  # nothing known: still a name
    assert describe_device("cpu")["name"] == "cpu"


def test_cpu_name_is_written_once_and_the_device_module_holds_no_ray():
    def defines(path: Path) -> bool:
        return any(isinstance(n, ast.FunctionDef) and n.name == "cpu_name" for n in ast.walk(ast.parse(path.read_text())))

    defined = [str(path.relative_to(SOURCE)) for path in SOURCE.rglob("*.py") if defines(path)]
    assert defined == ["models/cache_keys.py"]
    assert not (SOURCE / "experiments" / "cluster" / "device.py").exists()
    tree = ast.parse((SOURCE / "experiments" / "device.py").read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not {m for m in imported if m and (m == "ray" or ".cluster" in m)}
