"""Less evidence is never a laxer verdict: under a pin with an honest floor, removing,
truncating or replacing anything a candidate reports about itself (list entries, whole
lists, forced ids and lists, `token_logits`, the header's `top_k` and fields, the tail of
its free run) never turns a verdict that is not a pass into a pass; the KL's bound for an
oracle token the candidate's list lacks only ever raises it; and honest full lists are
judged. Pure: generated traces, no engine, no torch (the realistic candidates are in
tests/core/test_monotonicity_realistic.py)."""

from __future__ import annotations

import math
import random
from dataclasses import replace
from typing import Any

import pytest
from helpers.evidence_cuts import CUTS, apply_cuts
from helpers.generated_traces import DOCTRINES, LENGTH, PROMPTS, build
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gate.core.traces.trace import PromptRecord, Trace, TraceHeader
from gate.core.verdict.adjudicate import compare
from gate.core.verdict.distribution import MIN_POSITIONS, RULE_NOT_JUDGED, canonical, kl_mnats, same_top
from gate.core.verdict.doctrine import Doctrine, Evidence
from gate.errors import InputError


def _not_a_pass(oracle: Trace, cand: Trace, doctrine: Doctrine) -> bool:
    try:
        return compare(oracle, cand, doctrine).exit_code != 0
    except InputError:
        return True  # refused (exit 2): not a pass either


# --------------------------------------------------------------------------- the KL's bound


lists = st.lists(
    st.tuples(st.integers(0, 30), st.floats(-12.0, -0.01, allow_nan=False)),
    min_size=1,
    max_size=8,
    unique_by=lambda p: p[0],
)


@settings(max_examples=400, deadline=None)
@given(o=lists, c=lists, which=st.integers(0, 7), new=st.integers(100, 200))
def test_replacing_a_listed_token_by_an_unlisted_one_never_lowers_the_kl(
    o: list[tuple[int, float]], c: list[tuple[int, float]], which: int, new: int
) -> None:
    """The candidate's list at the same logprobs, one token swapped for one the oracle does
    not list: the KL is at least what it was (up to float rounding)."""
    cand = canonical(c, len(c))
    before, _ = kl_mnats(o, cand)
    swapped = list(c)
    j = which % len(c)
    swapped[j] = (new, swapped[j][1])
    after, _ = kl_mnats(o, canonical(swapped, len(swapped)))
    assert after >= before - 1e-9 * max(1.0, before)
    # And the same top can only be lost, never won.
    top, ids = o[0][0], {t for t, _ in o}
    assert not (same_top(top, canonical(swapped, len(swapped)), ids) and not same_top(top, cand, ids))


def test_a_one_entry_list_is_far_from_the_oracle_not_zero() -> None:
    """KL over the common support was 0 for any one-entry list: with the bound, the oracle's
    other tokens count (at most the candidate's listed probability each)."""
    o = [[5, math.log(0.5)], [6, math.log(0.3)], [7, math.log(0.2)]]
    full, _ = kl_mnats(o, canonical(o, 3))
    assert full == pytest.approx(0.0, abs=1e-9)
    one, support = kl_mnats(o, canonical([[5, math.log(0.5)]], 3))
    # Each missing token at most 0.5 (the list's smallest): flat where the oracle is not.
    p = [0.5, 0.3, 0.2]
    assert support == 1 and one == pytest.approx(1000 * sum(x * math.log(x / (1 / 3)) for x in p), rel=1e-9)
    # A right argmax and 3 tokens the oracle does not list: the oracle's runners-up get the
    # smallest listed probability, and the unlisted mass stays in the normaliser.
    fake = [[5, math.log(0.9)], [90, math.log(0.04)], [91, math.log(0.03)], [92, math.log(0.03)]]
    kl, support = kl_mnats(o, canonical(fake, 4))
    assert support == 1 and kl > 500.0


def test_entries_past_the_top_k_are_not_measured() -> None:
    o = [[5, -0.5], [6, -1.5], [7, -2.5]]
    c = [[5, -0.6], [6, -1.4], [7, -2.6], [8, -3.0], [9, -4.0]]
    assert kl_mnats(o, canonical(c, 3)) == kl_mnats(o, canonical(c[:3], 3))


# --------------------------------------------------------------------------- honest lists are judged


