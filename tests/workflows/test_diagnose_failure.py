"""What a failed gate points `gate diagnose` to, and what the diagnosis says when no point
passes the location threshold (pure: no model loads; the default pin's own oracle against a
candidate built from it)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import failing_run

from gate.core.diagnosis.capture import DECODE, PREFILL
from gate.core.diagnosis.metric import MARGIN, METRIC
from gate.core.diagnosis.record import Diagnosis, GateFailure, LayerError, PathFinding
from gate.core.pins.pin import load_pin
from gate.core.traces.reader import read_trace
from gate.core.verdict.result import DEFECT, FAIL
from gate.workflows.diagnose.failure import DISTRIBUTION, failure_of


def test_a_failure_by_the_distribution_alone_points_to_its_largest_kl(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every list a little sharper, no token changed: the gate fails by its distribution with
    nothing diverged; diagnose is pointed at the position of the largest KL, and told why."""
    monkeypatch.setattr(failing_run, "DEFECT_PROMPTS", 0)
    monkeypatch.setattr(failing_run, "NEAR_TIE_PROMPTS", 0)
    result = failing_run.failing_result(tmp_path)
    assert result.verdict == FAIL and not result.divergences
    pin = load_pin(failing_run.MODEL)
    candidate = read_trace(tmp_path / "candidate.jsonl", role="candidate")
    target, failure = failure_of(pin, result, candidate)
    assert target is not None and failure is not None
    assert target.source == DISTRIBUTION and target.path == DECODE
    assert result.distribution is not None
    figures = ", ".join(result.distribution.beyond_figures)
    assert failure.reasons == (f"its distribution is beyond the honest floor: {figures}",)
    assert failure.chosen.startswith("the position of its largest KL, ")
    # The position is the largest KL's: no other position of the run has a larger one.
    from gate.core.verdict.distribution import points

    pts = points(pin.trace, candidate, {p.id: p.outcomes for p in result.prompts})
    largest = max(p.kl_mnats for p in pts)
    at = next(p for p in pts if (p.prompt_id, p.position) == (target.prompt_id, target.position))
    assert at.kl_mnats == largest


def test_a_failure_with_defects_points_to_its_first_defect(tmp_path: Path) -> None:
    result = failing_run.failing_result(tmp_path)
    pin = load_pin(failing_run.MODEL)
    candidate = read_trace(tmp_path / "candidate.jsonl", role="candidate")
    target, failure = failure_of(pin, result, candidate)
    assert target is not None and failure is not None and target.divergence_class == DEFECT
    defects = result.counts["defects"]
    assert failure.reasons[0] == f"{defects} defects" and failure.chosen == "its first defect"
    assert any(r.startswith("its distribution is beyond the honest floor") for r in failure.reasons)


def row(layer: int, part: str, ratio: float) -> LayerError:
    module = f"model.layers.{layer}.{part}"
    return LayerError(layer, part, module, ratio * 0.01, 0.01, ratio, 3)


def diagnosis(failure: GateFailure | None, *, first: bool = False, path: str = DECODE) -> Diagnosis:
    decode = (row(0, "mlp", 1.2), row(9, "mlp", 2.0), row(9, "self_attn", 1.1), row(12, "mlp", 1.9))
    prefill = (row(0, "mlp", 1.1), row(9, "mlp", 1.8), row(20, "mlp", 5.0 if first else 1.0))
    mine, theirs = (decode, prefill) if path == DECODE else (prefill, decode)
    other = DECODE if path == PREFILL else PREFILL
    mine_first = next((e for e in mine if e.ratio > MARGIN), None)
    theirs_first = next((e for e in theirs if e.ratio > MARGIN), None)
    return Diagnosis(
        prompt_id="p1",
        position=4,
        source="free_run",
        path=path,
        finding=PathFinding(path, mine, mine_first),
        other=PathFinding(other, theirs, theirs_first),
        margin=MARGIN,
        metric=METRIC,
        prompt_length=3,
        context_length=7,
        layer_count=30,
        gate_failure=failure,
    )


DIFFUSE = GateFailure(("its distribution is beyond the honest floor: mean KL 2.282 mnats > 2.088",),
                      "the position of its largest KL, 31.000 mnats", DECODE)  # fmt: skip


def test_a_failed_gate_that_no_point_locates_is_said_to_be_diffuse_with_its_ranked_excursions() -> None:
    d = diagnosis(DIFFUSE)
    s = d.summary
    assert s.startswith("the gate failed (its distribution is beyond the honest floor: mean KL 2.282 mnats > 2.088)")
    assert "no point leaves the honest band by more than 4× on the decode or prefill path" in s
    assert "a diffuse failure, through the decode path (the position of its largest KL" in s
    assert s.endswith("largest excursions: 2.0× at layer 9, mlp (decode), 1.9× at layer 12, mlp (decode), "
                      "1.8× at layer 9, mlp (prefill)")  # fmt: skip
    ranked = d.to_dict()["excursions"]
    assert [(e["path"], e["layer"], e["ratio"]) for e in ranked] == [
        (DECODE, 9, 2.0), (DECODE, 12, 1.9), (PREFILL, 9, 1.8), (DECODE, 0, 1.2), (DECODE, 9, 1.1)]  # fmt: skip
    assert d.to_dict()["gate_failure"]["path"] == DECODE
    assert d.exit_code == 0  # nothing located: the exit code is the rule's; the words are not "nothing is wrong"
    assert "nothing leaves the honest band" not in s


def test_without_a_failed_gate_the_summary_is_the_rules_own_line() -> None:
    s = diagnosis(None).summary
    assert s.startswith("nothing leaves the honest band by more than 4× on the decode path (largest: 2.0×")


def test_a_failure_through_a_path_the_capture_does_not_reach_says_so() -> None:
    """A plugin with capture_activations is seen on the prefill path only: a failure that came
    through the decode path is not called diffuse; the diagnosis says what would reach it."""
    d = diagnosis(GateFailure(("161 defects",), "its first defect", DECODE), path=PREFILL)
    d = Diagnosis(**{**{f: getattr(d, f) for f in Diagnosis.__slots__}, "other": None})  # type: ignore[arg-type]
    s = d.summary
    assert "its failure came through the decode path, which this capture does not reach" in s
    assert "capture_path" in s and "diffuse" not in s


def test_a_located_point_keeps_the_rules_line_and_still_ranks() -> None:
    d = diagnosis(DIFFUSE, first=True, path=PREFILL)
    assert d.summary.startswith("enters at layer 20, mlp, prefill path: 5.0× the honest band")
    assert d.to_dict()["excursions"][0]["ratio"] == 5.0 and d.exit_code == 1
