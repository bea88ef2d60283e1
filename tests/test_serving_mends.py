"""Serving's measurements share their machine description with the cost-curve cache keys."""

from __future__ import annotations

from specframe.models import cache_keys
from specframe.serving.acceptance import provenance


def test_provenance_names_the_cpu_the_cache_keys_name(monkeypatch):
    monkeypatch.setattr(cache_keys, "cpu_name", lambda: "Test CPU 9000")
    assert provenance("specframe acceptance")["machine"].startswith("Test CPU 9000, ")
    assert cache_keys.cpu_label() == "Test-CPU-9000"  # the key is the same name made safe
