"""Shared test set-up: Hypothesis profiles and a registry reset around plugin tests."""

from specframe.testing.profiles import register_profiles

register_profiles()
