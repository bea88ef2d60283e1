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
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from specframe.testing.profiles import register_profiles

#: Variables of the user's shell that would change what the tests see (which plugins load).
CLEARED = ("SPECFRAME_LOAD_PLUGINS", "SPECFRAME_DEBUG")

torch.set_num_threads(1)
register_profiles()


#: How the session's cache folder is named (a parallel worker reuses its controller's).
CACHE_PREFIX = "specframe-test-cache-"


def pytest_configure(config):
    """Point the specframe cache at a new folder (subprocesses inherit it) and go offline.

    Under pytest-xdist the controller makes the folder and its workers, which inherit its
    environment, share it: a model converted or a cost curve measured by one worker is reused by
    the others (conversions hold a lock, and every cache write renames a file of its own), and
    only the controller removes it."""
    inherited = os.environ.get("SPECFRAME_CACHE", "")
    if not (os.environ.get("PYTEST_XDIST_WORKER") and Path(inherited).name.startswith(CACHE_PREFIX)):
        cache = tempfile.mkdtemp(prefix=CACHE_PREFIX)
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


#: The files whose tests take longest (``--durations``: each holds tests of 20-80 s on a 2-core
#: machine), slowest first. They run first, so that parallel workers (``-n auto --dist
#: worksteal``) end on short tests and finish together instead of one waiting on a long test
#: started last. Order only: a file missing here runs after them, in collection order.
SLOW_FIRST = (
    "test_lossless.py", "test_sampling_distribution.py", "test_fault_injection.py", "test_smollm2.py",
    "test_conformance_example_plugin.py", "test_hardening.py", "test_benchmarks.py", "test_tune.py",
    "test_replay_cli.py", "test_compile.py", "test_demo_pair.py", "test_docs.py", "test_eagle.py",
    "test_conformance_builtins.py", "test_conformance_pytester.py", "test_batch.py", "test_engines.py",
    "test_sharded_run.py", "test_sharded_record.py", "test_ray_tune_sweep.py", "test_load.py",
    "test_recorded_outputs.py", "test_suite_with_a_plugin.py",
)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """Put :data:`SLOW_FIRST`'s files first; a stable sort keeps each file's tests together and in
    order (its module fixtures are built once per worker)."""
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def pytest_runtest_teardown(item, nextitem):
    """Stop this process's local Ray once the next test does not use it (tests/ray_session.py)."""
    ray_session = sys.modules.get("ray_session")
    if ray_session is not None:
        ray_session.stop_unless_next_uses_it(nextitem)
