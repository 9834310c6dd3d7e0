"""The evidence doctrine: the candidate's own margin at a flip and the run's drift, at the
edges of each limit. Hand-built traces, pure (no torch).

Every oracle position has a top logit of 20.0, so one bf16 grid step is 0.125 nats, and
logprobs such as -0.5 vs -0.875 are exactly 3 steps apart in binary.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from gate.core.traces.trace import FORCED_TOP_KEY, PromptRecord, Trace, TraceHeader
from gate.core.verdict.adjudicate import compare
from gate.core.verdict.chain import classify, position_evidence
from gate.core.verdict.doctrine import Doctrine, Evidence
from gate.core.verdict.evidence import (
    MIN_DRIFT_POSITIONS,
    aligned_tops,
    candidate_margin,
    run_drift,
    summarise,
    swing,
)
from gate.core.verdict.grid import grid_step
from gate.core.verdict.result import DEFECT, EXACT_TIE, NEAR_TIE
from gate.errors import InputError

STEP = 0.125  # bf16 at |logit| 16-32
LOGIT = 20.0
PROMPT = (1, 2, 3)
EV = Evidence(oracle_ulps=3.0, candidate_ulps=1.0, drift_ulps=2.0)
DOCTRINE = Doctrine(near_tie_mnats=0.0, near_tie_ulps=2.0, evidence=EV)


def grid(v: float) -> float:
    return grid_step(v, "bfloat16")


def top(first: tuple[int, float], *rest: tuple[int, float]) -> list[list[Any]]:
    pairs = [[t, lp] for t, lp in (first, *rest)]
    pairs.sort(key=lambda p: (-p[1], p[0]))
    return pairs


def oracle_rec(pid: str, tops: Sequence[list[list[Any]]]) -> PromptRecord:
    return PromptRecord(
        id=pid,
        prompt_token_ids=PROMPT,
        token_ids=tuple(int(t[0][0]) for t in tops),
        top_logprobs=[list(t) for t in tops],
        extra={"token_logits": [LOGIT] * len(tops)},
    )


def cand_rec(pid: str, ids: Sequence[int], tops: Sequence[list[list[Any]]] | None, **extra: Any) -> PromptRecord:
    forced = extra.pop("forced_token_ids", None)
    return PromptRecord(
        id=pid,
        prompt_token_ids=PROMPT,
        token_ids=tuple(ids),
        top_logprobs=[list(t) for t in tops] if tops is not None else None,
        forced_token_ids=tuple(forced) if forced is not None else None,
        extra=extra,
    )


def trace(role: str, records: Sequence[PromptRecord]) -> Trace:
    return Trace(
        header=TraceHeader(role=role, model="m", top_k=4, engine={"name": role, "version": "1"}),
        records=tuple(records),
        path=f"<{role}>",
    )


def honest_position(i: int) -> list[list[Any]]:
    """An oracle position: token 100+i leads the runner-up 500+i by 2 steps."""
    return top((100 + i, -0.25), (500 + i, -0.25 - 2 * STEP), (900 + i, -3.0))


def shifted(pos: list[list[Any]], runner_up_steps: float) -> list[list[Any]]:
    """The candidate's view of an oracle position: its runner-up raised by N steps."""
    (o, lo), (r, lr), *rest = pos
    return top((o, lo), (r, lr + runner_up_steps * STEP), *[(t, lp) for t, lp in rest])


# --------------------------------------------------------------------------- measuring


def test_swing_is_the_change_of_the_top2_difference_in_steps() -> None:
    pos = honest_position(0)
    assert swing(pos, pos, STEP) == 0.0
    assert swing(pos, shifted(pos, 1.5), STEP) == 1.5
    assert swing(pos, shifted(pos, -0.5), STEP) == -0.5
    # The candidate's list lacks the oracle's runner-up: no measurement.
    assert swing(pos, [pos[0]], STEP) is None


def test_candidate_margin_in_steps() -> None:
    c = top((7, -0.5), (5, -0.75))
    assert candidate_margin(c, oracle_token=5, candidate_token=7, step=STEP) == 2.0
    assert candidate_margin(c, oracle_token=6, candidate_token=7, step=STEP) is None
    assert candidate_margin(None, oracle_token=5, candidate_token=7, step=STEP) is None


