"""`gate_candidate`, the one gate of the integrations: the verdict `gate run --candidate-trace`
gives, and the evidence a candidate reports about itself never buys a pass when it is
removed, truncated or replaced."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from helpers.gate_cli import invoke
from helpers.pin_candidates import default_pin_trace, honest_candidate, planted_defect, write_trace_file

from gate.core.traces.trace import PromptRecord, Trace
from gate.errors import InputError
from gate.integrations.gating import Overrides, failure_reason, gate_candidate


@pytest.fixture(scope="module")
def defective() -> tuple[Trace, str, int]:
    return planted_defect(default_pin_trace())


def test_the_same_verdict_as_gate_run(tmp_path: Path, defective: tuple[Trace, str, int]) -> None:
    path = write_trace_file(defective[0], tmp_path / "defective.jsonl")
    report = tmp_path / "report.json"
    r = invoke(["run", "--candidate-trace", str(path), "--format", "json", "-o", str(report)])
    assert r.exit_code == 1, r.output
    ours = gate_candidate(path).result
    theirs = json.loads(report.read_text())
    assert theirs["summary"] == ours.summary and theirs["verdict"] == ours.verdict
    assert theirs["oracle_sha256"] == ours.oracle_sha256


def self_reports(trace: Trace, prompt_id: str, position: int) -> dict[str, Trace]:
    """The defective candidate with what it says about itself removed, truncated or replaced."""
    bad = next(r for r in trace.records if r.id == prompt_id)
    i = trace.records.index(bad)

    def with_record(rec: PromptRecord) -> Trace:
        records = list(trace.records)
        records[i] = rec
        return replace(trace, records=tuple(records))

    return {
        "header engine emptied": replace(trace, header=replace(trace.header, engine={}, extra={})),
        "truncated after the flip": with_record(replace(bad, token_ids=bad.token_ids[: position + 1])),
        "stopped after the flip": with_record(
            replace(bad, token_ids=bad.token_ids[: position + 1], finish_reason="stop")
        ),
        "prompt text dropped": with_record(replace(bad, prompt=None, tokens=None)),
    }


@pytest.mark.parametrize(
    "variant", ["header engine emptied", "truncated after the flip", "stopped after the flip", "prompt text dropped"]
)
def test_removing_what_the_candidate_says_never_buys_a_pass(defective: tuple[Trace, str, int], variant: str) -> None:
    trace, prompt_id, position = defective
    result = gate_candidate(self_reports(trace, prompt_id, position)[variant]).result
    assert result.exit_code == 1
    assert any(d.prompt_id == prompt_id and d.position == position and d.cls == "defect" for d in result.divergences)


def test_the_reason_names_the_first_defect(defective: tuple[Trace, str, int]) -> None:
    trace, prompt_id, position = defective
    reason = failure_reason(gate_candidate(trace).result)
    assert reason.startswith(f"fail: first defect at prompt {prompt_id!r} position {position} (oracle token ")


def test_an_honest_trace_passes_and_an_oracle_trace_is_refused() -> None:
    pin = default_pin_trace()
    assert gate_candidate(honest_candidate(pin)).result.verdict == "strict_pass"
    with pytest.raises(InputError, match="expected a candidate trace, found role 'oracle'"):
        gate_candidate(pin)


def test_a_bad_threshold_is_refused_before_any_work(defective: tuple[Trace, str, int]) -> None:
    with pytest.raises(InputError, match="--near-tie-mnats: must be a number >= 0"):
        gate_candidate(defective[0], overrides=Overrides(near_tie_mnats=-1.0))
