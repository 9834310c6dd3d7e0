"""The pin's float32 reference (`gate.core.verdict.reference`): with the lists and the
doctrine's `reference_floor` the figures against the reference decide the distribution
verdict; a pin without them keeps the oracle's floor and says so; a floor without lists is
refused; the JSON report carries `distribution.ratio`. Pure: generated traces, no torch."""

from __future__ import annotations

from dataclasses import replace

import pytest
from helpers.generated_traces import DOCTRINES, FLOOR, REFERENCE_FLOOR, build

from gate.core.traces.trace import Trace
from gate.core.verdict.adjudicate import compare
from gate.core.verdict.distribution import JUDGED_AGAINST_ORACLE, JUDGED_AGAINST_REFERENCE
from gate.core.verdict.doctrine import Doctrine, resolve_doctrine
from gate.core.verdict.floor import Floor
from gate.core.verdict.reference import REFERENCE_KEY, reference_of
from gate.errors import InputError
from gate.reports.distribution import distribution_lines

REF = DOCTRINES["reference floor"]


def _without_reference(trace: Trace) -> Trace:
    recs = tuple(replace(r, extra={k: v for k, v in r.extra.items() if k != REFERENCE_KEY}) for r in trace.records)
    return replace(trace, records=recs)


def test_the_reference_decides_where_the_pin_carries_it_and_its_floor() -> None:
    oracle, cand = build(3, 0.3)
    d = compare(oracle, cand, REF).distribution
    assert d is not None and d.judged and d.by_reference
    assert d.reference is not None and d.reference.positions == d.overall.positions
    assert d.deciding is d.reference and d.deciding_floor == REFERENCE_FLOOR
    out = d.to_dict()
    assert out["judged_against"] == JUDGED_AGAINST_REFERENCE
    assert out["reference"]["limits"]["kl_mean_mnats"] == REFERENCE_FLOOR.kl_mean_limit
    f, base = d.reference, d.reference_baseline
    assert f.kl_mean_mnats is not None and f.kl_p99_mnats is not None and f.same_top_rate is not None
    assert base is not None and out["reference"]["oracle_kl_mean_mnats"] == base
    assert out["reference"]["kl_mean_excess_mnats"] == pytest.approx(f.kl_mean_mnats - base)
    expected = max(
        (f.kl_mean_mnats - base) / REFERENCE_FLOOR.kl_mean_limit,
        f.kl_p99_mnats / REFERENCE_FLOOR.kl_p99_limit,
        (1 - f.same_top_rate) / REFERENCE_FLOOR.same_top_miss_limit,
    )
    assert out["ratio"] == pytest.approx(expected)


def test_the_mean_is_judged_in_excess_of_the_oracles_own_distance_from_the_reference() -> None:
    """The oracle itself as the candidate is exactly as far from the reference as the oracle:
    excess 0, within any floor, however far bf16 sits from float32; a candidate as far again
    is beyond an excess floor smaller than the oracle's own distance."""
    oracle, cand = build(3, 0.3)
    own = replace(
        cand,
        records=tuple(
            replace(c, token_ids=o.token_ids, top_logprobs=o.top_logprobs, forced_token_ids=None, extra={})
            for o, c in zip(oracle.records, cand.records, strict=True)
        ),
    )
    tight = Floor(1e-3, 1e5, 0.01, 1.5, "excess floor")
    d = compare(oracle, own, Doctrine(reference_floor=tight)).distribution
    assert d is not None and d.judged and d.reference is not None and d.reference_baseline is not None
    assert d.reference_baseline > 0.01  # bf16 noise of REFERENCE_NOISE: the oracle is not the reference
    assert d.reference.kl_mean_mnats == pytest.approx(d.reference_baseline)
    assert not d.beyond
    r = compare(oracle, cand, Doctrine(reference_floor=Floor(1e-3, 1e5, 0.01, 1.5, "excess floor")))
    assert r.distribution is not None and r.distribution.beyond
    assert "beyond the oracle's own" in r.distribution.beyond_figures[0]


def test_a_run_within_the_oracle_floor_but_beyond_the_reference_floor_fails() -> None:
    """The reference's floor is the tighter one: a build the oracle's floor lets through is
    caught against the reference, and the report says which statistic decided."""
    oracle, cand = build(5, 0.3)
    tight = Floor(0.05, 1.0, 0.99, 1.5, "tight")
    loose = Floor(1e4, 1e5, 0.01, 1.5, "loose")
    by_oracle = compare(oracle, cand, Doctrine(floor=loose)).distribution
    assert by_oracle is not None and by_oracle.judged and not by_oracle.beyond
    r = compare(oracle, cand, Doctrine(floor=loose, reference_floor=tight))
    assert r.distribution is not None and r.distribution.beyond and r.exit_code == 1
    assert all("vs the float32 reference" in x for x in r.distribution.beyond_figures)


