"""Calibration records: the drift figures between a candidate and the oracle, the doctrine
they recommend, and the HTML report's figures of them (`calibration_figures`).

The measuring is `gate.core.calibration.calibrate`; these are plain frozen records with `to_dict()`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gate.core.verdict.doctrine import Doctrine, Evidence
from gate.core.verdict.evidence import RunDrift

CALIBRATION_VERSION = 1
# Reports find a calibration here: `result.meta["calibration"]` is `Calibration.to_dict()`.
CALIBRATION_META_KEY = "calibration"
# The HTML report draws each dict of `result.meta["figures"]` as a histogram.
FIGURES_META_KEY = "figures"
# Bin edges (mnats) for the histograms reports plot; the last bin is open-ended.
HISTOGRAM_EDGES_MNATS: tuple[float, ...] = (0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0)
# Grid steps at which the oracle's top-2 gaps are counted when its raw logits are known.
GAP_STEPS: tuple[int, ...] = (1, 2, 4)
# Below this many rival pairs the largest drift is a weak estimate of the population's.
MIN_PAIRS_FOR_CONFIDENCE = 200
# Recommended thresholds are rounded up to a multiple of this many mnats.
ROUND_MNATS = 5.0


# --------------------------------------------------------------------------- records


@dataclass(frozen=True, slots=True)
class Distribution:
    """Summary of a sample of non-negative figures. Quantiles are observed values
    (inverted CDF: the smallest x with at least q of the sample at or below it)."""

    count: int
    median: float | None
    p90: float | None
    p99: float | None
    max: float | None
    mean: float | None

    @classmethod
    def of(cls, values: Sequence[float] | np.ndarray) -> Distribution:
        arr = np.asarray(values, dtype=np.float64)
        if arr.size == 0:
            return cls(0, None, None, None, None, None)
        q = np.quantile(arr, [0.5, 0.9, 0.99], method="inverted_cdf")
        return cls(int(arr.size), float(q[0]), float(q[1]), float(q[2]), float(arr.max()), float(arr.mean()))

    def to_dict(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "median": self.median,
            "p90": self.p90,
            "p99": self.p99,
            "max": self.max,
            "mean": self.mean,
        }


@dataclass(frozen=True, slots=True)
class Histogram:
    """Counts over `HISTOGRAM_EDGES_MNATS`: bin j holds edges[j] <= x < edges[j+1]; the
    last bin is x >= edges[-1]. `zero` counts exact zeros separately (also in bin 0)."""

    edges: tuple[float, ...]
    counts: tuple[int, ...]
    zero: int

    @classmethod
    def of(cls, values: Sequence[float] | np.ndarray, edges: tuple[float, ...] = HISTOGRAM_EDGES_MNATS) -> Histogram:
        arr = np.asarray(values, dtype=np.float64)
        idx = np.searchsorted(np.asarray(edges), arr, side="right") - 1
        counts = np.bincount(np.clip(idx, 0, len(edges) - 1), minlength=len(edges))
        return cls(edges=edges, counts=tuple(int(c) for c in counts), zero=int((arr == 0.0).sum()))

    def to_dict(self) -> dict[str, Any]:
        return {"edges_mnats": list(self.edges), "counts": list(self.counts), "zero": self.zero}


@dataclass(frozen=True, slots=True)
class TopGaps:
    """The oracle's own top-2 gaps over every position with at least two listed tokens.

    `within_steps[n]` counts gaps of at most n steps of the dtype grid at the position's
    top logit (positive gaps only; exact ties are counted apart), over the positions whose
    raw logit the oracle recorded (`positions_with_logits`); None when it recorded none.
    """

    positions: int
    exact_ties: int
    distribution: Distribution
    smallest_positive_mnats: float | None
    p1_mnats: float | None
    p10_mnats: float | None
    positions_with_logits: int
    within_steps: Mapping[int, int] | None
    histogram: Histogram

    def to_dict(self) -> dict[str, Any]:
        return {
            "positions": self.positions,
            "exact_ties": self.exact_ties,
            "mnats": self.distribution.to_dict(),
            "smallest_positive_mnats": self.smallest_positive_mnats,
            "p1_mnats": self.p1_mnats,
            "p10_mnats": self.p10_mnats,
            "positions_with_logits": self.positions_with_logits,
            "within_steps": None if self.within_steps is None else {str(k): v for k, v in self.within_steps.items()},
            "histogram": self.histogram.to_dict(),
        }


@dataclass(frozen=True, slots=True)
class Recommendation:
    """A doctrine the sample supports, with the reasoning in words."""

    near_tie_mnats: float
    near_tie_ulps: float | None
    dtype: str
    confidence: str  # "high", "low" (small sample) or "none" (nothing to measure)
    reasons: tuple[str, ...]
    # The largest gap drift among rivals near enough to be overturned (see
    # `contender_bound`), and how many rival pairs that was.
    contender_bound_mnats: float | None = None
    contender_pairs: int = 0

    @property
    def doctrine(self) -> Doctrine:
        return Doctrine(near_tie_mnats=self.near_tie_mnats, near_tie_ulps=self.near_tie_ulps, dtype=self.dtype)

    @property
    def flags(self) -> str:
        """The command-line options that select this doctrine."""
        out = f"--near-tie-mnats {fmt_num(self.near_tie_mnats)}"
        if self.near_tie_ulps is not None:
            out += f" --near-tie-ulps {fmt_num(self.near_tie_ulps)}"
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "near_tie_mnats": self.near_tie_mnats,
            "near_tie_ulps": self.near_tie_ulps,
            "dtype": self.dtype,
            "confidence": self.confidence,
            "contender_bound_mnats": self.contender_bound_mnats,
            "contender_pairs": self.contender_pairs,
            "flags": self.flags,
            "reasons": list(self.reasons),
        }


@dataclass(frozen=True, slots=True)
class EvidenceCalibration:
    """The evidence rule's quantities over one run, and the rule they support."""

    floor_logit: float
    flips: int  # flips with a positive gap (exact ties need no evidence)
    measured_flips: int  # of them, those with the oracle's logit and the candidate's top-k
    oracle_gap_units: Distribution  # u_o at the measured flips
    own_margin_units: Distribution  # u_c at the measured flips
    drift: RunDrift  # |swing| over the positions sharing the oracle's context, in units
    recommended: Evidence | None  # None: nothing to measure (no oracle logits)
    confidence: str  # "high", "low" or "none"
    reasons: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "unit": f"grid step at max(|oracle top logit|, {fmt_num(self.floor_logit)})",
            "floor_logit": self.floor_logit,
            "flips": self.flips,
            "measured_flips": self.measured_flips,
            "oracle_gap_units": self.oracle_gap_units.to_dict(),
            "own_margin_units": self.own_margin_units.to_dict(),
            "drift_units": self.drift.to_dict(),
            "drift_judged": self.drift.judged,
            "recommended": self.recommended.to_dict() if self.recommended is not None else None,
            "confidence": self.confidence,
            "reasons": list(self.reasons),
        }


