"""The package list is found, not written: every package under ``specframe/`` and under the
built-in plugin folders (``strategies/``, ``drafters/``, ``verifiers/``, installed as
``specframe.strategies`` etc. through ``package-dir`` in pyproject.toml). A hand-written list
once left out ``specframe.experiments.load``, and only a non-editable install showed it."""

from setuptools import find_packages, setup

#: Folders at the repository root installed as subpackages of ``specframe``.
PLUGIN_FOLDERS = ("strategies", "drafters", "verifiers")


def found_packages() -> list[str]:
    """``specframe`` and its subpackages, then each plugin folder and its subpackages, as the
    dotted names pyproject.toml's ``package-dir`` maps to their folders."""
    packages = ["specframe", *(f"specframe.{p}" for p in find_packages("specframe", include=["*"]))]
    for folder in PLUGIN_FOLDERS:
        packages += [f"specframe.{folder}", *(f"specframe.{folder}.{p}" for p in find_packages(folder, include=["*"]))]
    return packages


setup(packages=found_packages())
