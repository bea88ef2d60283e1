"""Serving's measurements share their machine description with the cost-curve cache keys."""

from __future__ import annotations

from specframe.models import cache_keys
from specframe.serving.acceptance import provenance


def test_provenance_names_the_cpu_the_cache_keys_name(monkeypatch):
    monkeypatch.setattr(cache_keys, "cpu_name", lambda: "Test CPU 9000")
    assert provenance("specframe acceptance")["machine"].startswith("Test CPU 9000, ")
    assert cache_keys.cpu_label() == "Test-CPU-9000"  # the key is the same name made safe


def test_an_imported_assistant_setting_says_transformers_reads_it_from_the_assistant():
    """transformers 5.25's AssistedCandidateGenerator reads num_assistant_tokens, its schedule and
    the confidence threshold from the assistant's generation_config; as generate kwargs they
    would not take effect, so an import that takes them says where they must be set."""
    from specframe.serving.engines import import_arm

    table = {"assistant_model": "draft/folder", "num_assistant_tokens": 5,
             "num_assistant_tokens_schedule": "constant", "assistant_confidence_threshold": 0.0}
    _drafter, policy, _verifier, fidelity = import_arm("hf", table, "[[arm]] #1")
    assert policy.options["gamma"] == 5
    assert "assistant's generation_config" in fidelity.statement
