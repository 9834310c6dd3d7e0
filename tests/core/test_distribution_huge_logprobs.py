"""Lists at logprobs of huge magnitude are measured for what they say, not rounded into
agreement: a list whose every entry is float32's lowest value (-3.4e38: what a masked
logit becomes in a broken kernel) says its tokens are equally likely, and the KL used to
be 0 for it (the normaliser m + log k rounds to m at that magnitude, so each token read
as probability 1), which passed the distribution verdict for an engine whose lists are
garbage."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from helpers.generated_traces import DOCTRINES, build

from gate.core.traces.trace import Trace
from gate.core.verdict.adjudicate import compare
from gate.core.verdict.distribution import canonical, kl_mnats

LOWEST_F32 = -3.4028234663852886e38
ORACLE = [[5, -0.5], [6, -1.5], [7, -2.5]]


def _kl_to_uniform(top: list[list[float]]) -> float:
    lse = math.log(sum(math.exp(lp) for _, lp in top))
    p = [math.exp(lp - lse) for _, lp in top]
    return 1000.0 * sum(x * math.log(x * len(p)) for x in p)


@pytest.mark.parametrize("value", [LOWEST_F32, -1e300, -1.7e308])
def test_equal_entries_at_any_magnitude_read_as_uniform(value: float) -> None:
    kl, support = kl_mnats(ORACLE, canonical([[5, value], [6, value], [7, value]], 3))
    assert support == 3
    assert kl == pytest.approx(_kl_to_uniform(ORACLE), rel=1e-9)
    assert kl == pytest.approx(kl_mnats(ORACLE, canonical([[5, -1.0], [6, -1.0], [7, -1.0]], 3))[0], rel=1e-9)


def test_a_shift_of_every_entry_changes_nothing() -> None:
    cand = [[5, -0.7], [6, -1.2], [7, -2.9]]
    base, _ = kl_mnats(ORACLE, canonical(cand, 3))
    for shift in (-1e3, -1e6, -1e9):
        kl, _ = kl_mnats(ORACLE, canonical([[t, lp + shift] for t, lp in cand], 3))
        assert kl == pytest.approx(base, rel=1e-4, abs=1e-6), shift


def test_a_candidate_whose_lists_are_all_float32_lowest_does_not_pass_the_floor() -> None:
    oracle, cand = build(seed=3, noise=0.0)
    doctrine = DOCTRINES["floor"]
    assert compare(oracle, cand, doctrine).exit_code == 0

    def masked(tops: object) -> object:
        return None if tops is None else [[[int(t), LOWEST_F32] for t, _ in pos] for pos in tops]  # type: ignore[attr-defined]

    recs = tuple(
        replace(
            r,
            top_logprobs=masked(r.top_logprobs),  # type: ignore[arg-type]
            forced_top_logprobs=masked(r.forced_top_logprobs),  # type: ignore[arg-type]
        )
        for r in cand.records
    )
    r = compare(oracle, Trace(cand.header, recs, cand.path), doctrine)
    assert r.exit_code == 1 and r.distribution is not None and r.distribution.beyond, r.summary
    # Beyond by its KL too, not only by its same-top rate (ties at the top miss it).
    kl = r.distribution.overall.kl_mean_mnats
    assert kl is not None and kl > doctrine.floor.kl_mean_limit, kl  # type: ignore[union-attr]
