"""The distribution verdict: is the candidate the reference model within honest noise?

A token-exact gate sees a build only where it flips a token; a build that computes another
numerical model (quantised weights, a lossy KV cache, a position bug) moves every
distribution a little and flips only a handful of near ties in a suite. Its distributions
show it everywhere. At every position where both engines saw the oracle's context
(`gate.core.verdict.coverage`: a prompt's free run up to and including its first
divergence, and every position of a prompt the candidate was teacher-forced through with
its own top-k, `forced_top_logprobs`; where both exist at a position, the worse of the two
counts, so a disagreement between its decode path and its prefill counts against it):

- KL(oracle || candidate) over the oracle's list, both sides renormalised over it, in mnats
  (`kl_mnats`): an oracle token the candidate's list (its first top_k entries) lacks is
  charged at the list's smallest probability (nothing outside its top k is larger), or at
  the largest it gives a token the oracle does not list (the slot it may have been moved
  into), whichever is worse; hiding an entry, or putting an unlisted token in its place,
  never lowers it;
- same top: the candidate's list's maximum is the oracle's token (the lowest id among equal
  maxima, as `torch.argmax`; a token the oracle does not list tied at the top is a miss);
- Δp: the candidate's probability of the oracle's token minus the oracle's, in percent
  (where the candidate's list holds it).

They are summarised the way llama.cpp's `perplexity --kl-divergence` prints them (mean ±
standard error, median, p99, max) over all positions and by each position's class (match,
exact tie, near tie, defect). With the pin's honest `Floor`, a run whose coverage is
complete (`Coverage.complete`) and which has at least `MIN_POSITIONS` measured positions is
judged: a mean KL, p99 KL or same-top miss rate beyond the floor's by its margin is beyond
honest drift, and the verdict is fail. A run with a floor whose coverage is incomplete is not
judged, and that is a fail too (`RULE_NOT_JUDGED`): less evidence is never a laxer verdict.
Where a judged run's own free-run and forced lists on one context disagree beyond the same
limits, it fails by its own rule (`gate.core.verdict.free_forced`, `RULE_FREE_FORCED`).
Pure: no I/O, no torch.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gate.core.traces.trace import Trace
from gate.core.verdict.coverage import Coverage, context_lists, coverage_of, needed
from gate.core.verdict.evidence import lp_map
from gate.core.verdict.floor import Floor
from gate.core.verdict.floor_check import beyond_floor, limits, ratio_of
from gate.core.verdict.free_forced import FreeForced, free_forced_of
from gate.core.verdict.kl import canonical, kl_mnats
from gate.core.verdict.kl import kl_common_mnats as kl_common_mnats  # re-exported
from gate.core.verdict.own_lists import CandidateEvidence, OwnLists, candidate_evidence
from gate.core.verdict.reference import REFERENCE_KEY, Reference, oracle_own_mean, reference_of
from gate.errors import InputError

# Fewer measured positions than this and the distribution is shown but not judged.
MIN_POSITIONS = 100
# Position classes, from `PromptResult.outcomes` (gate.core.verdict.result OUTCOME_*).
CLASS_OF_OUTCOME = {"m": "match", "e": "exact_tie", "n": "near_tie", "d": "defect"}
CLASSES = ("match", "exact_tie", "near_tie", "defect")
BEYOND_WHY = "numerics beyond honest drift (a different numerical model: quantisation, a lossy cache, a bug)"
# The rule a run fails by when a pin with a floor cannot judge it (`RunDistribution.insufficient`).
RULE_NOT_JUDGED = "distribution_not_judged"
NOT_JUDGED_WHY = (
    "the distribution cannot be judged against the pin's honest floor: the candidate reported less than the "
    "floor was measured with"
)


@dataclass(frozen=True, slots=True)
class Point:
    """One position's figures (kl in mnats, dp in percent; dp None: the oracle's token is
    not in the candidate's top-k)."""

    prompt_id: str
    position: int
    cls: str
    kl_mnats: float
    same_top: bool
    dp_pct: float | None
    support: int


def same_top(oracle_token: int, cand: Mapping[int, float], oracle_ids: Collection[int]) -> bool:
    """The candidate's top is the oracle's token: listed at the list's maximum, and any other
    token at that maximum is one the oracle lists with a higher id (`torch.argmax` takes the
    lowest id among equal maxima). A token the oracle does not list, tied at the top, makes it
    a miss: replacing a listed token by an unlisted one can then lose a hit, never win one."""
    lp = cand.get(oracle_token)
    if lp is None:
        return False
    peak = max(cand.values())
    if lp < peak:
        return False
    return all(t == oracle_token or (t in oracle_ids and t > oracle_token) for t, v in cand.items() if v >= peak)