def test_aligned_positions_stop_after_the_first_divergence_without_forced_data() -> None:
    tops = [honest_position(i) for i in range(5)]
    o = oracle_rec("p", tops)
    ids = list(o.token_ids)
    ids[2] = 500 + 2  # diverged at 2: positions 0, 1, 2 share the oracle's context
    c = cand_rec("p", ids, tops)
    assert [i for i, _ in aligned_tops(o, c)] == [0, 1, 2]
    forced = cand_rec("p", ids, tops, forced_token_ids=o.token_ids, **{FORCED_TOP_KEY: [shifted(t, 1) for t in tops]})
    got = list(aligned_tops(o, forced))
    assert [i for i, _ in got] == [0, 1, 2, 3, 4]
    assert got[4][1] == shifted(tops[4], 1)  # the forced list, not the free run's


def test_forced_top_logprobs_of_the_wrong_length_is_an_input_error() -> None:
    tops = [honest_position(i) for i in range(3)]
    o = oracle_rec("p", tops)
    c = cand_rec("p", o.token_ids, tops, **{FORCED_TOP_KEY: tops[:2]})
    with pytest.raises(InputError, match=r"prompt 'p': field 'forced_top_logprobs'.*\(3\), found 2"):
        list(aligned_tops(o, c))


def test_run_drift_median_and_p90() -> None:
    assert summarise([0.0, -1.0, 2.0, 3.0]).median_ulps == 1.5
    s = summarise([float(i) for i in range(10)])
    assert (s.median_ulps, s.p90_ulps, s.max_ulps) == (4.5, 8.0, 9.0)
    assert summarise([]).median_ulps is None


def _runs(n: int, runner_up_steps: float) -> tuple[Trace, Trace]:
    tops = [honest_position(i) for i in range(n)]
    o = oracle_rec("p", tops)
    c = cand_rec("p", o.token_ids, [shifted(t, runner_up_steps) for t in tops])
    return trace("oracle", [o]), trace("candidate", [c])


def test_run_drift_is_judged_only_with_enough_positions() -> None:
    o, c = _runs(MIN_DRIFT_POSITIONS, 2.5)
    d = run_drift(o, c, grid, limit_ulps=2.0)
    assert d.median_ulps == 2.5 and d.judged and d.beyond
    o, c = _runs(MIN_DRIFT_POSITIONS - 1, 2.5)
    d = run_drift(o, c, grid, limit_ulps=2.0)
    assert not d.judged and not d.beyond


def test_run_drift_at_the_limit_is_not_beyond() -> None:
    o, c = _runs(MIN_DRIFT_POSITIONS, 2.0)
    assert not run_drift(o, c, grid, limit_ulps=2.0).beyond


# --------------------------------------------------------------------------- the rule at one flip


def _flip(u_o: float, u_c: float | None, doctrine: Doctrine = DOCTRINE, drift: Any = None) -> Any:
    """Oracle 5 at -0.5, candidate 7 at u_o steps below; the candidate sees 7 ahead by u_c."""
    o_top = top((5, -0.5), (7, -0.5 - u_o * STEP), (9, -3.0))
    c_top = top((7, -0.5), (5, -0.5 - u_c * STEP), (9, -3.0)) if u_c is not None else None
    evidence = position_evidence(
        prompt_id="p",
        position=0,
        source="free_run",
        top=o_top,
        oracle_token=5,
        candidate_token=7,
        doctrine=doctrine,
        top_logit=LOGIT,
        candidate_top=c_top,
        drift=drift,
    )
    return classify(evidence, doctrine)


def hair(steps: float) -> float:
    """Just over `steps` steps: past the float32 slack the rule allows."""
    return steps + 2.0**-10


@pytest.mark.parametrize(
    ("u_o", "u_c", "cls"),
    [
        (3.0, 1.0, NEAR_TIE),  # both at their limits
        (hair(3.0), 0.0, DEFECT),  # the oracle's gap a hair past 3 steps
        (1.0, hair(1.0), DEFECT),  # the candidate takes its token by a hair more than 1 step
        (0.5, 4.0, DEFECT),  # a close call for the oracle, a clear choice for the candidate
        (4.0, 0.0, DEFECT),
    ],
)
def test_the_evidence_rule_at_its_limits(u_o: float, u_c: float, cls: str) -> None:
    d = _flip(u_o, u_c)
    assert d.cls == cls
    assert d.candidate_margin_ulps == pytest.approx(u_c)


def test_an_exact_tie_stays_an_exact_tie_whatever_the_evidence() -> None:
    assert _flip(0.0, 5.0).cls == EXACT_TIE


