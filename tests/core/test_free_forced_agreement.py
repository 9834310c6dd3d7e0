"""A candidate's free-run and forced lists at the contexts both saw must agree within the
honest floor (`gate.core.verdict.free_forced`): a disagreement beyond it fails by its own rule,
an engine that forces through the very path it generates with agrees with itself, and less
evidence is never a laxer verdict (dropping forced or free-run lists makes the run not
judged, every cut keeps a disagreeing run failing). Pure: generated traces, no torch."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest
from helpers.evidence_cuts import CUTS, apply_cuts
from helpers.free_forced_traces import floor_between, two_minded
from helpers.generated_traces import DOCTRINES, build
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gate.core.traces.trace import Trace
from gate.core.verdict.adjudicate import compare
from gate.core.verdict.distribution import RULE_NOT_JUDGED
from gate.core.verdict.doctrine import Doctrine
from gate.core.verdict.free_forced import RULE_FREE_FORCED, self_kl_mnats
from gate.errors import InputError
from gate.reports.reason import reason


def test_free_run_and_forced_decode_that_disagree_fail_by_their_own_rule() -> None:
    oracle, cand = two_minded()
    doctrine = floor_between(oracle, cand)
    r = compare(oracle, cand, doctrine)
    d = r.distribution
    assert d is not None and d.judged and not d.beyond and not d.insufficient
    ff = d.free_forced
    assert ff is not None and ff.positions == len(oracle.records) * len(oracle.records[0].token_ids)
    assert ff.kl_mean_mnats is not None and ff.kl_mean_mnats > 2 * d.overall.kl_mean_mnats  # type: ignore[operator]
    assert d.disagrees and r.verdict == "fail" and r.exit_code == 1
    js = r.to_dict()["distribution"]["free_forced"]
    assert js["disagree"] and js["rule"] == RULE_FREE_FORCED and js["beyond_figures"]
    assert js["kl_mnats"]["mean"] == pytest.approx(ff.kl_mean_mnats)
    # The first line of every report names the rule.
    assert RULE_FREE_FORCED in reason(r) and reason(r).startswith("FAIL")


def test_the_same_lists_both_ways_agree_and_pass() -> None:
    """An engine that forces through the very path it generates with (the HF engine through
    its KV cache) reports the same list twice: KL 0, a pass."""
    oracle, cand = two_minded(spread=0.0)
    r = compare(oracle, cand, DOCTRINES["floor"])
    d = r.distribution
    assert d is not None and d.free_forced is not None and d.free_forced.positions > 0
    assert d.free_forced.kl_max_mnats == pytest.approx(0.0, abs=1e-9)
    assert not d.disagrees and r.exit_code == 0, reason(r)


def test_generated_gate_run_traces_agree_with_themselves() -> None:
    """`build` records a candidate as `gate run` does, its free run up to the first divergence
    being its forced lists: never the free-forced rule, whatever its noise."""
    for seed in range(10):
        for noise in (0.05, 0.8):
            oracle, cand = build(seed, noise)
            d = compare(oracle, cand, DOCTRINES["floor"]).distribution
            assert d is not None and not d.disagrees
            assert d.free_forced is not None and (d.free_forced.kl_max_mnats or 0.0) == pytest.approx(0.0, abs=1e-9)


def test_self_kl_is_symmetric_and_zero_on_equal_lists() -> None:
    a = [[1, math.log(0.6)], [2, math.log(0.3)], [3, math.log(0.1)]]
    b = [[1, math.log(0.4)], [2, math.log(0.4)], [4, math.log(0.2)]]
    assert self_kl_mnats(a, a, 3) == pytest.approx(0.0, abs=1e-9)
    assert self_kl_mnats(a, b, 3) == pytest.approx(self_kl_mnats(b, a, 3))
    assert self_kl_mnats(a, b, 3) > 0


def test_no_figure_without_forced_data_and_no_rule_without_a_floor() -> None:
    oracle, cand = two_minded()
    r = compare(oracle, cand, Doctrine())
    d = r.distribution
    assert d is not None and d.free_forced is not None and d.free_forced.positions > 0
    assert not d.disagrees and r.exit_code == 0  # no floor: shown, not judged
    js = r.to_dict()["distribution"]["free_forced"]
    assert js["judged"] is False and js["rule"] is None


# --------------------------------------------------------------------------- less evidence


def _not_a_pass(oracle: Trace, cand: Trace, doctrine: Doctrine) -> bool:
    try:
        return compare(oracle, cand, doctrine).exit_code != 0
    except InputError:
        return True  # refused (exit 2): not a pass either


@pytest.mark.parametrize("part", ["forced", "free"])
def test_dropping_either_side_makes_the_run_not_judged_never_a_pass(part: str) -> None:
    """Without its forced lists (or its free-run lists) the run has no second opinion to
    disagree with, and it has not reported what the floor was measured with: not judged,
    a fail by `distribution_not_judged`, never a pass."""
    oracle, cand = two_minded()
    doctrine = floor_between(oracle, cand)
    assert compare(oracle, cand, doctrine).distribution.disagrees  # type: ignore[union-attr]
    name = "drop_forced_lists" if part == "forced" else "drop_lists"
    for seed in range(12):
        cut = apply_cuts(cand, oracle, [(name, seed)])
        r = compare(oracle, cut, doctrine)
        assert r.exit_code == 1, (name, seed)
        d = r.distribution
        assert d is not None
        assert d.disagrees or (d.insufficient and r.to_dict()["distribution"]["rule"] == RULE_NOT_JUDGED)
    everything = replace(
        cand,
        records=tuple(
            replace(c, **({"top_logprobs": None} if part == "free" else {}))
            if part == "free"
            else replace(c, forced_top_logprobs=None)
            for c in cand.records
        ),
    )
    r = compare(oracle, everything, doctrine)
    assert r.exit_code == 1 and r.distribution is not None and r.distribution.insufficient


def test_every_cut_keeps_a_disagreeing_run_failing() -> None:
    oracle, cand = two_minded()
    doctrine = floor_between(oracle, cand)
    for name in sorted(CUTS):
        for seed in range(4):
            assert _not_a_pass(oracle, apply_cuts(cand, oracle, [(name, seed)]), doctrine), (name, seed)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 50),
    spread=st.sampled_from([0.2, 0.3, 0.5]),
    cuts=st.lists(st.tuples(st.sampled_from(sorted(CUTS)), st.integers(0, 2**31)), min_size=1, max_size=4),
)
def test_no_cut_sequence_turns_a_disagreeing_run_into_a_pass(
    seed: int, spread: float, cuts: list[tuple[str, int]]
) -> None:
    oracle, cand = two_minded(seed, spread)
    doctrine = floor_between(oracle, cand)
    r = compare(oracle, cand, doctrine)
    assert r.exit_code == 1 and r.distribution is not None and r.distribution.disagrees
    assert _not_a_pass(oracle, apply_cuts(cand, oracle, cuts), doctrine), cuts


def test_random_cut_sequences_fixed_sample() -> None:
    rng = random.Random(1)
    names = sorted(CUTS)
    for seed in range(10):
        oracle, cand = two_minded(seed, 0.3)
        doctrine = floor_between(oracle, cand)
        for _ in range(15):
            cuts = [(rng.choice(names), rng.randrange(2**31)) for _ in range(rng.randrange(1, 4))]
            assert _not_a_pass(oracle, apply_cuts(cand, oracle, cuts), doctrine), (seed, cuts)
