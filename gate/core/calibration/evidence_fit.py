"""Calibrating the evidence rule: its three quantities measured over a candidate run, and
the evidence doctrine they support (`gate.core.verdict.doctrine.Evidence`).

Pure functions over two traces (no I/O, no torch). Everything is in the rule's noise
units: steps of the dtype's grid at max(|oracle top logit|, `floor_logit`), so it needs the
oracle's raw logits (`token_logits`, which `gate pin record` keeps) and the candidate's
top-k at its flips (`gate run` and `gate calibrate` record them).

- `u_o` at each flip: the oracle's gap to the candidate's token, (L[o] - L[c]) / unit;
- `u_c` at each flip: the candidate's own margin for its token, (C[c] - C[o]) / unit;
- the run's drift: |swing| of the oracle's top-1-minus-top-2 difference wherever the
  candidate shares the oracle's context (`gate.core.verdict.evidence.run_drift`); the
  rule bounds its median.

The recommendation is the smallest whole-unit limits that ratify every honest flip the
sample shows (each at least one unit), and a drift limit at the measured median rounded
up to a whole unit: the sample is presumed honest, as for the thresholds in mnats.
"""

from __future__ import annotations

import math

from gate.core.calibration.stats import Distribution, EvidenceCalibration, fmt_num
from gate.core.traces.trace import Trace
from gate.core.verdict.doctrine import DEFAULT_FLOOR_LOGIT, Evidence
from gate.core.verdict.evidence import (
    MIN_DRIFT_POSITIONS,
    candidate_margin,
    flip_top,
    run_drift,
    step_at,
)
from gate.core.verdict.grid import grid_step
from gate.core.verdict.result import Divergence

# Fewer measured flips than this and the limits rest on too little (confidence "low").
MIN_FLIPS_FOR_CONFIDENCE = 5


def _whole_units(x: float | None) -> float:
    """A limit in whole units covering `x`, at least one (a limit of 0 ratifies nothing)."""
    return max(1.0, float(math.ceil((x or 0.0) - 1e-9)))


def measure_evidence(
    oracle: Trace,
    candidate: Trace,
    flips: list[Divergence],
    *,
    dtype: str,
    floor_logit: float = DEFAULT_FLOOR_LOGIT,
) -> EvidenceCalibration:
    """The evidence rule's quantities over `candidate` against `oracle`, at the flips
    `flips` (divergences of an adjudication of the two), and the rule they support."""
    rule = Evidence(oracle_ulps=0.0, candidate_ulps=0.0, drift_ulps=0.0, floor_logit=floor_logit)

    def unit(value: float) -> float:
        return grid_step(rule.unit_logit(value), dtype)

    orc, cand = oracle.by_id(), candidate.by_id()
    positive = [d for d in flips if d.oracle_minus_candidate_mnats is not None and d.oracle_minus_candidate_mnats > 0]
    u_o: list[float] = []
    u_c: list[float] = []
    for d in positive:
        o, c = orc[d.prompt_id], cand[d.prompt_id]
        step = step_at(o, d.position, unit)
        if step is None or d.candidate_token is None or d.candidate_logprob is None or d.oracle_logprob is None:
            continue
        top = flip_top(c, d.position, d.source, len(o.token_ids), candidate.path)
        margin = candidate_margin(top, d.oracle_token, d.candidate_token, step)
        if margin is None:
            continue
        u_o.append((d.oracle_logprob - d.candidate_logprob) / step)
        u_c.append(margin)
    drift = run_drift(oracle, candidate, unit)
    oracle_gaps, margins = Distribution.of(u_o), Distribution.of(u_c)
    with_logits = any(step_at(r, i, unit) is not None for r in oracle.records for i in range(len(r.token_ids)))
    reasons: list[str] = []
    if not with_logits:
        reasons.append(
            "the oracle recorded no raw logits (token_logits): the evidence rule's unit cannot be known, "
            "so no evidence doctrine is recommended"
        )
        return EvidenceCalibration(
            floor_logit, len(positive), 0, oracle_gaps, margins, drift, None, "none", tuple(reasons)
        )
    oracle_ulps, candidate_ulps = _whole_units(oracle_gaps.max), _whole_units(margins.max)
    drift_ulps = _whole_units(drift.median_ulps)
    unit_name = f"units (the {dtype} grid step at max(|top logit|, {fmt_num(floor_logit)}))"
    if u_o:
        reasons.append(
            f"at {len(u_o)} of {len(positive)} flips with both sides' evidence the oracle's gap was at most "
            f"{oracle_gaps.max:.2f} {unit_name} and the candidate's own margin at most {margins.max:.2f}: "
            f"oracle_ulps {fmt_num(oracle_ulps)} and candidate_ulps {fmt_num(candidate_ulps)} ratify every one"
        )
    else:
        reasons.append(
            f"no flip with both sides' evidence ({len(positive)} flips with a positive gap): the flip limits "
            "stay at one unit each"
        )
    if drift.median_ulps is not None:
        judged = (
            "" if drift.judged else f" (only {drift.positions} positions: below {MIN_DRIFT_POSITIONS} it is not judged)"
        )
        reasons.append(
            f"the run's drift over {drift.positions} positions sharing the oracle's context: median "
            f"{drift.median_ulps:.2f}, p90 {drift.p90_ulps or 0.0:.2f} units{judged}; drift_ulps "
            f"{fmt_num(drift_ulps)} holds this run"
        )
    else:
        reasons.append("the candidate's top-k never shared the oracle's context: the drift could not be measured")
    reasons.append("the sample is presumed honest: calibrate against candidates you trust, on more than one machine")
    low = len(u_o) < MIN_FLIPS_FOR_CONFIDENCE or not drift.judged
    if low:
        reasons.append(
            f"confidence low: {len(u_o)} measured flips (fewer than {MIN_FLIPS_FOR_CONFIDENCE} rest on too "
            f"little) and {drift.positions} drift positions"
        )
    recommended = Evidence(
        oracle_ulps=oracle_ulps, candidate_ulps=candidate_ulps, drift_ulps=drift_ulps, floor_logit=floor_logit
    )
    return EvidenceCalibration(
        floor_logit,
        len(positive),
        len(u_o),
        oracle_gaps,
        margins,
        drift,
        recommended,
        "low" if low else "high",
        tuple(reasons),
    )
