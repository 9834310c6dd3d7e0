"""Every door judges one way: `gate compare`, `gate run --candidate-trace`, `gate run
--engine`, `gate.compare`, `gate.run`, the pytest fixture and the Action, fed the same
oracle and candidate, write the same JSON report. Three fields legitimately differ and are
dropped before comparing: `run` and `machine` (what ran: the engine's info, the timings, the
machine; absent where two trace files are compared as they are) and `doctrine_source`
(which file the doctrine was read from: the pin's trace or the oracle trace given); the
doctrine itself and every other field are equal.

The candidate is the default pin's own trace with every logprob scaled by 1.1: the same
tokens (no divergence), a distribution beyond the pin's honest floor. The pin's doctrine
(its header's) fails it; a bare `Doctrine()` (no floor) would pass it."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from helpers.gate_cli import invoke
from helpers.pin_candidates import default_pin_trace, write_trace_file
from helpers.replay_engine import ReplayEngine

import gate
from gate.core.traces.trace import Trace
from gate.integrations import github_action
from gate.models.default import DEFAULT_MODEL
from gate.reports import render

pytest_plugins = ["pytester"]

REPLAY = f"{ReplayEngine.__module__}:ReplayEngine"


def scaled(pin: Trace, factor: float) -> Trace:
    records = tuple(
        replace(r, top_logprobs=tuple(tuple((t, lp * factor) for t, lp in pos) for pos in r.top_logprobs or ()))
        for r in pin.records
    )
    return Trace(header=replace(pin.header, role="candidate"), records=records, path="<scaled>")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("doors")
    pin = default_pin_trace()
    oracle = write_trace_file(pin, folder / "oracle.jsonl")
    return oracle, write_trace_file(scaled(pin, 1.1), folder / "candidate.jsonl")


def comparable(text: str) -> dict[str, Any]:
    report: dict[str, Any] = json.loads(text)
    for key in ("run", "machine", "doctrine_source"):
        report.pop(key, None)
    return report


def test_python_compare_judges_by_the_oracle_s_own_doctrine_as_the_cli_does(inputs: tuple[Path, Path]) -> None:
    oracle, candidate = inputs
    r = invoke(["compare", str(oracle), str(candidate), "--format", "json"])
    assert r.exit_code == 1, r.output
    cli = comparable(r.stdout)
    assert cli["verdict"] == "fail" and cli["doctrine"]["floor"]["kl_mean_mnats"] == 1.74
    assert render(gate.compare(str(oracle), str(candidate)), "json") == r.stdout
    traces = gate.compare(gate.read_trace(oracle), gate.read_trace(candidate))
    assert render(traces, "json") == r.stdout
    # A caller's doctrine is the caller's: the bare defaults have no floor.
    assert gate.compare(oracle, candidate, gate.Doctrine()).verdict == "strict_pass"


def test_every_door_writes_the_same_json_report(
    inputs: tuple[Path, Path], tmp_path: Path, pytester: pytest.Pytester
) -> None:
    oracle, candidate = inputs
    reports: dict[str, dict[str, Any]] = {}
    r = invoke(["compare", str(oracle), str(candidate), "--format", "json"])
    reports["gate compare"] = comparable(r.stdout)
    r = invoke(["run", "--candidate-trace", str(candidate), "--format", "json"])
    assert r.exit_code == 1, r.output
    reports["gate run --candidate-trace"] = comparable(r.stdout)
    r = invoke(["run", "--engine", REPLAY, "--engine-opt", f"trace={candidate}", "--format", "json"])
    assert r.exit_code == 1, r.output
    reports["gate run --engine"] = comparable(r.stdout)
    reports["gate.compare"] = comparable(render(gate.compare(oracle, candidate), "json"))
    engine = ReplayEngine(DEFAULT_MODEL, trace=str(candidate))
    reports["gate.run"] = comparable(render(gate.run(engine), "json"))

    folder = tmp_path / "action"
    env = {"GITHUB_OUTPUT": str(tmp_path / "out"), "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md")}
    code = github_action.main(["--candidate-trace", str(candidate), "--report-dir", str(folder)], env)
    assert code == 1
    reports["the Action"] = comparable((folder / github_action.REPORT_JSON).read_text())

    pytester.makepyfile(test_foreign=f"def test_engine(gate_check):\n    gate_check({str(candidate)!r})\n")
    pytester.runpytest("-p", "no:cacheprovider", "--gate-report-dir", "reports").assert_outcomes(failed=1)
    reports["the fixture"] = comparable((pytester.path / "reports" / "test_foreign.py_test_engine.json").read_text())

    first = reports["gate compare"]
    assert first["verdict"] == "fail", first["reason"]
    for door, report in reports.items():
        assert report == first, door


@pytest.mark.parametrize("bad", [42, None, b"oracle.jsonl", ["oracle.jsonl"]])
def test_compare_of_neither_path_nor_trace_is_a_type_error_naming_the_parameter(
    inputs: tuple[Path, Path], bad: object
) -> None:
    oracle, candidate = inputs
    with pytest.raises(TypeError, match=r"gate.compare: oracle is a .*expected a trace file's path"):
        gate.compare(bad, candidate)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"gate.compare: candidate is a .*expected a trace file's path"):
        gate.compare(oracle, bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"gate.compare: doctrine is a"):
        gate.compare(oracle, candidate, {"near_tie_mnats": 1})  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [42, None, 1.5])
def test_run_of_neither_engine_nor_name_is_a_type_error_naming_the_parameter(bad: object) -> None:
    with pytest.raises(TypeError, match=r"gate.run: engine is a .*expected a loaded engine .* or an engine name"):
        gate.run(bad)  # type: ignore[arg-type]