def top_token(top: Sequence[Sequence[Any]]) -> int | None:
    """The list's maximum, the lowest id among equal maxima (`torch.argmax`'s choice)."""
    best: tuple[float, int] | None = None
    for t, lp in top:  # pairs, or the rows of an array
        key = (-float(lp), int(t))
        if best is None or key < best:
            best = key
    return None if best is None else best[1]


def point_at(
    prompt_id: str,
    position: int,
    cls: str,
    oracle_top: Sequence[Sequence[Any]],
    oracle_token: int,
    ctop: Any,
    keep: int,
) -> Point:
    """One position's figures from the candidate's list there."""
    cand = canonical(ctop, keep)
    kl, support = kl_mnats(oracle_top, cand)
    olp = lp_map(oracle_top)[oracle_token]
    dp = 100.0 * (math.exp(cand[oracle_token]) - math.exp(olp)) if oracle_token in cand else None
    return Point(prompt_id, position, cls, kl, same_top(oracle_token, cand, lp_map(oracle_top)), dp, support)


def _top_of(top: Sequence[Sequence[Any]]) -> int:
    t = top_token(top)
    assert t is not None  # reference lists are never empty (`reference_of`)
    return t


def worse(a: Point, b: Point) -> Point:
    """Two measurements of one context (free run and forced): the larger KL, and a same-top
    miss if either misses. A candidate whose decode path and prefill disagree is judged by
    whichever is further from the oracle."""
    first, second = (a, b) if a.kl_mnats >= b.kl_mnats else (b, a)
    if first.same_top and not second.same_top:
        return Point(first.prompt_id, first.position, first.cls, first.kl_mnats, False, first.dp_pct, first.support)
    return first


def points(
    oracle: Trace,
    candidate: Trace,
    outcomes: Mapping[str, str],
    evidence: CandidateEvidence | None = None,
    reference: Reference | None = None,
) -> list[Point]:
    """One point per position where the candidate saw the oracle's context and reported a list
    (the worse of its free-run and forced lists where it has both). With `reference` (the
    pin's float32 lists, `gate.core.verdict.reference`) each list is measured against the
    reference's list there and its top token instead of the oracle's; the positions and the
    entries each list needs are the same."""
    cand = candidate.by_id()
    own_of = evidence if evidence is not None else candidate_evidence(oracle, candidate)
    top_k = oracle.header.top_k
    out: list[Point] = []
    for o in oracle.records:
        c = cand.get(o.id)
        if c is None or o.top_logprobs is None:
            continue
        marks = outcomes.get(o.id, "")
        at: dict[int, Point] = {}
        for i, _, ctop in context_lists(o, c, own_of.own(o.id)):
            if ctop is None or not len(ctop):  # (a list or an array: never its truth value)
                continue
            otop = o.top_logprobs[i]
            cls = CLASS_OF_OUTCOME.get(marks[i] if i < len(marks) else "m", "match")
            keep = needed(otop, top_k)
            if reference is not None:
                rtop = reference[o.id][i]
                p = point_at(o.id, i, cls, rtop, _top_of(rtop), ctop, keep)
            else:
                p = point_at(o.id, i, cls, otop, o.token_ids[i], ctop, keep)
            at[i] = worse(at[i], p) if i in at else p
        out.extend(at[i] for i in sorted(at))
    return out


def run_coverage(oracle: Trace, candidate: Trace, evidence: CandidateEvidence) -> Coverage:
    """Which lists the floor needs that the candidate did not report (`gate.core.verdict.coverage`)."""
    cand = candidate.by_id()
    pairs: list[tuple[Any, Any, OwnLists]] = [
        (o, cand[o.id], evidence.own(o.id)) for o in oracle.records if o.id in cand and o.top_logprobs is not None
    ]
    return coverage_of(pairs, oracle.header.top_k, candidate.header.top_k)


