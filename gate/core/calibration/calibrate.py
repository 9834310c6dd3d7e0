"""Calibration: how far an honest candidate drifts from the oracle, and the doctrine that follows.

Pure functions over two traces (no I/O, no torch). Drift is measured only where both
engines saw the same context and chose the same token: the common prefix of each prompt's
free run (after a free-run divergence the contexts differ, and so would the logprobs for
reasons that are not drift).

The figure that decides a near-tie threshold is the *gap drift*: at a matched position
with oracle choice o and a rival t listed by both engines, how much the gap
`lp(o) - lp(t)` moved, `|(O[o] - O[t]) - (C[o] - C[t])|`. The candidate flips to t exactly
when that drift exceeds the oracle's gap, so the largest honest gap drift is the smallest
threshold that ratifies every honest flip the sample shows. The per-token drift
(`|O[t] - C[t]|`) is reported too but includes a shift of the normaliser (logsumexp) that
moves every token alike and cannot flip anything.

`attach_calibration` hands a calibration to the reports of a `GateResult`:
`meta["calibration"]` (`CALIBRATION_META_KEY`) is `Calibration.to_dict()`, and
`meta["figures"]` gains the drift histograms in the HTML report's figure shape
(`calibration_figures`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from gate.core.calibration.evidence_fit import measure_evidence
from gate.core.calibration.recommend import Pairs, recommend
from gate.core.calibration.stats import (
    CALIBRATION_META_KEY,
    FIGURES_META_KEY,
    GAP_STEPS,
    Calibration,
    Distribution,
    Histogram,
    TopGaps,
    Verdicts,
    calibration_figures,
)
from gate.core.traces.trace import PromptRecord, Trace
from gate.core.verdict.adjudicate import compare, oracle_dtype
from gate.core.verdict.doctrine import DEFAULT_FLOOR_LOGIT, Doctrine
from gate.core.verdict.grid import grid_step
from gate.core.verdict.result import GateResult
from gate.errors import InputError

# --------------------------------------------------------------------------- computation


def _logits(rec: PromptRecord) -> list[float | None] | None:
    raw = rec.token_logits
    if raw is None or len(raw) != len(rec.token_ids):
        return None
    return [float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None for v in raw]


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


@dataclass(slots=True)
class _Samples:
    chosen: list[float] = field(default_factory=list)
    shared: list[float] = field(default_factory=list)
    # One entry per (matched position, rival both engines list): the oracle's gap to the
    # rival and how far it moved (mnats), and the grid step at the top logit (nats; NaN
    # when the oracle recorded no logit there).
    pair_gap: list[float] = field(default_factory=list)
    pair_drift: list[float] = field(default_factory=list)
    pair_step: list[float] = field(default_factory=list)
    chosen_logit: list[float] = field(default_factory=list)
    kl: list[float] = field(default_factory=list)
    support: list[float] = field(default_factory=list)
    mass: list[float] = field(default_factory=list)
    top2: list[float] = field(default_factory=list)
    top2_steps: list[float] = field(default_factory=list)


def _kl_shared(o: Mapping[int, float], c: Mapping[int, float], shared: Sequence[int]) -> tuple[float, float]:
    """KL(P || Q) in nats over `shared`, both renormalised; and the oracle mass on `shared`."""
    lo = np.array([o[t] for t in shared], dtype=np.float64)
    lc = np.array([c[t] for t in shared], dtype=np.float64)
    norm_o = np.logaddexp.reduce(lo)
    norm_c = np.logaddexp.reduce(lc)
    po = lo - norm_o
    pc = lc - norm_c
    kl = float(np.sum(np.exp(po) * (po - pc)))
    return max(kl, 0.0), float(math.exp(norm_o))


def _oracle_position(
    s: _Samples, top: Sequence[Sequence[Any]], logit: float | None, dtype: str
) -> tuple[bool, float | None]:
    """Record the oracle's top-2 gap at one position; return (has_gap, step in nats)."""
    step = grid_step(logit, dtype) if logit is not None else None
    if len(top) < 2:
        return False, step
    gap = float(top[0][1]) - float(top[1][1])
    s.top2.append(1000.0 * gap)
    if step is not None:
        s.top2_steps.append(gap / step)
    return True, step


def _matched_position(
    s: _Samples,
    o_top: Sequence[Sequence[Any]],
    c_top: Sequence[Sequence[Any]],
    chosen: int,
    step: float | None,
) -> None:
    o = {int(t): float(lp) for t, lp in o_top}
    c = {int(t): float(lp) for t, lp in c_top}
    shared = [t for t in o if t in c]
    if chosen in c:
        s.chosen.append(1000.0 * abs(o[chosen] - c[chosen]))
    s.shared.extend(1000.0 * abs(o[t] - c[t]) for t in shared)
    if chosen in c:
        for t in shared:
            if t == chosen:
                continue
            drift = abs((o[chosen] - o[t]) - (c[chosen] - c[t]))
            s.pair_gap.append(1000.0 * (o[chosen] - o[t]))
            s.pair_drift.append(1000.0 * drift)
            s.pair_step.append(step if step is not None else math.nan)
    if shared:
        kl, mass = _kl_shared(o, c, shared)
        s.kl.append(1000.0 * kl)
        s.support.append(float(len(shared)))
        s.mass.append(mass)


