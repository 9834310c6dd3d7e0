"""The messages a new user meets first: one line of gate's own, exit 2, naming what to do.

A path that does not exist is said as such (not as whatever the engine's library makes of
it); a JSON report given where a trace goes, or a trace where a report goes, is named for
what it is; a mistyped model id or prompt id gets the closest known one, and a mistyped
model id is not told to record a pin.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.gate_cli import invoke
from helpers.trace_builders import SEED_CANDIDATE, SEED_ORACLE

DEFAULT = "HuggingFaceTB/SmolLM2-135M-Instruct"


def one_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.mark.parametrize(
    "engine", [[], ["--engine", "hf"], ["--engine", "llamacpp"]], ids=["default", "hf", "llamacpp"]
)
def test_a_model_path_that_does_not_exist_is_gates_own_line(tmp_path: Path, engine: list[str]) -> None:
    missing = tmp_path / "nonexistent"
    r = invoke(["run", "--model-path", str(missing), *engine])
    assert r.exit_code == 2, r.output
    line = one_line(r.stderr)
    assert line == f"gate: error: --model-path {missing}: no such file or folder", line


@pytest.fixture
def report(tmp_path: Path) -> Path:
    out = tmp_path / "report.json"
    r = invoke(["compare", str(SEED_ORACLE), str(SEED_CANDIDATE), "--format", "json", "-o", str(out)])
    assert r.exit_code == 0, r.output
    return out


@pytest.mark.parametrize("compact", [False, True], ids=["as-written", "one-line"])
def test_a_report_given_as_a_trace_is_named_a_report(report: Path, compact: bool) -> None:
    if compact:
        report.write_text(json.dumps(json.loads(report.read_text())))
    for args in (["run", "--candidate-trace", str(report)], ["compare", str(SEED_ORACLE), str(report)]):
        r = invoke(args)
        assert r.exit_code == 2, r.output
        line = one_line(r.stderr)
        assert line.startswith(f"gate: error: {report}: "), line
        assert "is a gate JSON report" in line and "not a trace" in line, line
        assert "gate diff" in line, line
        assert "bad JSON" not in line, line


def test_a_trace_given_as_a_report_is_named_a_trace(report: Path) -> None:
    r = invoke(["diff", str(SEED_CANDIDATE), str(report)])
    assert r.exit_code == 2, r.output
    line = one_line(r.stderr)
    assert line.startswith(f"gate: error: {SEED_CANDIDATE}: "), line
    assert "is a gate trace" in line and "not a JSON report" in line, line


def test_a_mistyped_model_gets_the_pinned_model_it_resembles() -> None:
    r = invoke(["run", "--model", "HuggingFaceTB/SmolLM2-135M-Instructt", "--candidate-trace", str(SEED_CANDIDATE)])
    assert r.exit_code == 2, r.output
    assert f"Did you mean {DEFAULT!r}?" in r.stderr, r.stderr
    # A typo is not a model without a pin: nothing says to record one.
    assert "record" not in r.stderr, r.stderr
    assert "hint:" not in r.stderr, r.stderr


def test_a_model_like_no_pinned_one_is_still_told_how_to_record_its_pin() -> None:
    r = invoke(["run", "--model", "acme/brand-new-model", "--candidate-trace", str(SEED_CANDIDATE)])
    assert r.exit_code == 2, r.output
    assert "Did you mean" not in r.stderr, r.stderr
    assert "hint: gate pin record --model acme/brand-new-model" in r.stderr, r.stderr


def test_a_mistyped_prompt_gets_the_prompt_id_it_resembles() -> None:
    # The prompt is checked against the pin before any engine loads.
    r = invoke(["diagnose", "--prompt", "code-nump", "--position", "3"])
    assert r.exit_code == 2, r.output
    line = one_line(r.stderr)
    assert "--prompt 'code-nump'" in line and "Did you mean 'code-numpy'?" in line, line


def test_did_you_mean_names_the_closest_or_nothing() -> None:
    from gate.text import did_you_mean

    assert did_you_mean("vlm", ["hf", "vllm", "mlx"]) == " Did you mean 'vllm'?"
    assert did_you_mean("zzzz", ["hf", "vllm", "mlx"]) == ""
    assert did_you_mean("x", []) == ""