@dataclass(frozen=True, slots=True)
class Figures:
    """The llama.cpp-style summary of a set of positions (None: nothing to summarise)."""

    positions: int
    kl_mean_mnats: float | None
    kl_se_mnats: float | None
    kl_median_mnats: float | None
    kl_p99_mnats: float | None
    kl_max_mnats: float | None
    same_top_rate: float | None
    same_top_se: float | None
    dp_positions: int
    dp_mean_pct: float | None
    dp_se_pct: float | None
    dp_rms_pct: float | None
    dp_min_pct: float | None
    dp_median_pct: float | None
    dp_max_pct: float | None
    no_common_support: int

    @classmethod
    def of(cls, pts: Sequence[Point]) -> Figures:
        n = len(pts)
        kls = sorted(p.kl_mnats for p in pts)
        dps = sorted(p.dp_pct for p in pts if p.dp_pct is not None)
        same = sum(p.same_top for p in pts)
        rate = same / n if n else None
        kl_mean, kl_se = _mean_se(kls)
        dp_mean, dp_se = _mean_se(dps)
        return cls(
            positions=n,
            kl_mean_mnats=kl_mean,
            kl_se_mnats=kl_se,
            kl_median_mnats=quantile(kls, 0.5),
            kl_p99_mnats=quantile(kls, 0.99),
            kl_max_mnats=kls[-1] if kls else None,
            same_top_rate=rate,
            same_top_se=math.sqrt(rate * (1.0 - rate) / n) if rate is not None else None,
            dp_positions=len(dps),
            dp_mean_pct=dp_mean,
            dp_se_pct=dp_se,
            dp_rms_pct=math.sqrt(math.fsum(d * d for d in dps) / len(dps)) if dps else None,
            dp_min_pct=dps[0] if dps else None,
            dp_median_pct=quantile(dps, 0.5),
            dp_max_pct=dps[-1] if dps else None,
            no_common_support=sum(1 for p in pts if p.support == 0),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "positions": self.positions,
            "kl_mnats": {
                "mean": self.kl_mean_mnats,
                "se": self.kl_se_mnats,
                "median": self.kl_median_mnats,
                "p99": self.kl_p99_mnats,
                "max": self.kl_max_mnats,
            },
            "same_top": {"rate": self.same_top_rate, "se": self.same_top_se},
            "delta_p_pct": {
                "positions": self.dp_positions,
                "mean": self.dp_mean_pct,
                "se": self.dp_se_pct,
                "rms": self.dp_rms_pct,
                "min": self.dp_min_pct,
                "median": self.dp_median_pct,
                "max": self.dp_max_pct,
            },
            "no_common_support": self.no_common_support,
        }