@pytest.mark.parametrize("name", sorted(DOCTRINES))
def test_an_honest_candidate_with_full_lists_is_judged_and_passes(name: str) -> None:
    oracle, cand = build(seed=7, noise=0.01)
    r = compare(oracle, cand, DOCTRINES[name])
    d = r.distribution
    assert d is not None and d.judged and not d.insufficient and d.coverage is not None and d.coverage.complete
    assert d.overall.positions == PROMPTS * LENGTH >= MIN_POSITIONS
    assert r.exit_code == 0, (r.summary, d.beyond_figures)


def test_a_candidate_identical_to_the_oracle_passes_and_each_cut_fails_it() -> None:
    """Every kind of cut, once, on the oracle's own lists (a candidate that is the oracle):
    the ones that leave a list short, a position without one or a forced prompt without its
    lists make it not judged (fail); the others leave it a pass."""
    oracle, cand = build(seed=3, noise=0.0)
    doctrine = DOCTRINES["floor"]
    assert compare(oracle, cand, doctrine).exit_code == 0
    failing = {"truncate", "drop_entry", "empty_list", "drop_lists", "drop_all_lists", "lower_top_k", "cut_free_run"}
    for name in sorted(CUTS):
        cut = apply_cuts(cand, oracle, [(name, 1)])
        if name in failing:
            r = compare(oracle, cut, doctrine)
            assert r.exit_code == 1 and r.distribution is not None and r.distribution.insufficient, name
            assert r.to_dict()["distribution"]["rule"] == RULE_NOT_JUDGED


def test_a_prompt_diverged_without_forced_data_is_not_judged_under_a_floor() -> None:
    oracle, cand = build(seed=11, noise=1.0)
    assume_diverged = [r for r in cand.records if r.forced_token_ids is not None]
    assert assume_diverged
    cut = apply_cuts(cand, oracle, [("drop_forced", 0)] * 12)
    r = compare(oracle, cut, DOCTRINES["floor"])
    d = r.distribution
    assert d is not None and d.insufficient and r.verdict == "fail"
    assert d.coverage is not None and d.coverage.uncovered > 0
    reason = d.not_judged_reason or ""
    assert "after a free-run divergence with no forced data" in reason
    # Without a floor nothing changes: the spec's unadjudicated positions, as ever.
    assert compare(oracle, cut, Doctrine()).distribution.insufficient is False  # type: ignore[union-attr]


def test_free_run_and_forced_lists_are_both_measured_the_worse_counts() -> None:
    """A candidate whose forced lists are the oracle's but whose free-run lists are far from
    it (a decode path that is wrong, a prefill that is right) fails: the forced lists no
    longer replace the free run's."""
    oracle, _ = build(seed=5, noise=0.0)
    bad = []
    for o in oracle.records:
        far = [[[t, lp] for t, lp in reversed(top)] for top in o.top_logprobs or ()]  # the same tokens, ranks reversed
        far = [
            sorted([[t, lp] for (t, _), (_, lp) in zip(top, reversed(top), strict=True)], key=lambda p: (-p[1], p[0]))
            for top in far
        ]
        bad.append(
            replace(
                o,
                top_logprobs=far,
                forced_token_ids=o.token_ids,
                extra={
                    "forced_top_logprobs": [list(map(list, t)) for t in o.top_logprobs or ()],
                    "forced_mode": "prefill",
                },
            )
        )
    cand = Trace(replace(oracle.header, role="candidate"), tuple(bad), "c.jsonl")
    r = compare(oracle, cand, DOCTRINES["floor"])
    assert r.exit_code == 1 and r.distribution is not None and r.distribution.beyond, r.summary


# --------------------------------------------------------------------------- the whole verdict


cut_lists = st.lists(st.tuples(st.sampled_from(sorted(CUTS)), st.integers(0, 2**31)), min_size=1, max_size=4)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**31),
    noise=st.sampled_from([0.05, 0.3, 0.8, 2.0]),
    bias=st.sampled_from([0.0, 0.5, 2.0]),
    doctrine=st.sampled_from(sorted(DOCTRINES)),
    cuts=cut_lists,
)
def test_no_evidence_reducing_cut_turns_a_failing_trace_into_a_pass(
    seed: int, noise: float, bias: float, doctrine: str, cuts: list[tuple[str, int]]
) -> None:
    oracle, cand = build(seed, noise, bias)
    doc = DOCTRINES[doctrine]
    assume(compare(oracle, cand, doc).exit_code == 1)
    assert _not_a_pass(oracle, apply_cuts(cand, oracle, cuts), doc), cuts