def test_without_the_candidates_top_k_the_evidence_rule_gives_no_allowance() -> None:
    # The doctrine asks for the candidate's lists: without one, no grid steps (rule no_list),
    # where the grid rule alone (near_tie_ulps 2) would have ratified a 2-step gap.
    assert _flip(2.0, None).cls == DEFECT and _flip(2.0, None).rule == "no_list"
    assert _flip(3.0, None).cls == DEFECT
    assert _flip(3.0, 0.0).cls == NEAR_TIE
    # Without the evidence rule, the grid rule needs no list.
    grid_only = Doctrine(near_tie_mnats=DOCTRINE.near_tie_mnats, near_tie_ulps=DOCTRINE.near_tie_ulps)
    assert _flip(2.0, None, doctrine=grid_only).cls == NEAR_TIE
    assert _flip(3.0, None, doctrine=grid_only).cls == DEFECT


def test_a_run_drifting_beyond_the_limit_earns_no_allowance_in_steps() -> None:
    o, c = _runs(MIN_DRIFT_POSITIONS, 4.0)
    beyond = run_drift(o, c, grid, limit_ulps=2.0)
    o, c = _runs(MIN_DRIFT_POSITIONS, 0.5)
    honest = run_drift(o, c, grid, limit_ulps=2.0)
    assert _flip(1.0, 0.5, drift=honest).cls == NEAR_TIE
    assert _flip(1.0, 0.5, drift=beyond).cls == DEFECT
    # ... and no grid-rule fallback either,
    assert _flip(1.0, None, drift=beyond).cls == DEFECT
    # ... but the doctrine's fixed mnats still ratify (the spec's near tie).
    floor = Doctrine(near_tie_mnats=125.0, near_tie_ulps=2.0, evidence=EV)
    assert _flip(1.0, 0.5, doctrine=floor, drift=beyond).cls == NEAR_TIE


# --------------------------------------------------------------------------- whole runs


def _flip_run(n: int, runner_up_steps: float, flip_at: int) -> tuple[Trace, Trace]:
    """n positions; the candidate raises every runner-up by N steps and, at `flip_at`
    (oracle gap 2 steps), takes the runner-up (which it then holds ahead)."""
    tops = [honest_position(i) for i in range(n)]
    o = oracle_rec("p", tops)
    ctops = [shifted(t, runner_up_steps) for t in tops]
    ids = list(o.token_ids)
    ids[flip_at] = 500 + flip_at
    ctops[flip_at] = top((500 + flip_at, -0.25), (100 + flip_at, -0.25 - 0.5 * STEP), (900 + flip_at, -3.0))
    forced = list(ids)
    c = cand_rec("p", ids, ctops, forced_token_ids=forced, **{FORCED_TOP_KEY: ctops})
    return trace("oracle", [o]), trace("candidate", [c])


def test_the_same_flip_is_a_near_tie_in_an_honest_run_and_a_defect_in_a_drifting_one() -> None:
    o, c = _flip_run(40, 0.5, flip_at=30)
    r = compare(o, c, DOCTRINE)
    assert [d.cls for d in r.divergences] == [NEAR_TIE] and r.exit_code == 0
    assert r.drift is not None and r.drift.median_ulps == 0.5 and not r.drift.beyond
    out = r.to_dict()
    assert out["drift"]["median_ulps"] == 0.5 and out["divergences"][0]["candidate_margin_ulps"] == 0.5
    assert out["doctrine"]["evidence"] == {
        "oracle_ulps": 3.0,
        "candidate_ulps": 1.0,
        "drift_ulps": 2.0,
        "floor_logit": 16.0,
    }

    o, c = _flip_run(40, -4.0, flip_at=30)
    r = compare(o, c, DOCTRINE)
    assert [d.cls for d in r.divergences] == [DEFECT] and r.exit_code == 1
    assert r.drift is not None and r.drift.beyond


def test_without_evidence_in_the_doctrine_nothing_changes() -> None:
    o, c = _flip_run(40, -4.0, flip_at=30)
    r = compare(o, c, Doctrine(near_tie_mnats=0.0, near_tie_ulps=2.0))
    assert [d.cls for d in r.divergences] == [NEAR_TIE] and r.drift is None
    assert "drift" not in r.to_dict() and "evidence" not in r.to_dict()["doctrine"]


# --------------------------------------------------------------------------- the doctrine's own checks


