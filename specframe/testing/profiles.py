"""Hypothesis profiles: ``default`` is quick for local runs, ``ci`` is thorough.

Select with ``HYPOTHESIS_PROFILE=ci`` (``.ci/run`` does) or ``--hypothesis-profile=ci``.
"""

from __future__ import annotations

import os


def register_profiles() -> None:
    """Register and load the specframe profiles (model-based examples are slow, so few)."""
    from hypothesis import HealthCheck, settings

    common = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    settings.register_profile("default", max_examples=10, **common)
    settings.register_profile("ci", max_examples=30, **common)
    settings.register_profile("thorough", max_examples=200, **common)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