def test_the_property_meets_failing_traces_of_every_kind() -> None:
    """The generator is not vacuous: it makes failing traces by the token rules, by the
    distribution, and candidates that pass."""
    kinds = set()
    for seed in range(40):
        for noise, bias in ((0.05, 0.0), (0.8, 0.0), (0.3, 2.0)):
            oracle, cand = build(seed, noise, bias)
            for doc in DOCTRINES.values():
                r = compare(oracle, cand, doc)
                d = r.distribution
                assert d is not None
                kinds.add("pass" if r.exit_code == 0 else "beyond" if d.beyond else "tokens")
    assert kinds == {"pass", "beyond", "tokens"}


def test_random_cut_sequences_on_many_failing_traces() -> None:
    """The same property over a fixed sample (fast, deterministic): 30 failing traces x 20 cut sequences."""
    rng = random.Random(0)
    names = sorted(CUTS)
    checked = 0
    for seed in range(200):
        oracle, cand = build(seed, rng.choice([0.3, 0.8]), rng.choice([0.0, 2.0]))
        doc = DOCTRINES[rng.choice(sorted(DOCTRINES))]
        if compare(oracle, cand, doc).exit_code != 1:
            continue
        for _ in range(20):
            cuts = [(rng.choice(names), rng.randrange(2**31)) for _ in range(rng.randrange(1, 4))]
            assert _not_a_pass(oracle, apply_cuts(cand, oracle, cuts), doc), (seed, cuts)
        checked += 1
        if checked == 30:
            break
    assert checked == 30


# --------------------------------------------------------------------------- the evidence rule without a floor

# A doctrine that asks for the candidate's lists (the evidence rule) but carries no floor:
# the spec's "a doctrine that needs the candidate's lists is not passed by its absence"
# holds here too. Only `drop_forced` is left out: without a floor, positions after a free-run
# divergence that has no forced data are the spec's unadjudicated positions (v1's counting).
EVIDENCE_ONLY = Doctrine(near_tie_ulps=2.0, evidence=Evidence(4.0, 2.0, 2.0))
NO_FLOOR_CUTS = sorted(set(CUTS) - {"drop_forced"})


def test_dropping_every_list_under_the_evidence_rule_without_a_floor_does_not_pass() -> None:
    """The evidence rule failed a flip (its run drifts beyond the doctrine, or its own margin
    is too wide); without any lists the grid rule's fallback used to ratify it."""
    oracle, cand = build(202, 0.3, 0.0)
    assert compare(oracle, cand, EVIDENCE_ONLY).exit_code == 1
    for cut in ("drop_all_lists", "drop_forced_lists", "drop_lists"):
        for seed in range(4):
            assert _not_a_pass(oracle, apply_cuts(cand, oracle, [(cut, seed)] * 4), EVIDENCE_ONLY), (cut, seed)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**31),
    noise=st.sampled_from([0.05, 0.3, 0.8]),
    bias=st.sampled_from([0.0, 0.5, 2.0]),
    cuts=st.lists(st.tuples(st.sampled_from(NO_FLOOR_CUTS), st.integers(0, 2**31)), min_size=1, max_size=4),
)
def test_no_cut_passes_a_failing_trace_under_the_evidence_rule_without_a_floor(
    seed: int, noise: float, bias: float, cuts: list[tuple[str, int]]
) -> None:
    oracle, cand = build(seed, noise, bias)
    assume(compare(oracle, cand, EVIDENCE_ONLY).exit_code == 1)
    assert _not_a_pass(oracle, apply_cuts(cand, oracle, cuts), EVIDENCE_ONLY), cuts


