"""Tiny random transformers models for tests: re-exported from :mod:`specframe.models.synthetic`,
where the product's ``random:<arch>`` and ``perturbed:<alias>`` experiment models live."""

from __future__ import annotations

from specframe.models.synthetic import (  # noqa: F401
    ARCHITECTURES, EAGER_ONLY, EXTENDED, MATRIX, WINDOW, perturbed_copy, tiny_config, tiny_model,
)