def test_a_pin_without_a_reference_keeps_the_oracle_floor_and_says_so() -> None:
    oracle, cand = build(3, 0.3)
    plain = _without_reference(oracle)
    r = compare(plain, cand, Doctrine(floor=FLOOR))
    d = r.distribution
    assert d is not None and d.reference is None and not d.by_reference
    assert d.to_dict()["judged_against"] == JUDGED_AGAINST_ORACLE
    assert d.ratio is not None and d.to_dict()["ratio"] == d.ratio
    text = "\n".join(line for line, _ in distribution_lines(r))
    assert "this pin carries no float32 reference" in text


def test_a_reference_floor_without_the_lists_is_refused() -> None:
    oracle, cand = build(3, 0.3)
    with pytest.raises(InputError, match=r"reference_floor.*reference_top_logprobs"):
        compare(_without_reference(oracle), cand, REF)


def test_a_reference_with_holes_or_bad_values_is_refused() -> None:
    oracle, _ = build(3, 0.3)
    first = oracle.records[0]
    holed = replace(first, extra={k: v for k, v in first.extra.items() if k != REFERENCE_KEY})
    with pytest.raises(InputError, match="missing"):
        reference_of(replace(oracle, records=(holed, *oracle.records[1:])))
    lists = list(first.extra[REFERENCE_KEY])
    lists[2] = [[1, 0.5]]  # a logprob above 0
    bad = replace(first, extra={**first.extra, REFERENCE_KEY: lists})
    with pytest.raises(InputError, match="p0"):
        reference_of(replace(oracle, records=(bad, *oracle.records[1:])))
    short = replace(first, extra={**first.extra, REFERENCE_KEY: lists[:3]})
    with pytest.raises(InputError, match="one list per generated token"):
        reference_of(replace(oracle, records=(short, *oracle.records[1:])))


def test_the_doctrine_reads_and_checks_a_reference_floor() -> None:
    raw = {"floor": FLOOR.to_dict(), "reference_floor": REFERENCE_FLOOR.to_dict()}
    d = resolve_doctrine(raw, source="pin")
    assert d.reference_floor == REFERENCE_FLOOR and d.to_dict()["reference_floor"] == REFERENCE_FLOOR.to_dict()
    with pytest.raises(InputError, match="reference_floor"):
        resolve_doctrine({"reference_floor": {**REFERENCE_FLOOR.to_dict(), "margin": 0.5}}, source="pin")


def test_no_cut_passes_a_trace_failing_against_the_reference() -> None:
    """Less evidence is never a laxer verdict with the reference inside the verdict: traces
    beyond the reference's floor (and passing the oracle's) stay failing under every cut
    sequence of `helpers.evidence_cuts` (the hypothesis property runs every doctrine of
    `DOCTRINES`, the reference's included: tests/core/test_monotonicity.py)."""
    import random

    from helpers.evidence_cuts import CUTS, apply_cuts

    tight = Doctrine(floor=Floor(1e4, 1e5, 0.01, 1.5, "loose"), reference_floor=Floor(0.3, 8.0, 0.97, 1.5, "t"))
    rng = random.Random(1)
    names = sorted(CUTS)
    checked = 0
    for seed in range(100):
        oracle, cand = build(seed, rng.choice([0.1, 0.3]))
        r = compare(oracle, cand, tight)
        if not (r.distribution is not None and r.distribution.beyond) or r.counts["defects"]:
            continue
        for _ in range(15):
            cuts = [(rng.choice(names), rng.randrange(2**31)) for _ in range(rng.randrange(1, 4))]
            try:
                code = compare(oracle, apply_cuts(cand, oracle, cuts), tight).exit_code
            except InputError:
                code = 2
            assert code != 0, (seed, cuts)
        checked += 1
        if checked == 15:
            break
    assert checked == 15


def test_the_default_pin_carries_its_float32_reference_and_floor() -> None:
    """The embedded default judges against float32: lists at every position, the floor in the
    doctrine, and the oracle itself (its own lists as a candidate) well inside it."""
    from gate.core.pins.pin import doctrine_for, load_pin
    from gate.models.default import DEFAULT_MODEL

    pin = load_pin(DEFAULT_MODEL)
    ref = reference_of(pin.trace)
    assert ref is not None and all(len(ref[r.id]) == len(r.token_ids) for r in pin.trace.records)
    doctrine = doctrine_for(pin)
    assert doctrine.reference_floor is not None and doctrine.floor is not None
    own = replace(
        pin.trace,
        header=replace(pin.trace.header, role="candidate", extra={}),
        records=tuple(replace(r, extra={}) for r in pin.trace.records),
    )
    d = compare(pin.trace, own, doctrine).distribution
    assert d is not None and d.judged and d.by_reference and not d.beyond
    assert d.ratio is not None and d.ratio <= 0.67
