"""Shared test set-up: Hypothesis profiles, one torch thread, and an environment of the suite's own.

The tests run tiny models, for which a second thread costs more in synchronisation than it
gains (5-100x slower on a loaded 2-core machine); one thread also keeps timings stable.

The suite depends only on what the README's set-up line installs, never on the machine it runs
on: the specframe cache (converted GGUFs, measured cost curves) is a fresh folder of this
session's instead of ``~/.cache/specframe``, variables that change which plugins load or what
the cache holds are cleared, and nothing reaches the model hub.
"""

import os
import shutil
import tempfile

import torch

from specframe.testing.profiles import register_profiles

#: Variables of the user's shell that would change what the tests see (which plugins load).
CLEARED = ("SPECFRAME_LOAD_PLUGINS", "SPECFRAME_DEBUG")

torch.set_num_threads(1)
register_profiles()


def pytest_configure(config):
    """Point the specframe cache at a new folder (subprocesses inherit it) and go offline."""
    cache = tempfile.mkdtemp(prefix="specframe-test-cache-")
    config._specframe_test_cache = cache
    os.environ["SPECFRAME_CACHE"] = cache
    os.environ["HF_HUB_OFFLINE"] = "1"
    # Tiny models' sub-millisecond forwards spread with any load and say nothing about the
    # machine: the suite's curves are never refused as measured on a busy machine.
    os.environ["SPECFRAME_CURVE_MAX_SPREAD"] = "inf"
    for name in CLEARED:
        os.environ.pop(name, None)


def pytest_unconfigure(config):
    """Remove the session's cache folder."""
    cache = getattr(config, "_specframe_test_cache", None)
    if cache:
        shutil.rmtree(cache, ignore_errors=True)