def calibrate(
    oracle: Trace,
    candidate: Trace,
    *,
    dtype: str | None = None,
    with_verdicts: bool = True,
    pin_doctrine: Doctrine | None = None,
) -> Calibration:
    """Drift statistics of `candidate` against `oracle` and the doctrine they support.

    `pin_doctrine`: the oracle's own doctrine (a pin's), whose verdict is reported beside
    the default's and the recommended one's.

    Prompts are matched by id as in `compare` (the same input errors apply). The candidate
    must carry top-k logprobs: drift cannot be measured from tokens alone.
    """
    if oracle.role != "oracle":
        raise InputError(f"{oracle.path}: expected an oracle trace, found role {oracle.role!r}")
    if candidate.role != "candidate":
        raise InputError(f"{candidate.path}: expected a candidate trace, found role {candidate.role!r}")
    dtype = dtype or oracle_dtype(oracle)
    grid_step(1.0, dtype)  # an unknown dtype is an input error now, not halfway through
    cand = candidate.by_id()
    missing = [r.id for r in oracle.records if r.id not in cand]
    if missing:
        raise InputError(f"{candidate.path}: missing prompt(s) {', '.join(map(repr, missing[:5]))} the oracle has")
    if oracle.records and all(cand[r.id].top_logprobs is None for r in oracle.records):
        raise InputError(
            f"{candidate.path}: the candidate trace has no top_logprobs; calibration measures logprob drift "
            "and needs them (record the candidate with top_k >= 1)"
        )

    s = _Samples()
    positions = matched = 0
    top1_compared = top1_agreed = 0
    forced_everywhere = True
    oracle_logits_seen = 0
    for o_rec in oracle.records:
        c_rec = cand[o_rec.id]
        if c_rec.prompt_token_ids != o_rec.prompt_token_ids:
            raise InputError(
                f"prompt {o_rec.id!r}: prompt_token_ids differ between {oracle.path} and {candidate.path} "
                "(tokenizer or chat-template drift): calibration needs the same prompts"
            )
        o_top = o_rec.top_logprobs
        assert o_top is not None  # the reader guarantees it for oracle records
        n = len(o_rec.token_ids)
        positions += n
        o_logits = _logits(o_rec)
        c_logits = _logits(c_rec)
        prefix = _common_prefix(o_rec.token_ids, c_rec.token_ids)
        c_top = c_rec.top_logprobs
        steps: list[float | None] = []
        for i in range(n):
            logit = o_logits[i] if o_logits is not None else None
            oracle_logits_seen += logit is not None
            _, step = _oracle_position(s, o_top[i], logit, dtype)
            steps.append(step)
        for i in range(min(prefix, n)):
            matched += 1
            if c_top is not None and i < len(c_top):
                _matched_position(s, o_top[i], c_top[i], o_rec.token_ids[i], steps[i])
            if o_logits is not None and c_logits is not None:
                a, b = o_logits[i], c_logits[i]
                if a is not None and b is not None:
                    s.chosen_logit.append(1000.0 * abs(a - b))
        forced = c_rec.forced_token_ids
        if forced is not None and len(forced) == n:
            top1_compared += n
            top1_agreed += sum(1 for i in range(n) if forced[i] == o_rec.token_ids[i])
        else:
            # Without forced data only the common prefix and the first divergence share
            # the oracle's context.
            forced_everywhere = False
            top1_compared += min(prefix, n) + (1 if prefix < n and prefix < len(c_rec.token_ids) else 0)
            top1_agreed += min(prefix, n)

    any_forced = any(cand[r.id].forced_token_ids is not None for r in oracle.records)
    top1_source = "forced" if forced_everywhere and oracle.records else ("mixed" if any_forced else "free_run")
    top_gaps = _top_gaps(s, oracle_logits_seen)
    notes: list[str] = []
    if not oracle_logits_seen:
        notes.append("the oracle recorded no raw logits (token_logits): no figures in grid steps, no ULP doctrine")
    pairs = Pairs.of(s.pair_gap, s.pair_drift, s.pair_step)
    default = compare(oracle, candidate, Doctrine(dtype=dtype))
    flips = [
        (d.oracle_minus_candidate_mnats, d.gap_ulps)
        for d in default.divergences
        if d.oracle_minus_candidate_mnats is not None and d.oracle_minus_candidate_mnats > 0.0
    ]
    rec = recommend(
        pairs,
        flip_gaps_mnats=[g for g, _ in flips],
        flip_gaps_ulps=[u for _, u in flips if u is not None] if oracle_logits_seen else None,
        top2_mnats=s.top2,
        top2_ulps=s.top2_steps,
        dtype=dtype,
    )
    bound = rec.contender_bound_mnats
    floor = (
        pin_doctrine.evidence.floor_logit
        if pin_doctrine is not None and pin_doctrine.evidence is not None
        else DEFAULT_FLOOR_LOGIT
    )
    evidence = measure_evidence(oracle, candidate, list(default.divergences), dtype=dtype, floor_logit=floor)
    cal = Calibration(
        model=oracle.header.model,
        oracle_engine=_engine_name(oracle),
        candidate_engine=_engine_name(candidate),
        dtype=dtype,
        prompts=len(oracle.records),
        positions=positions,
        positions_matched=matched,
        chosen_abs_delta=Distribution.of(s.chosen),
        shared_abs_delta=Distribution.of(s.shared),
        gap_drift=Distribution.of(pairs.drift),
        gap_drift_ulps=Distribution.of(pairs.drift_ulps[np.isfinite(pairs.drift_ulps)]),
        contender_gap_drift=Distribution.of(pairs.drift[pairs.gap <= bound] if bound is not None else []),
        flip_gaps=Distribution.of([g for g, _ in flips]),
        chosen_logit_abs_delta=Distribution.of(s.chosen_logit),
        kl=Distribution.of(s.kl),
        shared_support=Distribution.of(s.support),
        shared_mass=Distribution.of(s.mass),
        top1_compared=top1_compared,
        top1_agreed=top1_agreed,
        top1_source=top1_source,
        top_gaps=top_gaps,
        gap_drift_histogram=Histogram.of(pairs.drift),
        recommendation=rec,
        notes=tuple(notes),
        evidence=evidence,
        samples={
            "chosen_abs_delta": tuple(s.chosen),
            "gap_drift": tuple(s.pair_drift),
            "kl": tuple(s.kl),
            "top2_gaps": tuple(s.top2),
        },
    )
    if with_verdicts:
        recommended = compare(oracle, candidate, rec.doctrine)
        own = compare(oracle, candidate, pin_doctrine) if pin_doctrine is not None else None
        # The evidence doctrine recommended: the pin's own (else the default) with its
        # evidence rule replaced by the measured one, field by field as the resolver does.
        with_evidence = (
            compare(oracle, candidate, replace(pin_doctrine or Doctrine(dtype=dtype), evidence=evidence.recommended))
            if evidence.recommended is not None
            else None
        )
        cal = replace(
            cal,
            verdicts=Verdicts(
                default.verdict,
                default.summary,
                recommended.verdict,
                recommended.summary,
                pin=own.verdict if own is not None else None,
                pin_summary=own.summary if own is not None else None,
                evidence=with_evidence.verdict if with_evidence is not None else None,
                evidence_summary=with_evidence.summary if with_evidence is not None else None,
            ),
        )
    return cal


