"""The doctrine calibration recommends: the smallest near-tie threshold that ratifies every
honest flip the sample shows (see `gate.core.calibration.calibrate` for the measuring).

Pure functions over the rival pairs' gaps and drifts; no I/O, no torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from gate.core.calibration.stats import MIN_PAIRS_FOR_CONFIDENCE, ROUND_MNATS, Recommendation, fmt_num
from gate.core.verdict.doctrine import DEFAULT_NEAR_TIE_MNATS
from gate.text import plural


def _round_up(x: float, unit: float) -> float:
    return float(math.ceil(x / unit - 1e-9) * unit)


def contender_bound(gaps: np.ndarray, drifts: np.ndarray) -> float:
    """The largest drift among the rivals that drift could overturn: the fixed point of
    T = max{drift : gap <= T}, approached from the largest drift of all.

    A rival whose oracle gap exceeds T can flip only by drifting more than its gap; rivals
    deep in the tail drift more (their logprobs carry more error) but cannot flip, so
    they must not widen the threshold. Each step drops the rivals too far away to be
    overturned by the previous bound; the bound never grows, so this ends.
    """
    if drifts.size == 0:
        return 0.0
    bound = float(drifts.max())
    while True:
        near = drifts[gaps <= bound]
        nxt = float(near.max()) if near.size else 0.0
        if nxt >= bound:
            return bound
        bound = nxt


@dataclass(frozen=True, slots=True)
class Pairs:
    """The (oracle gap, gap drift) of every rival pair at matched positions, in mnats, and
    the same in grid steps (NaN where the oracle recorded no logit)."""

    gap: np.ndarray
    drift: np.ndarray
    gap_ulps: np.ndarray
    drift_ulps: np.ndarray

    @classmethod
    def of(cls, pair_gap: Sequence[float], pair_drift: Sequence[float], pair_step: Sequence[float]) -> Pairs:
        """From the samples: gaps and drifts in mnats, grid steps in nats."""
        gap = np.asarray(pair_gap, dtype=np.float64)
        drift = np.asarray(pair_drift, dtype=np.float64)
        step_mnats = 1000.0 * np.asarray(pair_step, dtype=np.float64)
        return cls(gap, drift, gap / step_mnats, drift / step_mnats)

    @classmethod
    def from_lists(
        cls, gap: Sequence[float], drift: Sequence[float], step_mnats: Sequence[float] | None = None
    ) -> Pairs:
        g = np.asarray(gap, dtype=np.float64)
        d = np.asarray(drift, dtype=np.float64)
        st = np.asarray(step_mnats if step_mnats is not None else [math.nan] * g.size, dtype=np.float64)
        return cls(g, d, g / st, d / st)


def recommend(
    pairs: Pairs,
    *,
    flip_gaps_mnats: Sequence[float] = (),
    flip_gaps_ulps: Sequence[float] | None = None,
    top2_mnats: Sequence[float] = (),
    top2_ulps: Sequence[float] | None = None,
    dtype: str = "bfloat16",
) -> Recommendation:
    """The near-tie allowance that ratifies every honest flip the sample shows, and why.

    In mnats: the contender bound of the gap drift (`contender_bound`), raised to the
    largest oracle gap at which a rival's drift did overturn it and to the largest gap at
    which the candidate actually flipped, rounded up to a multiple of 5. In grid steps
    (when the oracle's logits are known): the same in steps, rounded up to a whole step.
    Either ratifies the same honest flips; the one with fewer oracle positions inside it
    (where a defect that small would pass unseen) is recommended, never both (a gap within
    either is a near tie, so both together are looser than each). The sample is presumed
    honest: calibrate against a candidate you trust.
    """
    reasons: list[str] = []
    top2 = np.asarray(list(top2_mnats), dtype=np.float64)
    if pairs.drift.size == 0:
        reasons.append(
            "no rival token was listed by both engines at a matched position, so no drift could be measured; "
            f"keep the default --near-tie-mnats {fmt_num(DEFAULT_NEAR_TIE_MNATS)}"
        )
        return Recommendation(DEFAULT_NEAR_TIE_MNATS, None, dtype, "none", tuple(reasons))
    has_ulps = flip_gaps_ulps is not None and bool(np.isfinite(pairs.drift_ulps).any())
    if float(pairs.drift.max()) == 0.0 and not len(flip_gaps_mnats):
        reasons.append(
            f"over {pairs.drift.size} rival pairs the gap between the oracle's token and each rival "
            "did not move at all: the candidate reproduces the oracle's logprob gaps bit for bit, so any "
            "nonzero gap is a defect (--near-tie-mnats 0; exact ties stay ratified)"
        )
        confidence = "high" if pairs.drift.size >= MIN_PAIRS_FOR_CONFIDENCE else "low"
        return Recommendation(0.0, 0.0 if has_ulps else None, dtype, confidence, tuple(reasons), 0.0, 0)

    bound = contender_bound(pairs.gap, pairs.drift)
    near = pairs.gap <= bound
    contenders = int(near.sum())
    overturned = pairs.gap[(pairs.drift > pairs.gap) & (pairs.gap > 0.0)]
    worst_overturned = float(overturned.max()) if overturned.size else 0.0
    worst_flip = max(flip_gaps_mnats, default=0.0)
    mnats = max(_round_up(max(bound, worst_overturned, worst_flip), ROUND_MNATS), ROUND_MNATS)
    near_drift = pairs.drift[near]
    if contenders:
        reasons.append(
            f"a rival can only flip when the gap between it and the oracle's token moves by more than that gap; "
            f"among the {contenders} rival pairs within {bound:.1f} mnats of the oracle's token (the ones a drift "
            f"that size could overturn) the gap moved by a median {float(np.median(near_drift)):.1f}, p99 "
            f"{float(np.quantile(near_drift, 0.99, method='inverted_cdf')):.1f} and at most {bound:.1f} mnats"
        )
    else:
        reasons.append(
            "a rival can only flip when the gap between it and the oracle's token moves by more than that gap; "
            "no rival in this sample was near enough for the drift seen to overturn it"
        )
    far = pairs.drift[~near]
    if far.size:
        reasons.append(
            f"the {far.size} rivals further away moved more (at most {float(far.max()):.1f} mnats) but "
            + (
                "never by more than their own gap, so they cannot flip and do not widen the threshold"
                if worst_overturned <= bound
                else f"one moved past its gap of {worst_overturned:.1f} mnats, which the threshold covers"
            )
        )
    if len(flip_gaps_mnats):
        reasons.append(
            f"the candidate itself flipped at {plural(len(flip_gaps_mnats), 'position')} with oracle gaps up to "
            f"{worst_flip:.1f} mnats (exact ties aside)"
        )
    reasons.append(
        f"so --near-tie-mnats {fmt_num(mnats)} (rounded up to {fmt_num(ROUND_MNATS)}) ratifies every honest flip this "
        "sample shows; the sample is presumed honest: calibrate against a candidate you trust"
    )
    if mnats < DEFAULT_NEAR_TIE_MNATS:
        reasons.append(
            f"that is below the default {fmt_num(DEFAULT_NEAR_TIE_MNATS)} mnats: the default would let defects of "
            f"{fmt_num(mnats)}-{fmt_num(DEFAULT_NEAR_TIE_MNATS)} mnats through as near ties"
        )
    elif mnats > DEFAULT_NEAR_TIE_MNATS:
        reasons.append(
            f"that is above the default {fmt_num(DEFAULT_NEAR_TIE_MNATS)} mnats: under the default an honest flip "
            f"with a gap of {fmt_num(DEFAULT_NEAR_TIE_MNATS)}-{fmt_num(mnats)} mnats would fail as a defect"
        )
    blind_m = int(((top2 > 0.0) & (top2 <= mnats)).sum())
    if top2.size:
        reasons.append(
            f"the cost: {blind_m} of {top2.size} oracle positions ({100.0 * blind_m / top2.size:.1f}%) have a top-2 "
            f"gap within {fmt_num(mnats)} mnats; a flip there is ratified, so a defect that small passes unseen at them"
        )
    confidence = "high" if contenders >= MIN_PAIRS_FOR_CONFIDENCE else "low"
    chosen = Recommendation(mnats, None, dtype, confidence, (), bound, contenders)
    if has_ulps and flip_gaps_ulps is not None:
        known = np.isfinite(pairs.drift_ulps)
        gap_u, drift_u = pairs.gap_ulps[known], pairs.drift_ulps[known]
        bound_u = contender_bound(gap_u, drift_u)
        over_u = gap_u[(drift_u > gap_u) & (gap_u > 0.0)]
        top_u = max(bound_u, float(over_u.max()) if over_u.size else 0.0, max(flip_gaps_ulps, default=0.0))
        ulps = max(float(math.ceil(top_u - 1e-6)), 1.0)
        steps = np.asarray(list(top2_ulps or ()), dtype=np.float64)
        blind_u = int(((steps > 0.0) & (steps <= ulps)).sum())
        everywhere = steps.size == top2.size
        reasons.append(
            f"in steps of the {dtype} grid at the oracle's top logit, rivals within {bound_u:.2f} steps moved by "
            f"at most {bound_u:.2f} steps"
            + (f" and the candidate flipped at gaps up to {max(flip_gaps_ulps):.2f} steps" if flip_gaps_ulps else "")
            + f": --near-tie-mnats 0 --near-tie-ulps {fmt_num(ulps)} would ratify the same flips, "
            f"with {blind_u} positions ({100.0 * blind_u / max(top2.size, 1):.1f}%) inside it"
        )
        if everywhere and blind_u < blind_m:
            chosen = Recommendation(0.0, ulps, dtype, confidence, (), bound, contenders)
            reasons.append(
                f"the grid allowance sees more: {blind_u} positions within it against {blind_m} within "
                f"{fmt_num(mnats)} mnats, so it is the recommendation (the drift scales with the logit's size here)"
            )
        else:
            why = (
                f"{blind_u} positions within it against {blind_m} within {fmt_num(mnats)} mnats: the drift does not "
                "scale with the top logit's grid here (small top logits drift by many of their fine steps)"
                if everywhere
                else "not every oracle position has a recorded logit"
            )
            reasons.append(f"the fixed threshold stays the recommendation: {why}")
        reasons.append(
            "set one allowance, not both: a gap within either is a near tie, so both together are looser than each"
        )
    if confidence == "low":
        reasons.append(
            f"only {contenders} rival pairs near enough to flip (fewer than {MIN_PAIRS_FOR_CONFIDENCE}): the "
            "largest drift of a small sample underestimates the engines' true spread; calibrate on a larger "
            "suite before relying on it"
        )
    return replace(chosen, reasons=tuple(reasons))