def test_evidence_from_a_pin_checks_its_keys_and_values() -> None:
    assert Evidence.from_dict({"oracle_ulps": 3, "candidate_ulps": 1, "drift_ulps": 2}) == EV
    with pytest.raises(InputError, match="missing drift_ulps"):
        Evidence.from_dict({"oracle_ulps": 3, "candidate_ulps": 1}, "oracle.json")
    with pytest.raises(InputError, match="unknown extra"):
        Evidence.from_dict({"oracle_ulps": 3, "candidate_ulps": 1, "drift_ulps": 2, "extra": 1})
    with pytest.raises(InputError, match="drift_ulps must be a finite number >= 0"):
        Evidence.from_dict({"oracle_ulps": 3, "candidate_ulps": 1, "drift_ulps": -1})
    with pytest.raises(InputError, match="oracle_ulps"):
        Evidence.from_dict({"oracle_ulps": "3", "candidate_ulps": 1, "drift_ulps": 2})
    with pytest.raises(InputError, match="floor_logit must be a finite number >= 0"):
        Evidence.from_dict({"oracle_ulps": 3, "candidate_ulps": 1, "drift_ulps": 2, "floor_logit": -16})
    assert (
        Evidence.from_dict({"oracle_ulps": 3, "candidate_ulps": 1, "drift_ulps": 2, "floor_logit": 0}).floor_logit == 0
    )


def test_the_unit_does_not_shrink_below_the_floor_logit() -> None:
    """At a top logit of 5 a bf16 step is 1/32 nats; honest engines across ISA paths flip
    there at 4.5 such steps (140.6 mnats, measured): in units floored at |logit| 16 (1/8
    nats) that is 1.125, a near tie; without the floor it is past the 3-step limit."""
    o_top = top((5, -0.5), (7, -0.5 - 4.5 / 32), (9, -3.0))
    c_top = top((7, -0.5), (5, -0.5), (9, -3.0))  # the candidate's own exact tie
    kw: dict[str, Any] = {
        "prompt_id": "p",
        "position": 0,
        "source": "free_run",
        "top": o_top,
        "oracle_token": 5,
        "candidate_token": 7,
        "top_logit": 5.0,
        "candidate_top": c_top,
    }
    floored = classify(position_evidence(doctrine=DOCTRINE, **kw), DOCTRINE)
    assert floored.cls == NEAR_TIE and floored.gap_ulps == 4.5  # reported in the logit's own steps
    bare = Doctrine(near_tie_mnats=0.0, near_tie_ulps=2.0, evidence=Evidence(3.0, 1.0, 2.0, floor_logit=0.0))
    assert classify(position_evidence(doctrine=bare, **kw), bare).cls == DEFECT


# --------------------------------------------------------------------------- the doctrine travels with the pin


def _pin_files(tmp: Any, doctrine: Any) -> tuple[str, str]:
    """An oracle trace whose header carries `doctrine`, and a candidate flipping at a gap of
    exactly 2 bf16 steps (250 mnats) with its own margin of half a step."""
    import orjson

    tops = [honest_position(i) for i in range(4)]
    o = oracle_rec("p", tops)
    ctops = [list(t) for t in tops]
    ids = list(o.token_ids)
    ids[3] = 503
    ctops[3] = top((503, -0.25), (103, -0.25 - 0.5 * STEP), (903, -3.0))
    head = {"gate_trace": 1, "role": "oracle", "model": "m", "top_k": 3, "engine": {"name": "o", "version": "1"}}
    if doctrine is not None:
        head["doctrine"] = doctrine
    op, cp = tmp / "pin.jsonl", tmp / "cand.jsonl"
    op.write_bytes(orjson.dumps(head) + b"\n" + orjson.dumps(o.to_dict()) + b"\n")
    ch = {**head, "role": "candidate"}
    ch.pop("doctrine", None)
    c = cand_rec("p", ids, ctops)
    cp.write_bytes(orjson.dumps(ch) + b"\n" + orjson.dumps(c.to_dict()) + b"\n")
    return str(op), str(cp)


