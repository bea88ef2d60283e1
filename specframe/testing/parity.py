"""The reference implementations the parity tests compare with (docs/parity.md).

Where a reference is not installed its tests skip, naming the package and the script that
installs it; with ``SPECFRAME_REQUIRE_PARITY=1`` (CI) they fail instead, so that a missing
reference can never pass as a skipped test.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest

#: Set to 1 to make a missing reference a failure rather than a skip.
REQUIRE_ENV = "SPECFRAME_REQUIRE_PARITY"
INSTALL = "bash scripts/install_parity.sh"


def reference(module: str, package: str) -> ModuleType:
    """Import ``module`` of the reference distribution ``package`` for a parity test module:
    skip the module where it is missing, or fail under :data:`REQUIRE_ENV`."""
    if os.environ.get(REQUIRE_ENV, "") not in ("", "0"):
        return importlib.import_module(module)
    return pytest.importorskip(module, reason=f"{package} is not installed: {INSTALL}")
