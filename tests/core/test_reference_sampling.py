"""No sampling allowance: the distribution verdict's limits are the same at every evidence size.

A run of a few prompts measures the excess over fewer positions, so its figure scatters
more (the separation study: ±0.16 mnats at about 100 positions of the default pin, ±0.05
at its whole 1,249). A limit widened for small runs would pass on a shard what the whole
suite fails: fewer positions would be a laxer verdict. The study measured the cost of not
widening it (honest shards of 8-12 slices beyond the limit) and the verdict keeps one limit;
these tests hold it there. Pure: generated traces, no torch."""

from __future__ import annotations

from dataclasses import replace

import pytest
from helpers.generated_traces import DOCTRINES, build

from gate.core.traces.trace import Trace
from gate.core.verdict.adjudicate import compare

REF = DOCTRINES["reference floor"]


def _copies(trace: Trace, n: int) -> Trace:
    """The same prompts `n` times over (ids made unique): the same figures at n x the positions."""
    recs = tuple(replace(r, id=f"{r.id}~{i}") for i in range(n) for r in trace.records)
    return replace(trace, records=recs)


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("noise", [0.05, 0.1, 0.3])  # inside (ratio 0.3), just beyond (1.14), far beyond
def test_fewer_positions_with_the_same_figures_are_never_judged_laxer(seed: int, noise: float) -> None:
    oracle, cand = build(seed, noise)
    small = compare(oracle, cand, REF).distribution
    big = compare(_copies(oracle, 4), _copies(cand, 4), REF).distribution
    assert small is not None and big is not None and small.judged and big.judged
    assert big.overall.positions == 4 * small.overall.positions
    assert small.reference is not None and big.reference is not None
    assert small.reference.kl_mean_mnats == pytest.approx(big.reference.kl_mean_mnats)
    assert small.reference_baseline == pytest.approx(big.reference_baseline)
    assert small.deciding_floor == big.deciding_floor  # one limit, whatever the evidence size
    # Beyond with more positions: beyond with fewer, by every figure the bigger run is beyond on.
    if big.beyond:
        assert small.beyond
        assert [f.split(" ")[0:2] for f in small.beyond_figures] == [f.split(" ")[0:2] for f in big.beyond_figures]
    assert small.ratio is not None and big.ratio is not None
    assert small.ratio == pytest.approx(big.ratio, rel=0.05)


def test_the_cases_above_meet_both_verdicts() -> None:
    """The property is not vacuous: among the cases some fail and some pass."""
    ratios = [compare(*build(0, n), REF).distribution.ratio for n in (0.05, 0.1)]  # type: ignore[union-attr]
    assert ratios[0] is not None and ratios[1] is not None
    assert ratios[0] < 1 < ratios[1] < 1.3  # one inside, one beyond by less than a small run's scatter
