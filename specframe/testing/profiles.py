"""Hypothesis profiles: ``default`` is quick for local runs, ``ci`` is thorough.

Select with ``HYPOTHESIS_PROFILE=ci`` (``.ci/run`` does) or ``--hypothesis-profile=ci``.
"""

from __future__ import annotations

import os

#: Examples per property of each profile (the conformance suite sizes itself from this too).
#: ``ci`` is twice the local default and what keeps the full suite within CI's 15 minutes on two
#: cores; ``thorough`` is for a long run before a release.
PROFILE_EXAMPLES = {"default": 10, "ci": 20, "thorough": 200}


def profile_examples(profile: str | None = None) -> int:
    """Examples per property of ``profile`` (default: ``$HYPOTHESIS_PROFILE``, else ``default``)."""
    name = profile or os.environ.get("HYPOTHESIS_PROFILE", "default")
    return PROFILE_EXAMPLES.get(name, PROFILE_EXAMPLES["default"])


def register_profiles() -> None:
    """Register and load the specframe profiles (model-based examples are slow, so few)."""
    from hypothesis import HealthCheck, settings

    common = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    for name, examples in PROFILE_EXAMPLES.items():
        # ci keeps no example database: what a run draws depends on the code, not on the
        # failures an earlier run on the same machine saved under .hypothesis/.
        database = {"database": None} if name == "ci" else {}
        settings.register_profile(name, max_examples=examples, **common, **database)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
