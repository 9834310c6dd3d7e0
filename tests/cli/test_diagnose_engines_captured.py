"""Which built-in engines `gate diagnose` captures, read from the classes before anything
loads: mlx through either path; executorch through its named activations (its program's own
ETDump, named by its ETRecord: tests/engines/test_executorch_capture.py)."""

from __future__ import annotations

import pytest

from gate.engines.registry import resolve
from gate.workflows.diagnose.core import NAMED_KIND, PATHS_KIND, capture_kind


def test_the_mlx_engine_is_captured_through_either_path() -> None:
    pytest.importorskip("mlx_lm")
    assert capture_kind(resolve("mlx")) == PATHS_KIND


def test_executorch_is_captured_through_its_named_activations() -> None:
    pytest.importorskip("executorch")
    assert capture_kind(resolve("executorch")) == NAMED_KIND