def test_removing_the_lists_that_show_a_candidate_is_not_greedy_never_passes_it() -> None:
    """Its own list at position 1 (a context it shares with the oracle) ranks 3 above the 6
    it took; at 2 it takes an exact tie the other way. Without a floor the tie is judged on
    the oracle's list alone with or without its lists (a candidate may give none), so its
    lists cannot make it a defect that dropping them would ratify; dropping every list, or
    the one that shows it, passes nothing that failed."""
    head = TraceHeader("oracle", "m", 3, {"name": "e", "version": "1"})
    o = PromptRecord(
        "p",
        (1,),
        (5, 6, 7),
        top_logprobs=[[[5, -0.1], [2, -3.0]], [[6, -0.1], [3, -3.0], [4, -4.0]], [[7, -0.5], [8, -0.5], [3, -3.0]]],
    )
    c = PromptRecord(
        "p",
        (1,),
        (5, 6, 8),
        top_logprobs=[[[5, -0.1], [2, -3.0]], [[3, -0.1], [6, -0.2], [4, -4.0]], [[7, -0.5], [8, -0.5], [3, -3.0]]],
    )
    oracle = Trace(head, (o,), "o.jsonl")
    cand = Trace(replace(head, role="candidate"), (c,), "c.jsonl")
    for doctrine in (Doctrine(), EVIDENCE_ONLY):
        r = compare(oracle, cand, doctrine)
        assert r.not_greedy_total == 1
        assert r.verdict == "ratified_pass", r.summary  # the exact tie, judged on the oracle's list
        for cuts in ([("drop_all_lists", 0)], [("drop_lists", 0)], [("drop_lists", 1)], [("drop_lists", 2)]):
            cut = apply_cuts(cand, oracle, cuts)
            if r.verdict == "fail":
                assert _not_a_pass(oracle, cut, doctrine), (doctrine, cuts)


# --------------------------------------------------------------------------- on the default pin


def test_cuts_on_hostile_candidates_of_the_default_pin_stay_failing() -> None:
    """The default pin, its committed floor and doctrine: a candidate whose runner-up is
    raised by 3 evidence units everywhere (beyond the floor and the drift limit), and one
    greedy over nothing it reports (not greedy), each failing; every cut keeps them failing."""
    from helpers.pin_attacks import candidate, pin, raise_runner_up, same

    from gate.core.pins.pin import doctrine_for, load_pin
    from gate.core.traces.trace import TraceHeader

    oracle = pin()
    doctrine = doctrine_for(load_pin("HuggingFaceTB/SmolLM2-135M-Instruct"))
    assert doctrine.floor is not None

    def as_trace(head: dict[str, Any], recs: list[dict[str, Any]]) -> Trace:
        from gate.core.traces.trace import PromptRecord

        records = []
        for r in recs:
            known = {k: r[k] for k in ("id", "prompt_token_ids", "token_ids", "top_logprobs") if k in r}
            extra = {k: v for k, v in r.items() if k not in (*known, "forced_token_ids")}
            forced = tuple(r["forced_token_ids"]) if "forced_token_ids" in r else None
            records.append(
                PromptRecord(
                    **{**known, "prompt_token_ids": tuple(r["prompt_token_ids"]), "token_ids": tuple(r["token_ids"])},
                    forced_token_ids=forced,
                    extra=extra,
                )
            )
        header = TraceHeader("candidate", head["model"], head["top_k"], head["engine"])
        return Trace(header, tuple(records), "cand.jsonl")

    def penalised(p: int, rec: dict[str, Any], i: int, top: list[list[Any]]) -> int | None:
        return int(top[1][0]) if (p + i) % 9 == 0 else None

    hostile = {
        "runner-up +3 units": as_trace(*candidate(raise_runner_up(3.0))),
        "not greedy": as_trace(*candidate(same, choose=penalised)),
    }
    for name, cand in hostile.items():
        assert compare(oracle, cand, doctrine).exit_code == 1, name
        for cut in sorted(CUTS):
            assert _not_a_pass(oracle, apply_cuts(cand, oracle, [(cut, 5)]), doctrine), (name, cut)


def test_a_greedy_break_past_the_first_divergence_is_on_a_context_of_its_own() -> None:
    """Past its first divergence a free run is on its own context, whose lists a pin with a
    floor does not ask for: a break there is not counted (dropping it would shed the penalty)."""
    head = TraceHeader("oracle", "m", 3, {"name": "e", "version": "1"})
    o = PromptRecord("p", (1,), (5, 6), top_logprobs=[[[5, -0.5], [9, -0.5]], [[6, -0.1], [3, -3.0]]])
    c = PromptRecord("p", (1,), (9, 6), top_logprobs=[[[5, -0.5], [9, -0.5]], [[3, -0.1], [6, -0.2]]])
    r = compare(Trace(head, (o,), "o.jsonl"), Trace(replace(head, role="candidate"), (c,), "c.jsonl"), Doctrine())
    assert r.not_greedy_total == 0 and r.verdict == "ratified_pass"
    shared = replace(c, token_ids=(5, 6))  # the same break where it shares the oracle's context
    r = compare(Trace(head, (o,), "o.jsonl"), Trace(replace(head, role="candidate"), (shared,), "c.jsonl"), Doctrine())
    assert r.not_greedy_total == 1
