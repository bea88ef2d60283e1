"""The suite sees only its own environment (tests/conftest.py): what it reads does not depend on
the machine's caches or the user's shell."""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import settings

from specframe.models.gguf import cache_root
from specframe.sizing.profile import cache_dir


def test_the_specframe_cache_is_the_sessions_own_folder():
    home_cache = Path.home() / ".cache" / "specframe"
    for folder in (cache_root(), cache_dir()):
        assert folder != home_cache and home_cache not in folder.parents, folder
    assert "specframe-test-cache-" in str(cache_root())


def test_plugin_selection_from_the_shell_is_cleared_and_the_hub_is_offline():
    assert "SPECFRAME_LOAD_PLUGINS" not in os.environ
    assert os.environ.get("HF_HUB_OFFLINE") == "1"


def test_the_ci_profile_keeps_no_example_database():
    assert settings.get_profile("ci").database is None
