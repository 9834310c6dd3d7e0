"""Where the float32 rounding slack comes from, rule by rule: the run's drift takes it from the
oracle's top two logprobs at each measured position (the largest over the run, two roundings
per swing, in that position's units), and the goldens' own-margin move takes it from the new
run's two logprobs only up to the size a greedy token's logprob can have. A candidate that
reports its logprobs at a huge magnitude (where one float32 step is wider) buys no slack."""

from __future__ import annotations

import struct
from typing import Any

from gate.core.traces.trace import PromptRecord, Trace, TraceHeader
from gate.core.verdict.doctrine import Evidence
from gate.core.verdict.evidence import MIN_DRIFT_POSITIONS, own_margin, run_drift, summarise
from gate.core.verdict.grid import grid_step, logprob_slack

LOGIT, STEP = 20.0, 0.125  # bf16 at |logit| 20: a grid step (and the evidence unit) is 0.125 nats
OLD, NEW = 5, 7


def f32(x: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", x))[0])


def next32_down(x: float) -> float:
    """The float32 one ulp below float32 `x` (x < 0)."""
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    return float(struct.unpack("<f", struct.pack("<I", bits + 1))[0])


def bf16(value: float) -> float:
    return grid_step(value, "bfloat16")


def _trace(role: str, records: list[PromptRecord]) -> Trace:
    header = TraceHeader(role=role, model="m", top_k=4, engine={"name": role, "version": "1"})
    return Trace(header=header, records=tuple(records), path=f"<{role}>")


def _drift_runs(shift: float) -> tuple[Trace, Trace, float]:
    """An oracle whose top two logprobs sit near -0.25 except at one middle position (near -5),
    each list ending in a far-down entry at -30; the candidate's lists hold the same gaps
    shifted by `shift` nats. Returns the traces and the slack the oracle's values owe."""
    n = MIN_DRIFT_POSITIONS + 4
    tops: list[list[list[Any]]] = []
    for i in range(n):
        a = -5.0 if i == n // 2 else -0.25
        tops.append([[100 + i, a], [500 + i, a - 2 * STEP], [900 + i, -30.0]])
    oracle = PromptRecord(
        id="p",
        prompt_token_ids=(1, 2, 3),
        token_ids=tuple(100 + i for i in range(n)),
        top_logprobs=tops,
        extra={"token_logits": [LOGIT] * n},
    )
    own = [[[t, lp + shift] for t, lp in pos] for pos in tops]
    cand = PromptRecord(id="p", prompt_token_ids=(1, 2, 3), token_ids=oracle.token_ids, top_logprobs=own)
    owed = 2.0 * logprob_slack(-5.0, -5.0 - 2 * STEP) / STEP
    return _trace("oracle", [oracle]), _trace("candidate", [cand]), owed


def test_the_drift_slack_is_the_oracle_s_largest_top_two_rounding_in_units() -> None:
    oracle, candidate, owed = _drift_runs(0.0)
    drift = run_drift(oracle, candidate, bf16, limit_ulps=2.0)
    assert drift.positions == MIN_DRIFT_POSITIONS + 4 and drift.median_ulps == 0.0
    # The largest over the run (the middle position), not the first or the last; two roundings
    # of its top two (not of the -30 entry further down its list), in units of its grid step.
    assert drift.slack_ulps == owed
    assert owed > 2.0 * logprob_slack(-0.25, -0.5) / STEP and owed < 2.0 * logprob_slack(-30.0) / STEP


def test_a_candidate_reporting_huge_logprobs_buys_no_drift_slack() -> None:
    oracle, candidate, owed = _drift_runs(-1e6)
    drift = run_drift(oracle, candidate, bf16, limit_ulps=2.0)
    assert drift.median_ulps == 0.0  # the same gaps: no swing
    assert drift.slack_ulps == owed  # the oracle's values decide, not the candidate's at 1e6
    # The slack reaches the verdict: drift at the limit plus the owed rounding is within it.
    at_limit = summarise([2.0 + owed] * MIN_DRIFT_POSITIONS, 2.0, slack_ulps=drift.slack_ulps)
    assert not at_limit.beyond


# --------------------------------------------------------------------------- the goldens' own margin

EV = Evidence(oracle_ulps=4.0, candidate_ulps=1.0, drift_ulps=2.0)


def _new_run(lp_new: float, lp_old: float) -> PromptRecord:
    top = [[NEW, lp_new], [OLD, lp_old], [9, lp_old - 30.0]]
    return PromptRecord(
        id="p", prompt_token_ids=(1, 2, 3), token_ids=(NEW,), top_logprobs=[top], extra={"token_logits": [LOGIT]}
    )


def _margin(lp_new: float, lp_old: float) -> float | None:
    return own_margin(_new_run(lp_new, lp_old), 0, OLD, NEW, "bfloat16", EV, None)


def test_an_own_margin_at_its_limit_stays_a_near_tie_when_one_logprob_reads_one_ulp_low() -> None:
    new = f32(-0.7)
    old = f32(new - EV.candidate_ulps * STEP)
    assert new - old == EV.candidate_ulps * STEP
    assert _margin(new, old) == EV.candidate_ulps
    low = next32_down(old)  # one float32 rounding further: the same honest tie
    assert new - low > EV.candidate_ulps * STEP
    assert _margin(new, low) is not None


def test_an_own_margin_beyond_its_limit_buys_no_slack_from_huge_own_logprobs() -> None:
    # At |logprob| 100 one float32 step is 2**-17 nats (the widest the grid takes): beyond the
    # limit by that much is far more than a greedy token's logprob (|lp| < 16) is rounded by.
    new = -100.0
    old = new - EV.candidate_ulps * STEP - logprob_slack(new)
    assert f32(old) == old and logprob_slack(new) == 2.0**-17
    assert _margin(new, old) is None
    assert _margin(-0.7, -0.7 - 1.5 * STEP) is None  # plainly beyond: never a near tie