@dataclass(frozen=True, slots=True)
class Verdicts:
    """The candidate's verdict under the default doctrine and under the recommended one."""

    default: str
    default_summary: str
    recommended: str
    recommended_summary: str
    # Under the doctrine the oracle trace carries (a pin's own), where it carries one.
    pin: str | None = None
    pin_summary: str | None = None
    # Under the recommended evidence doctrine (`Calibration.evidence`), where one is.
    evidence: str | None = None
    evidence_summary: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {
            "default": self.default,
            "default_summary": self.default_summary,
            "recommended": self.recommended,
            "recommended_summary": self.recommended_summary,
        }
        if self.pin is not None:
            out["pin"] = self.pin
            out["pin_summary"] = self.pin_summary or ""
        if self.evidence is not None:
            out["evidence"] = self.evidence
            out["evidence_summary"] = self.evidence_summary or ""
        return out


@dataclass(frozen=True, slots=True)
class Calibration:
    """Drift between an oracle and a candidate trace over matched positions.

    All figures are in mnats except `*_ulps` (steps of `dtype`'s grid at the oracle's top
    logit, on positions whose raw logit the oracle recorded) and the counts.
    """

    model: str
    oracle_engine: str
    candidate_engine: str
    dtype: str
    prompts: int
    positions: int
    positions_matched: int
    chosen_abs_delta: Distribution
    shared_abs_delta: Distribution
    gap_drift: Distribution
    gap_drift_ulps: Distribution
    contender_gap_drift: Distribution
    flip_gaps: Distribution
    chosen_logit_abs_delta: Distribution
    kl: Distribution
    shared_support: Distribution
    shared_mass: Distribution
    top1_compared: int
    top1_agreed: int
    top1_source: str
    top_gaps: TopGaps
    gap_drift_histogram: Histogram
    recommendation: Recommendation
    verdicts: Verdicts | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    # The evidence rule's quantities and the evidence doctrine they support.
    evidence: EvidenceCalibration | None = None
    # The raw samples behind the figures (mnats), for plots; not serialised.
    samples: Mapping[str, tuple[float, ...]] = field(default_factory=dict, compare=False, repr=False)

    @property
    def top1_agreement(self) -> float | None:
        return self.top1_agreed / self.top1_compared if self.top1_compared else None

    @property
    def summary(self) -> str:
        return f"recommended doctrine: {self.recommendation.flags}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "gate_calibration": CALIBRATION_VERSION,
            "model": self.model,
            "oracle_engine": self.oracle_engine,
            "candidate_engine": self.candidate_engine,
            "dtype": self.dtype,
            "prompts": self.prompts,
            "positions": self.positions,
            "positions_matched": self.positions_matched,
            "drift": {
                "chosen_abs_delta_mnats": self.chosen_abs_delta.to_dict(),
                "shared_topk_abs_delta_mnats": self.shared_abs_delta.to_dict(),
                "gap_drift_mnats": self.gap_drift.to_dict(),
                "gap_drift_ulps": self.gap_drift_ulps.to_dict(),
                "contender_gap_drift_mnats": self.contender_gap_drift.to_dict(),
                "candidate_flip_gaps_mnats": self.flip_gaps.to_dict(),
                "chosen_logit_abs_delta_mnats": self.chosen_logit_abs_delta.to_dict(),
                "gap_drift_histogram": self.gap_drift_histogram.to_dict(),
            },
            "kl_shared_topk_mnats": {
                **self.kl.to_dict(),
                "note": "KL(oracle || candidate) over the tokens both lists carry, each side renormalised over them",
                "shared_support_tokens": self.shared_support.to_dict(),
                "oracle_mass_on_shared_support": self.shared_mass.to_dict(),
            },
            "top1": {
                "compared": self.top1_compared,
                "agreed": self.top1_agreed,
                "agreement": self.top1_agreement,
                "source": self.top1_source,
            },
            "oracle_top2_gaps": self.top_gaps.to_dict(),
            "recommendation": self.recommendation.to_dict(),
            "verdicts": self.verdicts.to_dict() if self.verdicts is not None else None,
            "evidence": self.evidence.to_dict() if self.evidence is not None else None,
            "notes": list(self.notes),
        }