def _engine_name(trace: Trace) -> str:
    name = str(trace.header.engine.get("name", ""))
    version = trace.header.engine.get("version")
    return f"{name} {version}" if version else name


def _top_gaps(s: _Samples, with_logits: int) -> TopGaps:
    arr = np.asarray(s.top2, dtype=np.float64)
    positive = arr[arr > 0.0]
    steps = np.asarray(s.top2_steps, dtype=np.float64)
    within: dict[int, int] | None = None
    if with_logits:
        within = {n: int(((steps > 0.0) & (steps <= n)).sum()) for n in GAP_STEPS}

    def q(p: float) -> float | None:
        return float(np.quantile(arr, p, method="inverted_cdf")) if arr.size else None

    return TopGaps(
        positions=int(arr.size),
        exact_ties=int((arr == 0.0).sum()),
        distribution=Distribution.of(arr),
        smallest_positive_mnats=float(positive.min()) if positive.size else None,
        p1_mnats=q(0.01),
        p10_mnats=q(0.10),
        positions_with_logits=with_logits,
        within_steps=within,
        histogram=Histogram.of(arr),
    )


def attach_calibration(result: GateResult, oracle: Trace, candidate: Trace) -> GateResult:
    """`result` with `meta["calibration"]` set and the drift figures appended to
    `meta["figures"]` when the candidate carries top-k logprobs; unchanged (never an error)
    when drift cannot be measured."""
    if all(r.top_logprobs is None for r in candidate.records):
        return result
    try:
        cal = calibrate(oracle, candidate, with_verdicts=False)
    except InputError:
        return result
    figures = result.meta.get(FIGURES_META_KEY)
    prior = list(figures) if isinstance(figures, list) else []
    meta = {
        **result.meta,
        CALIBRATION_META_KEY: cal.to_dict(),
        FIGURES_META_KEY: prior + calibration_figures(cal, result.doctrine.near_tie_mnats),
    }
    return replace(result, meta=meta)
