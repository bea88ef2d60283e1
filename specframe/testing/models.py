"""Tiny random transformers models for tests: re-exported from :mod:`specframe.synthetic_models`,
where the product's ``random:<arch>`` and ``perturbed:<alias>`` experiment models live."""

from __future__ import annotations

from ..synthetic_models import (  # noqa: F401
    ARCHITECTURES, EAGER_ONLY, EXTENDED, MATRIX, WINDOW, perturbed_copy, tiny_config, tiny_model,
)
