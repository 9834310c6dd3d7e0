"""No rule's decision moves on one float32 rounding: every rule that compares a gap with a
limit (the mnats threshold, the grid steps, the evidence rule's oracle gap and own margin,
the run's drift) allows one float32 rounding of the logprobs compared, taken from the
oracle's values, and no more. A gap at a limit stays ratified when either of its two
logprobs moves by one float32 ulp; a gap beyond the limit by more than that slack stays a
defect, whatever magnitudes the candidate reports in its own lists."""

from __future__ import annotations

import math
import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from gate.core.verdict.chain import decide, position_evidence
from gate.core.verdict.doctrine import Doctrine, Evidence
from gate.core.verdict.evidence import summarise
from gate.core.verdict.grid import logprob_slack
from gate.core.verdict.result import DEFECT, NEAR_TIE

ORACLE, CAND, OTHER = 5, 7, 9
LOGIT, STEP = 20.0, 0.125  # bf16 at |logit| 20: a grid step and the evidence unit are 0.125 nats
MNATS = Doctrine(near_tie_mnats=125.0)
GRID = Doctrine(near_tie_mnats=10.0, near_tie_ulps=2.0, dtype="bfloat16")
EVIDENCE = Doctrine(near_tie_mnats=10.0, near_tie_ulps=2.0, dtype="bfloat16", evidence=Evidence(4.0, 2.0, 2.0))


def f32(x: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", x))[0])


def next32(x: float, toward: float) -> float:
    """The float32 next to float32 `x` toward `toward` (one float32 ulp)."""
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    up = (toward > x) == (x >= 0)
    return float(struct.unpack("<f", struct.pack("<I", bits + (1 if up else -1)))[0])


def at_limit(o_lp: float, limit: float) -> tuple[float, float]:
    """A float32 pair (o, c) whose gap o - c is the largest float32 gap <= `limit`."""
    o = f32(o_lp)
    c = f32(o - limit)
    while o - c > limit:
        c = next32(c, 0.0)
    return o, c


def classify_pair(doctrine: Doctrine, o: float, c: float, own: tuple[float, float] | None = None) -> str:
    """The class of a flip where the oracle's list holds (ORACLE, o), (CAND, c); `own` the
    candidate's own logprobs of (CAND, ORACLE), when it reports a list."""
    top = sorted([(ORACLE, o), (CAND, c), (OTHER, -30.0)], key=lambda p: (-p[1], p[0]))
    cand_top = None
    if own is not None:
        cand_top = sorted([(CAND, own[0]), (ORACLE, own[1]), (OTHER, -30.0)], key=lambda p: (-p[1], p[0]))
    ev = position_evidence(
        prompt_id="p",
        position=0,
        source="free_run",
        top=top,
        oracle_token=ORACLE,
        candidate_token=CAND,
        doctrine=doctrine,
        top_logit=LOGIT,
        candidate_top=cand_top,
        drift=summarise([0.0] * 20, 2.0, tail_limit_ulps=4.0) if doctrine.evidence is not None else None,
    )
    return decide(ev, doctrine).cls


def test_one_bf16_grid_step_read_as_125_00012_mnats_is_within_the_125_mnat_threshold() -> None:
    o, c = -1.0, next32(-1.125, -2.0)  # 0.125 nats apart, one float32 ulp further
    assert 125.0 < 1000.0 * (o - c) < 125.0002
    assert classify_pair(MNATS, o, -1.125) == NEAR_TIE
    assert classify_pair(MNATS, o, c) == NEAR_TIE


LOGPROBS = st.floats(min_value=-12.0, max_value=-0.01, allow_nan=False)
CASES = [
    (MNATS, 0.125, None),  # the mnats threshold
    (GRID, 2 * STEP, None),  # the grid: 2 steps
    (EVIDENCE, 4 * STEP, 0.5 * STEP),  # the evidence rule's oracle gap: 4 units
]


@settings(max_examples=300, deadline=None)
@given(o_lp=LOGPROBS, case=st.sampled_from(CASES), which=st.sampled_from(["o+", "o-", "c+", "c-"]))
def test_a_gap_at_the_limit_stays_ratified_when_either_logprob_moves_one_ulp(
    o_lp: float, case: tuple[Doctrine, float, float | None], which: str
) -> None:
    doctrine, limit, margin = case
    o, c = at_limit(o_lp, limit)
    own = (o, o - margin) if margin is not None else None
    assert classify_pair(doctrine, o, c, own) == NEAR_TIE
    if which[0] == "o":
        o = next32(o, math.inf if which[1] == "+" else -math.inf)
    else:
        c = next32(c, math.inf if which[1] == "+" else -math.inf)
    if o - c > 0:
        assert classify_pair(doctrine, o, c, own) == NEAR_TIE, (o, c, 1000 * (o - c))


@settings(max_examples=300, deadline=None)
@given(o_lp=LOGPROBS, case=st.sampled_from(CASES), own_scale=st.sampled_from([1.0, 2.0, 1e3, 1e6]))
def test_beyond_the_limit_by_more_than_the_oracle_s_rounding_stays_a_defect(
    o_lp: float, case: tuple[Doctrine, float, float | None], own_scale: float
) -> None:
    doctrine, limit, margin = case
    o = f32(o_lp)
    c = f32(o - limit - 2 * logprob_slack(o, o - limit))
    # The candidate's own list at any magnitude it likes buys no more slack.
    own = (o * own_scale, o * own_scale - margin) if margin is not None else None
    assert classify_pair(doctrine, o, c, own) == DEFECT


@settings(max_examples=300, deadline=None)
@given(o_lp=LOGPROBS, which=st.sampled_from(["+", "-"]))
def test_an_own_margin_at_its_limit_stays_ratified_when_one_of_its_logprobs_moves_one_ulp(
    o_lp: float, which: str
) -> None:
    o, c = at_limit(o_lp, 3 * STEP)  # the oracle's gap within its 4 units
    own_c, own_o = at_limit(o, 2 * STEP)  # the candidate's own margin at its 2 units
    assert classify_pair(EVIDENCE, o, c, (own_c, own_o)) == NEAR_TIE
    own_o = next32(own_o, math.inf if which == "+" else -math.inf)
    if own_c - own_o > 0:
        assert classify_pair(EVIDENCE, o, c, (own_c, own_o)) == NEAR_TIE


@given(own_scale=st.sampled_from([10.0, 1e3, 1e6]))
def test_an_own_margin_beyond_its_limit_buys_no_slack_from_huge_own_logprobs(own_scale: float) -> None:
    o, c = at_limit(-0.5, 3 * STEP)
    own_c = -0.5 * own_scale
    # Beyond 2 units by far more than the oracle's rounding, within the rounding at own_c's size.
    own_o = own_c - 2 * STEP - 4 * logprob_slack(o, c)
    assert classify_pair(EVIDENCE, o, c, (own_c, own_o)) == DEFECT


def test_the_run_s_drift_at_its_limit_is_within_it_after_one_rounding() -> None:
    # Swings of exactly 2 units read one float32 rounding high: not beyond a 2-unit limit.
    swing = 2.0 + logprob_slack(-1.0, -1.5) / STEP
    drift = summarise([swing] * 20, 2.0, tail_limit_ulps=4.0, slack_ulps=2 * logprob_slack(-1.0, -1.5) / STEP)
    assert not drift.beyond, drift.beyond_where
    far = summarise([2.01] * 20, 2.0, tail_limit_ulps=4.0, slack_ulps=2 * logprob_slack(-1.0, -1.5) / STEP)
    assert far.beyond
