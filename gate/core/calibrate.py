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

from gate.core.adjudicate import GateResult, compare, grid_step, oracle_dtype
from gate.core.doctrine import DEFAULT_NEAR_TIE_MNATS, Doctrine
from gate.core.trace import PromptRecord, Trace
from gate.errors import InputError

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
        out = f"--near-tie-mnats {_num(self.near_tie_mnats)}"
        if self.near_tie_ulps is not None:
            out += f" --near-tie-ulps {_num(self.near_tie_ulps)}"
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
class Verdicts:
    """The candidate's verdict under the default doctrine and under the recommended one."""

    default: str
    default_summary: str
    recommended: str
    recommended_summary: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "default": self.default,
            "default_summary": self.default_summary,
            "recommended": self.recommended,
            "recommended_summary": self.recommended_summary,
        }


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
            "notes": list(self.notes),
        }


# --------------------------------------------------------------------------- computation


def _logits(rec: PromptRecord) -> list[float | None] | None:
    raw = rec.extra.get("token_logits")
    if not isinstance(raw, list) or len(raw) != len(rec.token_ids):
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
) -> Calibration:
    """Drift statistics of `candidate` against `oracle` and the doctrine they support.

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
        notes.append(
            "the oracle recorded no raw logits (token_logits): no figures in grid steps, no ULP doctrine"
        )
    pairs = Pairs.of(s)
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
        samples={
            "chosen_abs_delta": tuple(s.chosen),
            "gap_drift": tuple(s.pair_drift),
            "kl": tuple(s.kl),
            "top2_gaps": tuple(s.top2),
        },
    )
    if with_verdicts:
        recommended = compare(oracle, candidate, rec.doctrine)
        cal = replace(
            cal, verdicts=Verdicts(default.verdict, default.summary, recommended.verdict, recommended.summary)
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


# --------------------------------------------------------------------------- recommendation


def _round_up(x: float, unit: float) -> float:
    return float(math.ceil(x / unit - 1e-9) * unit)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


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
    def of(cls, s: _Samples) -> Pairs:
        gap = np.asarray(s.pair_gap, dtype=np.float64)
        drift = np.asarray(s.pair_drift, dtype=np.float64)
        step_mnats = 1000.0 * np.asarray(s.pair_step, dtype=np.float64)
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
            f"keep the default --near-tie-mnats {_num(DEFAULT_NEAR_TIE_MNATS)}"
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
            f"the candidate itself flipped at {len(flip_gaps_mnats)} positions with oracle gaps up to "
            f"{worst_flip:.1f} mnats (exact ties aside)"
        )
    reasons.append(
        f"so --near-tie-mnats {_num(mnats)} (rounded up to {_num(ROUND_MNATS)}) ratifies every honest flip this "
        "sample shows; the sample is presumed honest: calibrate against a candidate you trust"
    )
    if mnats < DEFAULT_NEAR_TIE_MNATS:
        reasons.append(
            f"that is below the default {_num(DEFAULT_NEAR_TIE_MNATS)} mnats: the default would let defects of "
            f"{_num(mnats)}-{_num(DEFAULT_NEAR_TIE_MNATS)} mnats through as near ties"
        )
    elif mnats > DEFAULT_NEAR_TIE_MNATS:
        reasons.append(
            f"that is above the default {_num(DEFAULT_NEAR_TIE_MNATS)} mnats: under the default an honest flip "
            f"with a gap of {_num(DEFAULT_NEAR_TIE_MNATS)}-{_num(mnats)} mnats would fail as a defect"
        )
    blind_m = int(((top2 > 0.0) & (top2 <= mnats)).sum())
    if top2.size:
        reasons.append(
            f"the cost: {blind_m} of {top2.size} oracle positions ({100.0 * blind_m / top2.size:.1f}%) have a top-2 "
            f"gap within {_num(mnats)} mnats; a flip there is ratified, so a defect that small passes unseen at them"
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
            + f": --near-tie-mnats 0 --near-tie-ulps {_num(ulps)} would ratify the same flips, "
            f"with {blind_u} positions ({100.0 * blind_u / max(top2.size, 1):.1f}%) inside it"
        )
        if everywhere and blind_u < blind_m:
            chosen = Recommendation(0.0, ulps, dtype, confidence, (), bound, contenders)
            reasons.append(
                f"the grid allowance sees more: {blind_u} positions within it against {blind_m} within "
                f"{_num(mnats)} mnats, so it is the recommendation (the drift scales with the logit's size here)"
            )
        else:
            why = (
                f"{blind_u} positions within it against {blind_m} within {_num(mnats)} mnats: the drift does not "
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


def calibration_figures(cal: Calibration, near_tie_mnats: float | None = None) -> list[dict[str, Any]]:
    """Histograms of the drift for the HTML report (`result.meta["figures"]`), each with
    the recommended threshold (and `near_tie_mnats`, the doctrine in use) marked."""
    rec = cal.recommendation.near_tie_mnats
    marks = [{"at": rec, "label": f"recommended {_num(rec)}"}] if rec > 0 else []
    if near_tie_mnats is not None and near_tie_mnats > 0 and near_tie_mnats != rec:
        marks.append({"at": near_tie_mnats, "label": f"threshold {_num(near_tie_mnats)}"})
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
