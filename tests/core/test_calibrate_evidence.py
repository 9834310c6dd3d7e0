"""`gate calibrate` measures the evidence rule's quantities (oracle gap and own margin at each
flip, the run's drift, in the rule's units) and recommends an evidence doctrine. Hand-built
traces (every top logit 20.0: one unit is one bf16 step, 0.125 nats), pure (no torch)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
from helpers.gate_cli import invoke
from test_evidence import STEP, cand_rec, honest_position, oracle_rec, top, trace

from gate.core.calibration.calibrate import calibrate
from gate.core.calibration.evidence_fit import measure_evidence
from gate.core.verdict.adjudicate import compare
from gate.core.verdict.doctrine import Doctrine, Evidence
from gate.core.verdict.evidence import MIN_DRIFT_POSITIONS


def flip_run(n: int, gap_steps: float, margin_steps: float, swing_steps: float = 0.0) -> tuple[Any, Any]:
    """n positions; the candidate flips at the last one, where the oracle's gap to its token is
    `gap_steps` and its own margin `margin_steps`; elsewhere it holds the runner-up
    `swing_steps` closer than the oracle does."""
    tops = [honest_position(i) for i in range(n)]
    last = n - 1
    tops[last] = top((100 + last, -0.25), (500 + last, -0.25 - gap_steps * STEP), (900 + last, -3.0))
    ctops = [top((100 + i, -0.25), (500 + i, -0.25 - (2 - swing_steps) * STEP), (900 + i, -3.0)) for i in range(last)]
    ctops.append(top((500 + last, -0.25), (100 + last, -0.25 - margin_steps * STEP), (900 + last, -3.0)))
    o = oracle_rec("p", tops)
    ids = [*o.token_ids[:last], 500 + last]
    return trace("oracle", [o]), trace("candidate", [cand_rec("p", ids, ctops)])


def test_the_three_quantities_are_measured_in_units() -> None:
    o, c = flip_run(MIN_DRIFT_POSITIONS + 4, gap_steps=2.5, margin_steps=1.5, swing_steps=0.5)
    flips = list(compare(o, c, Doctrine()).divergences)
    ev = measure_evidence(o, c, flips, dtype="bfloat16")
    assert (ev.flips, ev.measured_flips) == (1, 1)
    assert ev.oracle_gap_units.max == 2.5 and ev.own_margin_units.max == 1.5
    assert ev.drift.judged and ev.drift.median_ulps == 0.5
    # The smallest whole-unit limits that ratify the flip, each at least one unit.
    assert ev.recommended == Evidence(oracle_ulps=3.0, candidate_ulps=2.0, drift_ulps=1.0)
    # RED for a rule that rounds down or uses a limit below the measurement: the recommended
    # doctrine ratifies the very flip it was measured on.
    result = compare(o, c, Doctrine(near_tie_mnats=0.0, evidence=ev.recommended))
    assert result.counts["near_ties"] == 1 and result.counts["defects"] == 0


def test_a_short_run_says_its_drift_is_not_judged_and_its_confidence_is_low() -> None:
    o, c = flip_run(4, gap_steps=1.0, margin_steps=0.5)
    ev = measure_evidence(o, c, list(compare(o, c, Doctrine()).divergences), dtype="bfloat16")
    assert not ev.drift.judged and ev.confidence == "low"
    assert any("it is not judged" in r for r in ev.reasons)


def test_without_oracle_logits_no_evidence_doctrine_is_recommended() -> None:
    o, c = flip_run(MIN_DRIFT_POSITIONS + 1, gap_steps=1.0, margin_steps=0.5)
    o = replace(o, records=tuple(replace(r, token_logits=None) for r in o.records))
    ev = measure_evidence(o, c, list(compare(o, c, Doctrine()).divergences), dtype="bfloat16")
    assert ev.recommended is None and ev.confidence == "none"


def test_calibrate_reports_the_evidence_doctrine_and_its_verdict(tmp_path: Path) -> None:
    o, c = flip_run(MIN_DRIFT_POSITIONS + 4, gap_steps=2.5, margin_steps=1.5, swing_steps=0.5)
    cal = calibrate(o, c)
    assert cal.evidence is not None and cal.evidence.recommended is not None
    assert cal.verdicts is not None and cal.verdicts.evidence == "ratified_pass"
    # Through the command: JSON and the rich report both carry it.
    paths = []
    for t, name in ((o, "o.jsonl"), (c, "c.jsonl")):
        head = {"gate_trace": 1, "role": t.role, "model": "m", "top_k": 3, "engine": {"name": "e", "version": "1"}}
        lines = [orjson.dumps(head), *(orjson.dumps(r.to_dict()) for r in t.records)]
        (tmp_path / name).write_bytes(b"\n".join(lines) + b"\n")
        paths.append(str(tmp_path / name))
    r = invoke(["calibrate", *paths, "--format", "json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["evidence"]["recommended"] == {
        "oracle_ulps": 3.0,
        "candidate_ulps": 2.0,
        "drift_ulps": 1.0,
        "floor_logit": 16.0,
    }
    assert out["evidence"]["oracle_gap_units"]["max"] == 2.5
    r = invoke(["calibrate", *paths])
    assert r.exit_code == 0, r.output
    text = " ".join(r.stdout.split())
    assert 'Recommended evidence doctrine: "evidence": {"oracle_ulps": 3, "candidate_ulps": 2, "drift_ulps": 1' in text
