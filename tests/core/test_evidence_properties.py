"""Hypothesis properties of the evidence rule: monotone in each limit,
never ratifying beyond its bounds, less evidence never ratifying more, a negative reported
margin never earning an allowance. Pure: `classify` on generated positions."""

from __future__ import annotations

from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from gate.core.verdict.chain import classify, position_evidence
from gate.core.verdict.doctrine import Doctrine, Evidence
from gate.core.verdict.evidence import RunDrift
from gate.core.verdict.grid import grid_step, logprob_slack
from gate.core.verdict.result import DEFECT, EXACT_TIE, NEAR_TIE
from gate.core.verdict.rules import RULE_EVIDENCE, RULE_GRID, RULE_MNATS

ORACLE, CAND, OTHER = 5, 7, 9

steps = st.one_of(
    st.integers(min_value=0, max_value=48).map(lambda n: n / 8),  # the grid's own multiples
    st.floats(min_value=0.0, max_value=6.0, allow_nan=False),
)
margins = st.one_of(
    st.integers(min_value=-24, max_value=48).map(lambda n: n / 8),
    st.floats(min_value=-3.0, max_value=6.0, allow_nan=False),
)
logits = st.sampled_from([3.0, 7.5, 12.0, 20.0, 40.0, 70.0])
limits = st.floats(min_value=0.0, max_value=6.0, allow_nan=False)


def _top(first: tuple[int, float], *rest: tuple[int, float]) -> list[list[Any]]:
    return sorted(([t, lp] for t, lp in (first, *rest)), key=lambda p: (-p[1], p[0]))


def _case(u_o: float, u_c: float | None, logit: float, floor: float = 16.0) -> dict[str, Any]:
    unit = grid_step(max(logit, floor), "bfloat16")
    o_lp = -0.5
    c_lp = o_lp - u_o * unit
    top = _top((ORACLE, o_lp), (CAND, c_lp), (OTHER, -9.0))
    cand = None
    if u_c is not None:
        cand = _top((CAND, -0.5), (ORACLE, -0.5 - u_c * unit), (OTHER, -9.0))
    return {"top": top, "candidate_top": cand, "top_logit": logit}


def _classify(case: dict[str, Any], doctrine: Doctrine, **kw: Any) -> Any:
    evidence = position_evidence(
        prompt_id="p",
        position=0,
        source="forced",
        oracle_token=ORACLE,
        candidate_token=CAND,
        doctrine=doctrine,
        **case,
        **kw,
    )
    return classify(evidence, doctrine)


def _doctrine(mnats: float, ulps: float | None, o: float, c: float, d: float = 2.0) -> Doctrine:
    return Doctrine(near_tie_mnats=mnats, near_tie_ulps=ulps, evidence=Evidence(o, c, d))


RATIFIED = {EXACT_TIE: 1, NEAR_TIE: 1, DEFECT: 0}


@settings(max_examples=300, deadline=None)
@given(
    u_o=steps,
    u_c=st.one_of(st.none(), margins),
    logit=logits,
    mnats=st.sampled_from([0.0, 62.5, 125.0]),
    ulps=st.one_of(st.none(), limits),
    o=limits,
    c=limits,
    which=st.sampled_from(["mnats", "ulps", "oracle", "candidate"]),
    more=st.floats(min_value=0.0, max_value=4.0, allow_nan=False),
)
def test_monotone_in_each_limit(
    u_o: float,
    u_c: float | None,
    logit: float,
    mnats: float,
    ulps: float | None,
    o: float,
    c: float,
    which: str,
    more: float,
) -> None:
    """Raising any one limit never turns a ratified flip into a defect."""
    case = _case(u_o, u_c, logit)
    lo = _doctrine(mnats, ulps, o, c)
    hi = _doctrine(
        mnats + (more * 100 if which == "mnats" else 0.0),
        (ulps + more if ulps is not None else None) if which == "ulps" else ulps,
        o + (more if which == "oracle" else 0.0),
        c + (more if which == "candidate" else 0.0),
    )
    a = _classify(case, lo)
    b = _classify(case, hi)
    assert RATIFIED[b.cls] >= RATIFIED[a.cls], (a.rule, b.rule)


@settings(max_examples=300, deadline=None)
@given(
    u_o=steps, u_c=st.one_of(st.none(), margins), logit=logits, ulps=st.one_of(st.none(), limits), o=limits, c=limits
)
# The own margin's float32 slack was taken at the list's largest magnitude (an entry at -9),
# not at the two logprobs the margin is between: a margin of 1e-6 units passed a limit of 0.
@example(u_o=5 / 8, u_c=1e-06, logit=3.0, ulps=None, o=1.0, c=0.0)
def test_never_ratifies_beyond_its_bounds(
    u_o: float, u_c: float | None, logit: float, ulps: float | None, o: float, c: float
) -> None:
    """A near tie is within the bounds of the rule that ratified it, and no further."""
    case = _case(u_o, u_c, logit)
    doctrine = _doctrine(62.5, ulps, o, c)
    d = _classify(case, doctrine)
    if d.cls != NEAR_TIE:
        return
    o_lp, c_lp = -0.5, d.candidate_logprob
    gap = o_lp - c_lp
    assert gap > 0
    if d.rule == RULE_MNATS:
        assert 1000.0 * gap <= 62.5
    elif d.rule == RULE_GRID:
        assert ulps is not None and u_c is None
        assert gap <= ulps * grid_step(logit, "bfloat16") + logprob_slack(o_lp, c_lp)
    else:
        assert d.rule == RULE_EVIDENCE and d.candidate_margin_ulps is not None
        unit = grid_step(max(logit, 16.0), "bfloat16")
        assert gap <= o * unit + logprob_slack(o_lp, c_lp)
        assert (
            0.0
            <= d.candidate_margin_ulps * unit
            <= c * unit + logprob_slack(-0.5, -0.5 - abs(d.candidate_margin_ulps) * unit)
        )