def quantile(sorted_values: Sequence[float], q: float) -> float | None:
    """Nearest rank (the median of an even count: the mean of the middle two)."""
    n = len(sorted_values)
    if not n:
        return None
    if q == 0.5 and n % 2 == 0:
        return (sorted_values[n // 2 - 1] + sorted_values[n // 2]) / 2.0
    return float(sorted_values[min(n - 1, max(0, math.ceil(q * n) - 1))])


def _mean_se(values: Sequence[float]) -> tuple[float | None, float | None]:
    n = len(values)
    if not n:
        return None, None
    mean = math.fsum(values) / n
    if n < 2:
        return mean, None
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


@dataclass(frozen=True, slots=True)
class RunDistribution:
    """A run's distribution figures, by class, and the verdict against the pin's floor.

    With a float32 reference (`gate.core.verdict.reference`: the pin's lists and its
    doctrine's `reference_floor`) the figures against the reference decide; without one,
    the figures against the oracle and `floor` do, as before."""

    overall: Figures
    by_class: tuple[tuple[str, Figures], ...]
    floor: Floor | None
    # The figures beyond the deciding floor's limits, in words (empty: within, or too few positions).
    beyond_figures: tuple[str, ...] = ()
    # What the candidate reported against what the floor was measured with (None: not checked).
    coverage: Coverage | None = None
    # Its own free-run lists against its forced ones where both saw one context (None: not measured).
    free_forced: FreeForced | None = None
    # The same positions measured against the pin's float32 reference (None: the pin has none).
    reference: Figures | None = None
    # The honest floor against that reference (the doctrine's `reference_floor`).
    reference_floor: Floor | None = None
    # The oracle's own mean KL from the reference at the same positions: the mean is judged in
    # excess of it (`gate.core.verdict.floor_check`).
    reference_baseline: float | None = None

    @property
    def by_reference(self) -> bool:
        """The float32 reference decides (the pin carries its lists and its floor)."""
        return self.reference is not None and self.reference_floor is not None

    @property
    def deciding_floor(self) -> Floor | None:
        return self.reference_floor if self.by_reference else self.floor

    @property
    def deciding(self) -> Figures:
        """The figures the verdict is taken on."""
        return self.reference if self.by_reference and self.reference is not None else self.overall

    @property
    def complete(self) -> bool:
        return self.coverage is None or self.coverage.complete

    @property
    def judged(self) -> bool:
        return self.deciding_floor is not None and self.complete and self.overall.positions >= MIN_POSITIONS

    @property
    def insufficient(self) -> bool:
        """A pin with a floor, and a candidate that reported less than the floor was measured
        with: not judged, and not a pass."""
        return self.deciding_floor is not None and not self.complete

    @property
    def not_judged_reason(self) -> str | None:
        if self.deciding_floor is None:
            return "the pin carries no honest floor"
        if not self.complete and self.coverage is not None:
            return self.coverage.reason()
        if self.overall.positions < MIN_POSITIONS:
            return f"{self.overall.positions} positions measured, fewer than {MIN_POSITIONS}"
        return None

    @property
    def ratio(self) -> float | None:
        """How close the run came: the largest of the deciding figures over its limit (1.0 at
        the limit, below 1 inside); None without a floor or figures."""
        fl = self.deciding_floor
        base = (self.reference_baseline or 0.0) if self.by_reference else 0.0
        return None if fl is None else ratio_of(self.deciding, fl, base)

    @property
    def beyond(self) -> bool:
        return self.judged and bool(self.beyond_figures)

    @property
    def disagrees(self) -> bool:
        """Judged, and the candidate's free-run and forced lists disagree beyond the floor
        (`gate.core.verdict.free_forced`): not a pass, by its own rule."""
        return self.judged and self.free_forced is not None and bool(self.free_forced.beyond_figures)

    def to_dict(self) -> dict[str, Any]:
        ref = self.reference_floor
        return {
            **self.overall.to_dict(),
            "by_class": {name: f.to_dict() for name, f in self.by_class},
            "floor": self.floor.to_dict() if self.floor is not None else None,
            "limits": limits(self.floor) if self.floor is not None else None,
            "min_positions": MIN_POSITIONS,
            "judged": self.judged,
            "beyond": self.beyond,
            "beyond_figures": list(self.beyond_figures),
            "why": BEYOND_WHY if self.beyond else (NOT_JUDGED_WHY if self.insufficient else None),
            # Additions: the coverage the floor needs, and why a run was not judged.
            "coverage": self.coverage.to_dict() if self.coverage is not None else None,
            "not_judged_reason": None if self.judged else self.not_judged_reason,
            "rule": RULE_NOT_JUDGED if self.insufficient else None,
            # Addition: the candidate's free-run lists against its forced ones (rule RULE_FREE_FORCED).
            "free_forced": self.free_forced.to_dict(self.floor, self.judged) if self.free_forced is not None else None,
            # Additions: the figures against the pin's float32 reference, which of the two
            # decides, and how close the deciding figures came to their limits.
            "reference": None
            if self.reference is None
            else {
                **self.reference.to_dict(),
                "oracle_kl_mean_mnats": self.reference_baseline,
                "kl_mean_excess_mnats": None
                if self.reference.kl_mean_mnats is None or self.reference_baseline is None
                else self.reference.kl_mean_mnats - self.reference_baseline,
                "floor": ref.to_dict() if ref is not None else None,
                "limits": limits(ref) if ref is not None else None,
            },
            "judged_against": JUDGED_AGAINST_REFERENCE if self.by_reference else JUDGED_AGAINST_ORACLE,
            "ratio": self.ratio,
            "kl": "KL(oracle || candidate) over both lists, an oracle token the candidate lacks at its smallest "
            "listed probability",
        }


JUDGED_AGAINST_REFERENCE = "float32 reference"
JUDGED_AGAINST_ORACLE = "oracle"


def measure_distribution(
    oracle: Trace,
    candidate: Trace,
    outcomes: Mapping[str, str],
    floor: Floor | None,
    evidence: CandidateEvidence | None = None,
    reference_floor: Floor | None = None,
) -> RunDistribution:
    """The run's figures (`outcomes`: each prompt's `PromptResult.outcomes`), its coverage
    and, with a floor, which figures are beyond it. Where the pin carries float32 reference
    lists the same positions are measured against them too, and with `reference_floor` those
    figures decide (a `reference_floor` without the lists is refused: InputError)."""
    own = evidence if evidence is not None else candidate_evidence(oracle, candidate)
    pts = points(oracle, candidate, outcomes, own)
    overall = Figures.of(pts)
    by_class = tuple((name, Figures.of(sel)) for name in CLASSES if (sel := [p for p in pts if p.cls == name]))
    ref_lists = reference_of(oracle)
    if reference_floor is not None and ref_lists is None:
        raise InputError(
            f"{oracle.path}: the doctrine names a reference_floor, but the pin's records carry no "
            f"{REFERENCE_KEY} (record them with `gate pin reference`, or drop the field)"
        )
    ref: Figures | None = None
    base: float | None = None
    if ref_lists is not None:
        ref_pts = points(oracle, candidate, outcomes, own, ref_lists)
        ref = Figures.of(ref_pts)
        base = oracle_own_mean(oracle, ref_lists, [(p.prompt_id, p.position) for p in ref_pts])
    enough = overall.positions >= MIN_POSITIONS
    if reference_floor is not None and ref is not None:
        beyond = beyond_floor(ref, reference_floor, JUDGED_AGAINST_REFERENCE, base or 0.0) if enough else ()
    else:
        beyond = beyond_floor(overall, floor) if floor is not None and enough else ()
    return RunDistribution(
        overall=overall,
        by_class=by_class,
        floor=floor,
        beyond_figures=beyond,
        coverage=run_coverage(oracle, candidate, own),
        free_forced=free_forced_of(oracle, candidate, own, floor),
        reference=ref,
        reference_floor=reference_floor,
        reference_baseline=base,
    )
