"""Which built-in engines `gate diagnose` captures, read from the classes before anything
loads: mlx through either path; executorch refused, exit 2 in one line, before a program loads
(its activations are out of reach: docs/results/engine-executorch.md, "Diagnosis")."""

from __future__ import annotations

import pytest
from helpers.gate_cli import invoke

from gate.engines.registry import resolve
from gate.workflows.diagnose import PATHS_KIND, capture_kind


def test_the_mlx_engine_is_captured_through_either_path() -> None:
    pytest.importorskip("mlx_lm")
    assert capture_kind(resolve("mlx")) == PATHS_KIND


def test_executorch_is_refused_before_it_loads_in_one_line() -> None:
    pytest.importorskip("executorch")
    r = invoke(["diagnose", "--engine", "executorch", "--prompt", "chat-haiku", "--position", "3"])
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "cannot capture engine 'executorch'" in lines[0] and "mlx" in lines[0], r.stderr
