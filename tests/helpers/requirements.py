"""Skips for what a machine may lack, narrowly: a test skips only when the named package is
not installed at all, never because something failed (a failure inside an installed package is
a failure). Under CI=true even these skips fail the run (tests/helpers/ci_skips.py)."""

from __future__ import annotations

import importlib.util
from importlib import metadata

import pytest


def require_module(name: str) -> None:
    """Skip unless module `name` is importable here (found, not imported)."""
    if importlib.util.find_spec(name) is None:
        pytest.skip(f"{name} is not installed")


def require_distribution(name: str, why: str) -> None:
    """Skip unless the distribution `name` is installed (`why`: what it brings)."""
    try:
        metadata.distribution(name)
    except metadata.PackageNotFoundError:
        pytest.skip(f"{name} is not installed: {why}")
