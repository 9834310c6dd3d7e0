"""Hypothesis properties: the classifier's invariants, the verdict's monotonicity, and the
reader's fast path never accepting what the exact path rejects."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gate.core.traces.reader import read_trace
from gate.core.traces.trace import PromptRecord, TopLogprobs, Trace, TraceHeader, write_trace
from gate.core.traces.validate import _check_position, _fast_top
from gate.core.verdict.adjudicate import compare
from gate.core.verdict.chain import classify, position_evidence
from gate.core.verdict.doctrine import Doctrine
from gate.core.verdict.result import DEFECT, EXACT_TIE, FAIL, NEAR_TIE, RATIFIED_PASS, STRICT_PASS
from gate.errors import TraceError

FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# float32 logprobs as engines write them; ties are common on purpose (few distinct values).
logprob = st.one_of(
    st.sampled_from([-0.0, -0.5, -0.625, -0.8293954133987427, -1.0, -2.25]),
    st.floats(min_value=-30.0, max_value=0.0, width=32, allow_subnormal=False),
)


@st.composite
def top_lists(draw: st.DrawFn, min_size: int = 2, max_size: int = 8) -> list[list[Any]]:
    """A valid top-k list: distinct ids, sorted by logprob descending, then id ascending."""
    ids = draw(st.lists(st.integers(0, 60), min_size=min_size, max_size=max_size, unique=True))
    lps = draw(st.lists(logprob, min_size=len(ids), max_size=len(ids)))
    pairs = sorted(([t, float(v)] for t, v in zip(ids, lps, strict=True)), key=lambda p: (-p[1], p[0]))
    return pairs


def argmax_order(top: list[list[Any]]) -> list[int]:
    """The order in which repeated np.argmax (first index among maxima, as torch.argmax
    documents) picks tokens from a vocabulary holding these logprobs."""
    vocab = np.full(64, -np.inf)
    for t, v in top:
        vocab[t] = v
    order = []
    for _ in top:
        best = int(np.argmax(vocab))
        order.append(best)
        vocab[best] = -np.inf
    return order


def judge(top: list[list[Any]], cand: int | None, near: float = 125.0) -> Any:
    doctrine = Doctrine(near_tie_mnats=near)
    evidence = position_evidence(
        prompt_id="p",
        position=0,
        source="free_run",
        top=top,
        oracle_token=top[0][0],
        candidate_token=cand,
        doctrine=doctrine,
    )
    return classify(evidence, doctrine)


@FAST
@given(top_lists(), st.data())
def test_classifier_invariants(top: list[list[Any]], data: st.DataObject) -> None:
    oracle = top[0][0]
    cand = data.draw(st.sampled_from([t for t, _ in top[1:]]))
    d = judge(top, cand)
    lps = dict((t, v) for t, v in top)
    gap = d.oracle_minus_candidate_mnats
    assert gap == 1000.0 * (lps[oracle] - lps[cand]) and gap >= 0.0
    # a gap of exactly 0.0 is always an exact tie, and only then
    assert (d.cls == EXACT_TIE) == (gap == 0.0) == (lps[cand] == lps[oracle])
    if d.cls == EXACT_TIE:
        assert d.tie_break == ("higher_id" if cand > oracle else "lower_id")
        assert cand > oracle  # the oracle, which took the lowest id, holds the lower one
    else:
        assert d.tie_break is None
        assert d.cls == (NEAR_TIE if gap <= 125.0 else DEFECT)
    # rank: where torch.argmax's order puts the candidate
    assert d.candidate_rank == argmax_order(top).index(cand) + 1
    assert d.top2_gap_mnats == 1000.0 * (top[0][1] - top[1][1])
    assert d.gap_lower_bound_mnats is None


@FAST
@given(top_lists(), st.sampled_from([None, 61, 62, 63]))
def test_outside_the_list_is_a_defect_with_a_lower_bound(top: list[list[Any]], cand: int | None) -> None:
    d = judge(top, cand, near=1e12)  # no threshold can ratify it
    assert d.cls == DEFECT and d.candidate_rank is None and d.oracle_minus_candidate_mnats is None
    bound = d.gap_lower_bound_mnats
    assert bound == 1000.0 * (top[0][1] - top[-1][1])
    assert all(bound >= 1000.0 * (top[0][1] - v) for _, v in top)


@FAST
@given(top_lists(), st.data(), st.floats(0, 5000), st.floats(0, 5000))
def test_a_larger_threshold_never_turns_a_tie_into_a_defect(
    top: list[list[Any]], data: st.DataObject, a: float, b: float
) -> None:
    cand = data.draw(st.sampled_from([t for t, _ in top[1:]]))
    small, large = judge(top, cand, min(a, b)), judge(top, cand, max(a, b))
    rank = {EXACT_TIE: 0, NEAR_TIE: 1, DEFECT: 2}
    assert rank[large.cls] <= rank[small.cls]


# --------------------------------------------------------------------------- verdicts

VERDICT_ORDER = {STRICT_PASS: 0, RATIFIED_PASS: 1, FAIL: 2}
HEAD = {"name": "e", "version": "1"}


def _prompt(i: int, kind: str) -> tuple[PromptRecord, PromptRecord]:
    tops = [[[10, -0.5], [11, -0.5], [12, -0.625], [13, -3.0]], [[20, -0.25], [21, -2.0]]]
    oracle = PromptRecord(f"p{i}", (1, 2), (10, 20), top_logprobs=tops)
    cand_tokens = {"strict": (10, 20), "tie": (11, 5), "near": (12, 5), "defect": (13, 5), "stop": ()}[kind]
    return oracle, PromptRecord(f"p{i}", (1, 2), cand_tokens)


@FAST
@given(
    st.lists(st.sampled_from(["strict", "tie", "near", "defect", "stop"]), min_size=1, max_size=6),
    st.sampled_from(["defect", "stop"]),
    st.booleans(),
)
def test_adding_a_defect_never_improves_the_verdict(kinds: list[str], bad: str, strict: bool) -> None:
    def verdict(ks: list[str]) -> tuple[str, int]:
        pairs = [_prompt(i, k) for i, k in enumerate(ks)]
        o = Trace(TraceHeader("oracle", "m", 4, HEAD), tuple(p[0] for p in pairs))
        c = Trace(TraceHeader("candidate", "m", 0, HEAD), tuple(p[1] for p in pairs))
        r = compare(o, c, Doctrine(strict=strict))
        return r.verdict, r.exit_code

    before, code_before = verdict(kinds)
    after, code_after = verdict([*kinds, bad])
    assert after == FAIL and code_after == 1
    assert VERDICT_ORDER[after] >= VERDICT_ORDER[before] and code_after >= code_before
    expected = (
        STRICT_PASS if set(kinds) == {"strict"} else RATIFIED_PASS if set(kinds) <= {"strict", "tie", "near"} else FAIL
    )
    assert before == expected


# --------------------------------------------------------------------------- the reader's fast path

HOSTILE = st.sampled_from([True, False, None, "1", 1.0, -1, 2**63, -(2**63) - 1, 0, -0.0, 0.5, [], [1, 2]])


@st.composite
def maybe_broken(draw: st.DrawFn) -> tuple[list[Any], list[int]]:
    n = draw(st.integers(1, 4))
    k = draw(st.integers(1, 4))
    top = [draw(top_lists(min_size=k, max_size=k)) for _ in range(n)]
    chosen = [pos[0][0] for pos in top]
    for _ in range(draw(st.integers(0, 2))):
        i = draw(st.integers(0, n - 1))
        j = draw(st.integers(0, k - 1))
        how = draw(st.sampled_from(["id", "lp", "swap", "dup", "len", "chosen", "pos"]))
        if not isinstance(top[i], list) or not top[i] or not isinstance(top[i][j], list) or len(top[i][j]) != 2:
            continue  # already broken there
        if how == "id":
            top[i][j][0] = draw(HOSTILE)
        elif how == "lp":
            top[i][j][1] = draw(HOSTILE)
        elif how == "swap" and k > 1:
            top[i][0], top[i][-1] = top[i][-1], top[i][0]
        elif how == "dup" and k > 1 and len(top[i][0]) == 2 and len(top[i][-1]) == 2:  # not cut by "len"
            top[i][-1] = [top[i][0][0], top[i][-1][1]]
        elif how == "len":
            top[i][j] = top[i][j][:1] if draw(st.booleans()) else [*top[i][j], 0]
        elif how == "chosen":
            chosen[i] = draw(st.integers(0, 70))
        else:
            top[i] = draw(st.sampled_from([{}, "ab", 5, None, []]))
    return top, chosen


def _exact_path_accepts(top: list[Any], chosen: list[int], oracle: bool) -> bool:
    try:
        for i, pos in enumerate(top):
            _check_position("f", 1, f"top_logprobs[{i}]", pos, chosen[i], oracle)
    except TraceError:
        return False
    return True


@settings(max_examples=600, deadline=None)
@given(maybe_broken(), st.booleans())
def test_fast_path_accepts_only_what_the_exact_path_accepts(case: tuple[list[Any], list[int]], oracle: bool) -> None:
    top, chosen = case
    fast = _fast_top(top, chosen, oracle)
    exact = _exact_path_accepts(top, chosen, oracle)
    if fast is not None:
        assert exact, f"fast path accepted what the exact path rejects: {top!r} {chosen!r}"
        # the same values; integer logprobs come back as floats
        assert fast.tolist() == [[[t, float(v)] for t, v in pos] for pos in top]
        assert all(type(t) is int for pos in fast for t, _ in pos)


@settings(max_examples=100, deadline=None)
@given(st.lists(top_lists(min_size=3, max_size=3), min_size=1, max_size=5))
def test_valid_lists_take_the_fast_path(top: list[list[Any]]) -> None:
    fast = _fast_top(top, [p[0][0] for p in top], True)
    assert isinstance(fast, TopLogprobs) and fast.tolist() == top


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(top_lists(min_size=2, max_size=5), min_size=1, max_size=4))
def test_round_trip_is_bit_exact(tmp_path: Path, top: list[list[Any]]) -> None:
    tokens = tuple(p[0][0] for p in top)
    trace = Trace(TraceHeader("oracle", "m", 5, HEAD), (PromptRecord("p", (1,), tokens, top_logprobs=top),))
    path = tmp_path / "t.jsonl"
    write_trace(path, trace, overwrite=True)
    back = read_trace(path).records[0].top_logprobs
    assert back is not None
    for pos_a, pos_b in zip(back, top, strict=True):
        for (ta, la), (tb, lb) in zip(pos_a, pos_b, strict=True):
            assert ta == tb and math.copysign(1.0, la) == math.copysign(1.0, lb) and la == lb


# --------------------------------------------------------------------------- meaning: no false pass


@st.composite
def oracle_and_candidate(draw: st.DrawFn) -> tuple[Trace, Trace]:
    """An oracle of 1-3 prompts and a candidate that takes, at each position, the oracle's
    token or another one (in the list or not), maybe stops early, maybe carries forced data."""
    o_recs, c_recs = [], []
    for i in range(draw(st.integers(1, 3))):
        tops = [draw(top_lists(min_size=2, max_size=4)) for _ in range(draw(st.integers(1, 4)))]
        tokens = tuple(p[0][0] for p in tops)
        o_recs.append(PromptRecord(f"p{i}", (1, 2), tokens, top_logprobs=tops))

        def take(tops: list[list[list[Any]]], j: int, tok: int) -> int:
            alt = draw(st.sampled_from([None, 61] + [t for t, _ in tops[j]])) if draw(st.booleans()) else None
            return alt if alt is not None else tok

        cand = tuple(take(tops, j, t) for j, t in enumerate(tokens))[: draw(st.integers(0, len(tokens)))]
        forced = tuple(take(tops, j, t) for j, t in enumerate(tokens)) if draw(st.booleans()) else None
        c_recs.append(PromptRecord(f"p{i}", (1, 2), cand, forced_token_ids=forced))
    o = Trace(TraceHeader("oracle", "m", 8, HEAD), tuple(o_recs))
    c = Trace(TraceHeader("candidate", "m", 0, HEAD), tuple(c_recs))
    return o, c


@FAST
@given(
    oracle_and_candidate(),
    st.one_of(st.sampled_from([0.0, 125.0]), st.floats(0, 3000)),
    st.sampled_from([None, 1.0, 2.0]),
    st.booleans(),
    st.sampled_from([None, 5.0, 20.0, 500.0]),
)
def test_no_false_pass(
    pair: tuple[Trace, Trace], near: float, ulps: float | None, strict: bool, logit: float | None
) -> None:
    o, c = pair
    if logit is not None:  # the grid doctrine at some (plausible or tampered) top logit
        o = Trace(
            o.header,
            tuple(
                PromptRecord(
                    r.id,
                    r.prompt_token_ids,
                    r.token_ids,
                    top_logprobs=r.top_logprobs,
                    extra={"token_logits": [logit] * len(r.token_ids)},
                )
                for r in o.records
            ),
        )
    result = compare(o, c, Doctrine(near_tie_mnats=near, near_tie_ulps=ulps, strict=strict))
    counts = result.counts
    # A report never counts a defect and passes.
    if counts["defects"]:
        assert result.exit_code == 1 and result.verdict == FAIL
    # A candidate whose tokens differ from the oracle's is never a strict pass.
    cand = c.by_id()
    for rec, p in zip(o.records, result.prompts, strict=True):
        if cand[rec.id].token_ids[: len(rec.token_ids)] != rec.token_ids:
            assert not p.strict and result.verdict != STRICT_PASS
    # Whatever the doctrine, a ratified gap is never wider than its threshold allows: the
    # grid step is capped (bf16 at |logit| 64-128: 0.5 nats), plus one float32 step.
    for d in result.divergences:
        if d.cls == NEAR_TIE and d.oracle_minus_candidate_mnats is not None:
            assert d.oracle_minus_candidate_mnats <= max(near, 1000.0 * 0.5 * (ulps or 0) + 1.0)
    # A pass means every classified divergence is a tie.
    if result.exit_code == 0:
        assert all(d.cls != DEFECT for d in result.divergences)


@given(st.sampled_from(["header-only", "empty-continuations"]))
def test_nothing_to_compare_never_passes(case: str) -> None:
    from gate.errors import InputError

    records: tuple[PromptRecord, ...] = ()
    if case == "empty-continuations":
        records = (PromptRecord("p", (1,), (), top_logprobs=[]),)
    o = Trace(TraceHeader("oracle", "m", 4, HEAD), records)
    cand = tuple(PromptRecord(r.id, r.prompt_token_ids, ()) for r in records)
    c = Trace(TraceHeader("candidate", "m", 0, HEAD), cand)
    try:
        compare(o, c)
    except InputError:
        return
    raise AssertionError("a run with nothing to compare did not stop at an input error")