# --------------------------------------------------------------------------- figures


def fmt_num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def calibration_figures(cal: Calibration, near_tie_mnats: float | None = None) -> list[dict[str, Any]]:
    """Histograms of the drift for the HTML report (`result.meta["figures"]`), each with
    the recommended threshold (and `near_tie_mnats`, the doctrine in use) marked."""
    rec = cal.recommendation.near_tie_mnats
    marks = [{"at": rec, "label": f"recommended {fmt_num(rec)}"}] if rec > 0 else []
    if near_tie_mnats is not None and near_tie_mnats > 0 and near_tie_mnats != rec:
        marks.append({"at": near_tie_mnats, "label": f"threshold {fmt_num(near_tie_mnats)}"})
    samples = cal.samples
    return [
        {
            "title": "Gap drift: how far the gap between the oracle's token and each rival moved",
            "unit": "mnats",
            "values": list(samples.get("gap_drift", ())),
            "markers": marks,
            "note": f"{cal.gap_drift.count} rival pairs at {cal.positions_matched} matched positions; "
            "a candidate flips when this exceeds the oracle's top-2 gap",
        },
        {
            "title": "Drift of the chosen token's logprob |Δ|",
            "unit": "mnats",
            "values": list(samples.get("chosen_abs_delta", ())),
            "note": "includes the shift of the normaliser, which moves every token alike",
        },
        {
            "title": "Oracle top-2 gaps",
            "unit": "mnats",
            "values": list(samples.get("top2_gaps", ())),
            "markers": marks,
            "note": f"{cal.top_gaps.exact_ties} exact ties of {cal.top_gaps.positions} positions; "
            "a flip at a gap left of the threshold would be ratified",
        },
    ]