@settings(max_examples=300, deadline=None)
@given(u_o=steps, u_c=margins, logit=logits, ulps=st.one_of(st.none(), limits), o=limits, c=limits)
def test_less_evidence_never_ratifies_more(
    u_o: float, u_c: float, logit: float, ulps: float | None, o: float, c: float
) -> None:
    """The same flip without its list (wherever the candidate's other lists are), or with
    an empty one, is never ratified where the flip with its list is a defect."""
    doctrine = _doctrine(62.5, ulps, o, c)
    with_list = _classify(_case(u_o, u_c, logit), doctrine)
    without = _classify(_case(u_o, None, logit), doctrine)
    empty = _classify({**_case(u_o, None, logit), "candidate_top": []}, doctrine)
    for less in (without, empty):
        assert RATIFIED[less.cls] <= RATIFIED[with_list.cls] or less.rule in (RULE_MNATS, "exact_tie"), less.rule
        if less.cls == NEAR_TIE:
            assert less.rule == RULE_MNATS


@settings(max_examples=300, deadline=None)
@given(
    u_o=steps,
    u_c=st.floats(min_value=-3.0, max_value=-(2.0**-8), allow_nan=False),
    logit=logits,
    ulps=st.one_of(st.none(), limits),
    o=limits,
    c=limits,
)
def test_a_negative_reported_margin_never_earns_an_allowance(
    u_o: float, u_c: float, logit: float, ulps: float | None, o: float, c: float
) -> None:
    """Where the candidate's own list ranks the oracle's token above the one it took, only
    the fixed mnats (which need no evidence) can ratify the flip."""
    d = _classify(_case(u_o, u_c, logit), _doctrine(62.5, ulps, o, c))
    if d.cls == NEAR_TIE:
        assert d.rule == RULE_MNATS


@settings(max_examples=200, deadline=None)
@given(u_o=steps, u_c=st.one_of(st.none(), margins), logit=logits, o=limits, c=limits)
def test_not_greedy_or_drifting_earns_nothing(u_o: float, u_c: float | None, logit: float, o: float, c: float) -> None:
    doctrine = _doctrine(62.5, 2.0, o, c)
    case = _case(u_o, u_c, logit)
    # Without a floor, not greedy earns nothing beyond what the oracle's list alone ratifies.
    g = _classify(case, doctrine, not_greedy=True)
    assert g.cls in (EXACT_TIE, DEFECT) or g.rule == RULE_MNATS
    beyond = RunDrift(100, 3.0, 4.0, 5.0, 3.0, limit_ulps=2.0)
    d = _classify(case, doctrine, drift=beyond)
    assert d.cls == EXACT_TIE or d.cls == DEFECT or d.rule == RULE_MNATS


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(
        st.lists(
            st.tuples(st.integers(0, 12), st.sampled_from([0.0, -0.125, -0.25, -0.25 - 2.0**-24, -1.0, -3.5])),
            min_size=1,
            max_size=5,
            unique_by=lambda p: p[0],
        ),
        min_size=1,
        max_size=6,
    ),
    data=st.data(),
)
def test_the_vectorised_greedy_check_agrees_with_the_plain_one(rows: list[Any], data: st.DataObject) -> None:
    """Among equal maxima (or within one float32 rounding) any choice is greedy; a choice
    below the top, or absent from its own list, is not — the same on both paths."""
    from gate.core.traces.trace import TopLogprobs
    from gate.core.verdict.own_lists import greedy_breaks

    k = min(len(r) for r in rows)
    tops = [sorted(([t, lp] for t, lp in r[:k]), key=lambda p: (-p[1], p[0])) for r in rows]
    chosen = [data.draw(st.integers(0, 13)) for _ in tops]
    arrays = TopLogprobs(
        __import__("numpy").array([[t for t, _ in p] for p in tops]),
        __import__("numpy").array([[lp for _, lp in p] for p in tops]),
    )
    plain = [(b.position, b.chosen_logprob, b.best_logprob) for b in greedy_breaks("p", "free_run", tops, chosen)]
    fast = [(b.position, b.chosen_logprob, b.best_logprob) for b in greedy_breaks("p", "free_run", arrays, chosen)]
    assert plain == fast
    for i, p in enumerate(tops):
        lps = {t: lp for t, lp in p}
        best = max(lps.values())
        expected = chosen[i] not in lps or best - lps[chosen[i]] > logprob_slack(best, lps[chosen[i]])
        assert (i in [b[0] for b in plain]) == expected
