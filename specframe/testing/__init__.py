"""Testing utilities for specframe and its plugins: Hypothesis strategies, tiny models, profiles.

Importing this package is cheap: heavy modules (torch models, hypothesis) load on first use.
"""
