"""Adjudication: the seed case, the class boundaries, forced data, input errors, and proof
that the checks catch a wrong tie-break, gap or rank rule (mutants of `classify`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from helpers.trace_builders import (
    SEED_CANDIDATE,
    SEED_ORACLE,
    candidate_record,
    filler,
    mixed_records,
    oracle_record,
    position,
    write_pair,
)

import gate.core.verdict.adjudicate as adjudicate
from gate.core.traces.reader import read_trace
from gate.core.verdict.adjudicate import compare
from gate.core.verdict.chain import PositionEvidence
from gate.core.verdict.doctrine import Doctrine
from gate.core.verdict.result import (
    DEFECT,
    EXACT_TIE,
    FAIL,
    FORCED,
    FREE_RUN,
    NEAR_TIE,
    RATIFIED_PASS,
    STRICT_PASS,
    Divergence,
    GateResult,
)
from gate.errors import InputError

SEED_SUMMARY = "6/7 prompts strict 16/16, 108/112 positions; 7/7 ratified (1 exact tie, 0 near ties, 0 defects)"


def seed(doctrine: Doctrine | None = None) -> GateResult:
    return compare(read_trace(SEED_ORACLE), read_trace(SEED_CANDIDATE), doctrine or Doctrine())


def gate_files(
    folder: Path, oracle: list[dict[str, Any]], candidate: list[dict[str, Any]], doctrine: Doctrine | None = None
) -> GateResult:
    o, c = write_pair(folder, oracle, candidate)
    return compare(read_trace(o), read_trace(c), doctrine or Doctrine())


def one_position(
    folder: Path, top: list[list[Any]], candidate_token: int | None, doctrine: Doctrine | None = None
) -> Divergence:
    """The divergence at position 1 of a 3-position prompt whose middle list is `top`."""
    tops = [filler(100), top, filler(102)]
    o = oracle_record("p", tops)
    tokens = [100] if candidate_token is None else [100, candidate_token, 102]
    result = gate_files(folder, [o], [candidate_record("p", tokens)], doctrine)
    (d,) = result.divergences
    assert d.position == 1
    return d


# --------------------------------------------------------------------------- the checks


def check_seed() -> None:
    result = seed()
    assert result.counts == {
        "prompts": 7,
        "strict_pass": 6,
        "ratified_pass": 7,
        "positions": 112,
        "positions_matched": 108,
        "unadjudicated_positions": 8,
        "exact_ties": 1,
        "near_ties": 0,
        "defects": 0,
        "not_judged_for_want_of_evidence": 0,
    }
    (d,) = result.divergences
    assert (d.prompt_id, d.position, d.source) == ("p6", 7, FREE_RUN)
    assert (d.oracle_token, d.candidate_token) == (464, 1445)
    assert d.cls == EXACT_TIE
    assert d.top2_gap_mnats == 0.0
    assert d.oracle_minus_candidate_mnats == 0.0
    assert d.gap_lower_bound_mnats is None
    assert d.candidate_rank == 2
    assert d.tie_break == "higher_id"
    assert d.oracle_logprob == d.candidate_logprob == -0.8293954133987427
    assert result.verdict == RATIFIED_PASS and result.exit_code == 0
    assert result.summary == SEED_SUMMARY
    assert seed(Doctrine(strict=True)).exit_code == 1
    p6 = result.prompts[6]
    assert (p6.strict, p6.ratified, p6.first_divergence, p6.positions_matched) == (False, True, 7, 12)


def check_boundaries(folder: Path) -> None:
    # -0.5 vs -0.625 is 125.0 mnats exactly: at the threshold, a near tie.
    at = one_position(folder, position(50, (51, -0.625), (52, -2.0)), 51)
    assert at.oracle_minus_candidate_mnats == 125.0
    assert at.cls == NEAR_TIE and at.tie_break is None and at.candidate_rank == 2
    # One float32 step further (the rounding of a float32 logprob): still within the
    # threshold, which allows one float32 rounding of the two logprobs compared ...
    below = -0.625 - 2.0**-24
    past = one_position(folder, position(50, (51, below), (52, -2.0)), 51)
    assert past.oracle_minus_candidate_mnats is not None and past.oracle_minus_candidate_mnats > 125.0
    assert past.cls == NEAR_TIE
    # ... and a float step beyond that allowance: a defect.
    beyond = math.nextafter(-0.625 - 2.0**-23, -math.inf)
    past = one_position(folder, position(50, (51, beyond), (52, -2.0)), 51)
    assert past.cls == DEFECT
    # One float step from a tie is not a tie: bit for bit or nothing.
    hair = one_position(folder, position(50, (51, math.nextafter(-0.5, -math.inf)), (52, -2.0)), 51)
    assert hair.cls == NEAR_TIE and 0.0 < hair.oracle_minus_candidate_mnats < 1e-9  # type: ignore[operator]
    assert hair.tie_break is None
    # A threshold of 0 leaves exact ties only.
    zero = one_position(folder, position(50, (51, -0.625)), 51, Doctrine(near_tie_mnats=0.0))
    assert zero.cls == DEFECT
    tie0 = one_position(folder, position(50, (51, -0.5)), 51, Doctrine(near_tie_mnats=0.0))
    assert tie0.cls == EXACT_TIE


def check_gaps_and_rank(folder: Path) -> None:
    d = one_position(folder, position(60, (61, -1.0), (62, -1.5), (63, -3.0)), 62)
    assert d.oracle_minus_candidate_mnats == 1000.0  # from the oracle's token, not the runner-up
    assert d.top2_gap_mnats == 500.0
    assert d.candidate_rank == 3
    assert d.cls == DEFECT
    eq = one_position(folder, position(60, (61, -1.5), (62, -1.5), (63, -3.0)), 62)
    assert eq.candidate_rank == 3  # 60, then 61 before 62 at equal logprobs (lowest id first)
    low = one_position(folder, position(70, (61, -0.5), (80, -0.5)), 80)  # oracle 61 at the tie
    assert (low.oracle_token, low.tie_break, low.candidate_rank) == (61, "higher_id", 3)
    lower = one_position(folder, position(70, (61, -0.5625), (75, -0.5625)), 61)
    assert lower.candidate_rank == 2 and lower.cls == NEAR_TIE


def check_outside_and_stopped(folder: Path) -> None:
    out = one_position(folder, position(50, (51, -1.0), (52, -4.5)), 999)
    assert out.cls == DEFECT
    assert out.oracle_minus_candidate_mnats is None and out.candidate_rank is None and out.tie_break is None
    assert out.gap_lower_bound_mnats == 4000.0
    stopped = one_position(folder, position(50, (51, -1.0), (52, -4.5)), None)
    assert stopped.candidate_token is None and stopped.cls == DEFECT
    assert stopped.candidate_rank is None and stopped.oracle_minus_candidate_mnats is None


def check_forced(folder: Path) -> None:
    oracle, cand = mixed_records()
    result = gate_files(folder, oracle, cand)
    forced = next(p for p in result.prompts if p.id == "forced")
    divs = [d for d in result.divergences if d.prompt_id == "forced"]
    assert [(d.position, d.source, d.cls) for d in divs] == [(1, FREE_RUN, EXACT_TIE), (6, FORCED, DEFECT)]
    assert divs[1].forced_mode == "decode"
    assert not forced.ratified and forced.unadjudicated == 0
    assert result.verdict == FAIL and result.exit_code == 1


CHECKS: list[Callable[..., None]] = [
    check_seed,
    check_boundaries,
    check_gaps_and_rank,
    check_outside_and_stopped,
    check_forced,
]


def run_all_checks(folder: Path) -> None:
    for i, check in enumerate(CHECKS):
        sub = folder / str(i)
        sub.mkdir(exist_ok=True)
        if check is check_seed:
            check()
        else:
            check(sub)


@pytest.mark.parametrize("check", CHECKS, ids=[c.__name__ for c in CHECKS])
def test_classifier(tmp_path: Path, check: Callable[..., None]) -> None:
    if check is check_seed:
        check()
    else:
        check(tmp_path)


# --------------------------------------------------------------------------- mutants

Classify = Callable[..., Divergence]
_real_classify: Classify = adjudicate.classify


def _tie_break_reversed(ev: PositionEvidence, doctrine: Doctrine) -> Divergence:
    d = _real_classify(ev, doctrine)
    flip = {"lower_id": "higher_id", "higher_id": "lower_id"}
    return replace(d, tie_break=flip.get(d.tie_break)) if d.tie_break else d


def _tie_within_tolerance(ev: PositionEvidence, doctrine: Doctrine) -> Divergence:
    # "equal enough": a tie within 1e-6 mnats instead of bit for bit
    d = _real_classify(ev, doctrine)
    gap = d.oracle_minus_candidate_mnats
    if d.cls == NEAR_TIE and gap is not None and gap < 1e-6:
        assert d.candidate_token is not None
        tb = "lower_id" if d.candidate_token < d.oracle_token else "higher_id"
        return replace(d, cls=EXACT_TIE, tie_break=tb)
    return d


def _threshold_exclusive(ev: PositionEvidence, doctrine: Doctrine) -> Divergence:
    # gap < threshold instead of gap <= threshold
    d = _real_classify(ev, doctrine)
    if d.cls == NEAR_TIE and d.oracle_minus_candidate_mnats == doctrine.near_tie_mnats:
        return replace(d, cls=DEFECT)
    return d


def _gap_in_nats(ev: PositionEvidence, doctrine: Doctrine) -> Divergence:
    # forgot the x1000: gaps in nats judged against a threshold in mnats
    d = _real_classify(ev, doctrine)
    gap = d.oracle_minus_candidate_mnats
    if gap is None or d.cls == EXACT_TIE:
        return d
    gap /= 1000.0
    return replace(d, oracle_minus_candidate_mnats=gap, cls=NEAR_TIE if gap <= doctrine.near_tie_mnats else DEFECT)


def _rank_highest_id_first(ev: PositionEvidence, doctrine: Doctrine) -> Divergence:
    # ties ranked by the highest id first (the candidate's rule, not torch.argmax's)
    d = _real_classify(ev, doctrine)
    if d.candidate_rank is None or d.candidate_logprob is None:
        return d
    c, lp = d.candidate_token, d.candidate_logprob
    assert c is not None
    rank = 1 + sum(1 for t, v in ev.top if v > lp or (v == lp and t > c))
    return replace(d, candidate_rank=rank)


def _gap_from_top1(ev: PositionEvidence, doctrine: Doctrine) -> Divergence:
    # oracle_minus_candidate measured from the list's head rather than from the oracle's token
    d = _real_classify(ev, doctrine)
    if d.oracle_minus_candidate_mnats is None or d.candidate_logprob is None:
        return d
    return replace(d, oracle_minus_candidate_mnats=d.top2_gap_mnats)


def _stopped_is_ratified(ev: PositionEvidence, doctrine: Doctrine) -> Divergence:
    d = _real_classify(ev, doctrine)
    return replace(d, cls=NEAR_TIE) if d.candidate_token is None else d


MUTANTS: dict[str, Classify] = {
    "tie-break reversed": _tie_break_reversed,
    "tie within a tolerance": _tie_within_tolerance,
    "threshold exclusive": _threshold_exclusive,
    "gap in nats": _gap_in_nats,
    "rank highest id first": _rank_highest_id_first,
    "gap from the top-1": _gap_from_top1,
    "stopping early ratified": _stopped_is_ratified,
}


def test_checks_pass_on_the_real_classifier(tmp_path: Path) -> None:
    run_all_checks(tmp_path)


@pytest.mark.parametrize("name", list(MUTANTS))
def test_checks_catch_a_wrong_rule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """The same checks, run with a deliberately wrong `classify`, must fail."""
    monkeypatch.setattr(adjudicate, "classify", MUTANTS[name])
    with pytest.raises(AssertionError):
        run_all_checks(tmp_path)


# --------------------------------------------------------------------------- counts and outcomes


def test_mixed_outcomes_and_counts(tmp_path: Path) -> None:
    result = gate_files(tmp_path, *mixed_records())
    outcomes = {p.id: p.outcomes for p in result.prompts}
    assert outcomes == {
        "strict": "mmmmmmmm",
        "tie": "mmmeuuuu",
        "near": "mmmmmnuu",
        "defect": "mmduuuuu",
        "outside": "mmmmmmdu",
        "stopped": "mmmmduuu",
        "forced": "memmmmdm",
        "prefill": "mmmmnmmm",
    }
    for p in result.prompts:
        assert len(p.outcomes) == p.positions
        assert p.outcomes.count("u") == p.unadjudicated
    assert result.counts["unadjudicated_positions"] == 4 + 2 + 5 + 1 + 3
    assert [p.id for p in result.prompts if p.ratified] == ["strict", "tie", "near", "prefill"]
    prefill = next(d for d in result.divergences if d.prompt_id == "prefill")
    assert (prefill.source, prefill.forced_mode, prefill.cls) == (FORCED, "prefill", NEAR_TIE)
    tie = next(d for d in result.divergences if d.prompt_id == "tie")
    assert (tie.oracle_text, tie.candidate_text) == ("import", "from")
    assert tie.alternatives[:2] == ((464, -0.5, "import"), (1445, -0.5, "from"))
    assert result.to_dict()["prompts"][1]["outcomes"] == "mmmeuuuu"


def test_strict_verdict_and_extra_candidate_tokens(tmp_path: Path) -> None:
    o = oracle_record("p", [filler(1), filler(2)])
    result = gate_files(tmp_path, [o], [candidate_record("p", [1, 2, 3, 4])])
    (p,) = result.prompts
    assert p.strict and p.extra_candidate_tokens == 2 and p.positions_matched == 2
    assert result.verdict == STRICT_PASS and result.exit_code == 0 and result.divergences == ()
    assert result.to_dict()["prompts"][0]["extra_candidate_tokens"] == 2


def test_a_defect_in_one_prompt_fails_the_gate_even_under_ties_elsewhere(tmp_path: Path) -> None:
    oracle, cand = mixed_records()
    keep = {"strict", "tie", "near"}
    result = gate_files(tmp_path, [r for r in oracle if r["id"] in keep], [r for r in cand if r["id"] in keep])
    assert result.verdict == RATIFIED_PASS
    keep.add("defect")
    worse = gate_files(tmp_path, [r for r in oracle if r["id"] in keep], [r for r in cand if r["id"] in keep])
    assert worse.verdict == FAIL


# --------------------------------------------------------------------------- input errors


def test_missing_prompt_is_an_input_error(tmp_path: Path) -> None:
    o = [oracle_record("a", [filler(1)]), oracle_record("b", [filler(2)])]
    with pytest.raises(InputError, match=r"missing prompt\(s\) 'b'"):
        gate_files(tmp_path, o, [candidate_record("a", [1])])


def test_extra_prompt_is_an_input_error(tmp_path: Path) -> None:
    o = [oracle_record("a", [filler(1)])]
    with pytest.raises(InputError, match=r"'zz' are not in the oracle"):
        gate_files(tmp_path, o, [candidate_record("a", [1]), candidate_record("zz", [1])])


def test_prompt_token_mismatch_is_an_input_error_not_a_divergence(tmp_path: Path) -> None:
    o = [oracle_record("a", [filler(1)])]
    c = candidate_record("a", [1])
    c["prompt_token_ids"] = [11, 12, 14]
    with pytest.raises(InputError, match=r"prompt 'a': prompt_token_ids differ at index 2 \(oracle 13, candidate 14"):
        gate_files(tmp_path, o, [c])


def test_forced_ids_of_the_wrong_length_are_an_input_error(tmp_path: Path) -> None:
    o = [oracle_record("a", [filler(1), filler(2)])]
    with pytest.raises(InputError, match="forced_token_ids has 1 entries"):
        gate_files(tmp_path, o, [candidate_record("a", [1, 2], forced_token_ids=[1])])


def test_roles_are_checked(tmp_path: Path) -> None:
    o, c = write_pair(tmp_path, [oracle_record("a", [filler(1)])], [candidate_record("a", [1])])
    with pytest.raises(InputError, match="expected an oracle trace"):
        compare(read_trace(c), read_trace(c))
    with pytest.raises(InputError, match="expected a candidate trace"):
        compare(read_trace(o), read_trace(o))