def test_gate_compare_applies_the_doctrine_the_pin_trace_carries(tmp_path: Any) -> None:
    import json

    from helpers.gate_cli import invoke

    o, c = _pin_files(tmp_path, {"near_tie_ulps": 2})
    r = invoke(["compare", o, c, "--format", "json"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["counts"]["near_ties"] == 1 and report["doctrine"]["near_tie_ulps"] == 2.0
    assert report["doctrine_source"] == f"the oracle trace's header ({o})"
    # A flag changes its own field only: --near-tie-mnats keeps the pin's grid allowance ...
    r = invoke(["compare", o, c, "--format", "json", "--near-tie-mnats", "125"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["doctrine"]["near_tie_ulps"] == 2.0 and report["doctrine"]["near_tie_mnats"] == 125.0
    assert (
        report["doctrine_source"]
        == f"the oracle trace's header ({o}); changed on the command line: --near-tie-mnats 125"
    )
    # ... and --near-tie-ulps 0 takes the allowance away: the same 250-mnat flip is a defect.
    r = invoke(["compare", o, c, "--format", "json", "--near-tie-ulps", "0"])
    assert r.exit_code == 1, r.output
    # Without a doctrine in the header: the defaults (125 mnats), as before.
    o, c = _pin_files(tmp_path, None)
    r = invoke(["compare", o, c, "--format", "json"])
    assert r.exit_code == 1, r.output
    assert "doctrine_source" not in json.loads(r.stdout)


def test_gate_compare_weighs_the_evidence_when_the_pin_says_so(tmp_path: Any) -> None:
    import json

    from helpers.gate_cli import invoke

    ev = {"oracle_ulps": 3, "candidate_ulps": 0.25, "drift_ulps": 2}
    o, c = _pin_files(tmp_path, {"near_tie_ulps": 2, "evidence": ev})
    r = invoke(["compare", o, c, "--format", "json"])
    # The candidate takes its token by half a step, beyond the 0.25 the doctrine allows.
    assert r.exit_code == 1, r.output
    d = json.loads(r.stdout)["divergences"][0]
    assert d["class"] == "defect" and d["candidate_margin_ulps"] == 0.5
    o, c = _pin_files(tmp_path, {"near_tie_ulps": 2, "evidence": {**ev, "candidate_ulps": 0.5}})
    assert invoke(["compare", o, c]).exit_code == 0


@pytest.mark.parametrize(
    ("doctrine", "message"),
    [
        ({"near_tie_ulps": -1}, "field 'doctrine.near_tie_ulps': must be a number >= 0"),
        ({"grid": 2}, "field 'doctrine.grid': unknown"),
        ({"evidence": {"oracle_ulps": 3}}, "missing candidate_ulps, drift_ulps"),
    ],
)
def test_a_bad_doctrine_in_the_pin_header_is_an_input_error(tmp_path: Any, doctrine: Any, message: str) -> None:
    from helpers.gate_cli import invoke

    o, c = _pin_files(tmp_path, doctrine)
    r = invoke(["compare", o, c])
    assert r.exit_code == 2, r.output
    assert message in r.stderr and "pin.jsonl" in r.stderr


def test_a_drift_far_beyond_honest_is_reported_loudly_even_without_a_flip() -> None:
    from gate.reports.markdown import render_markdown
    from gate.reports.terminal import render_text

    o, c = _runs(40, -4.0)  # every runner-up 4 steps further, no token flipped
    r = compare(o, c, DOCTRINE)
    assert r.verdict == "strict_pass" and r.exit_code == 0  # the spec's verdict: no flip, no divergence
    assert r.to_dict()["drift"]["beyond"] is True
    assert "FAR BEYOND HONEST DRIFT" in " ".join(render_text(r).split())
    assert "FAR BEYOND HONEST DRIFT" in render_markdown(r)
    o, c = _runs(40, 0.5)
    honest = " ".join(render_text(compare(o, c, DOCTRINE), details=True).split())
    assert "run drift: median 0.50, p90 0.50" in honest and "(median limit 2 over the run" in honest
    assert "FAR BEYOND" not in honest


def test_a_negative_own_margin_earns_no_allowance_downstream_either() -> None:
    """`own_margin` (a move the oracle never saw, judged by the new run's own lists): a list
    that ranks the old token above the new one it took is no near tie of its numbers."""
    from gate.core.verdict.evidence import own_margin

    top = [[[8, -0.5], [7, -0.5 - 0.5 * STEP]]]
    rec = PromptRecord(
        id="p", prompt_token_ids=PROMPT, token_ids=(8,), top_logprobs=top, extra={"token_logits": [LOGIT]}
    )
    assert own_margin(rec, 0, 7, 8, "bfloat16", EV, None) == 0.5
    assert own_margin(rec, 0, 8, 7, "bfloat16", EV, None) is None  # took 7, which its own list puts below 8
