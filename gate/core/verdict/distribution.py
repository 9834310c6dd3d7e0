"""The distribution verdict: is the candidate the reference model within honest noise?

A token-exact gate sees a build only where it flips a token; a build that computes another
numerical model (quantised weights, a lossy KV cache, a position bug) moves every
distribution a little and flips only a handful of near ties in a suite. Its distributions
show it everywhere. At every position where both engines saw the oracle's context (a
prompt's free run up to and including its first divergence, every position of a prompt the
candidate was teacher-forced through with its own top-k, `forced_top_logprobs`):

- KL(oracle || candidate) over the common top-k support, each side renormalised over it,
  in mnats;
- same top: the candidate's top token (its list's maximum, ties to the lowest id, as
  `torch.argmax`) is the oracle's;
- Δp: the candidate's probability of the oracle's token minus the oracle's, in percent
  (where the candidate's top-k holds it).

They are summarised the way llama.cpp's `perplexity --kl-divergence` prints them (mean ±
standard error, median, p99, max) over all positions and by each position's class (match,
exact tie, near tie, defect). With the pin's honest `Floor`, a run with at least
`MIN_POSITIONS` measured positions whose mean KL, p99 KL or same-top miss rate passes the
floor's by its margin is beyond honest drift, and the verdict is fail. Pure: no I/O, no torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gate.core.traces.trace import Trace
from gate.core.verdict.evidence import aligned_tops, lp_map
from gate.core.verdict.floor import Floor

# Fewer measured positions than this and the distribution is shown but not judged.
MIN_POSITIONS = 100
# Position classes, from `PromptResult.outcomes` (gate.core.verdict.result OUTCOME_*).
CLASS_OF_OUTCOME = {"m": "match", "e": "exact_tie", "n": "near_tie", "d": "defect"}
CLASSES = ("match", "exact_tie", "near_tie", "defect")
BEYOND_WHY = "numerics beyond honest drift (a different numerical model: quantisation, a lossy cache, a bug)"


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


def kl_common_mnats(oracle_top: Sequence[Sequence[Any]], candidate_top: Sequence[Sequence[Any]]) -> tuple[float, int]:
    """KL(oracle || candidate) over the tokens both lists carry, each side renormalised over
    them, in mnats; with the support's size (0: nothing in common, KL 0)."""
    o, c = lp_map(oracle_top), lp_map(candidate_top)
    common = [t for t in o if t in c]
    if not common:
        return 0.0, 0
    o_lse = _logsumexp([o[t] for t in common])
    c_lse = _logsumexp([c[t] for t in common])
    kl = math.fsum(math.exp(o[t] - o_lse) * ((o[t] - o_lse) - (c[t] - c_lse)) for t in common)
    return 1000.0 * max(kl, 0.0), len(common)


def _logsumexp(values: Sequence[float]) -> float:
    m = max(values)
    return m + math.log(math.fsum(math.exp(v - m) for v in values))


def top_token(top: Sequence[Sequence[Any]]) -> int | None:
    """The list's maximum, the lowest id among equal maxima (`torch.argmax`'s choice)."""
    best: tuple[float, int] | None = None
    for t, lp in top:  # pairs, or the rows of an array
        key = (-float(lp), int(t))
        if best is None or key < best:
            best = key
    return None if best is None else best[1]


def points(oracle: Trace, candidate: Trace, outcomes: Mapping[str, str]) -> list[Point]:
    """Every position where the candidate saw the oracle's context and reported its top-k."""
    cand = candidate.by_id()
    out: list[Point] = []
    for o in oracle.records:
        c = cand.get(o.id)
        if c is None or o.top_logprobs is None:
            continue
        marks = outcomes.get(o.id, "")
        for i, ctop in aligned_tops(o, c, candidate.path):
            if len(ctop) == 0:  # (a list or an array: never its truth value)
                continue
            otop = o.top_logprobs[i]
            kl, support = kl_common_mnats(otop, ctop)
            ot = o.token_ids[i]
            cmap = lp_map(ctop)
            olp = lp_map(otop)[ot]
            dp = 100.0 * (math.exp(cmap[ot]) - math.exp(olp)) if ot in cmap else None
            cls = CLASS_OF_OUTCOME.get(marks[i] if i < len(marks) else "m", "match")
            out.append(Point(o.id, i, cls, kl, top_token(ctop) == ot, dp, support))
    return out


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
    """A run's distribution figures, by class, and the verdict against the pin's floor."""

    overall: Figures
    by_class: tuple[tuple[str, Figures], ...]
    floor: Floor | None
    # The figures beyond the floor's limits, in words (empty: within, or not judged).
    beyond_figures: tuple[str, ...] = ()

    @property
    def judged(self) -> bool:
        return self.floor is not None and self.overall.positions >= MIN_POSITIONS

    @property
    def beyond(self) -> bool:
        return self.judged and bool(self.beyond_figures)

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.overall.to_dict(),
            "by_class": {name: f.to_dict() for name, f in self.by_class},
            "floor": self.floor.to_dict() if self.floor is not None else None,
            "limits": limits(self.floor) if self.floor is not None else None,
            "min_positions": MIN_POSITIONS,
            "judged": self.judged,
            "beyond": self.beyond,
            "beyond_figures": list(self.beyond_figures),
            "why": BEYOND_WHY if self.beyond else None,
        }


def limits(floor: Floor) -> dict[str, float]:
    return {
        "kl_mean_mnats": floor.kl_mean_limit,
        "kl_p99_mnats": floor.kl_p99_limit,
        "same_top_rate": 1.0 - floor.same_top_miss_limit,
    }


def beyond_floor(f: Figures, floor: Floor) -> tuple[str, ...]:
    """Each figure of `f` beyond the floor's limit, said with its numbers."""
    out: list[str] = []
    m = f"{floor.margin:g}"
    if f.kl_mean_mnats is not None and f.kl_mean_mnats > floor.kl_mean_limit:
        out.append(
            f"mean KL {f.kl_mean_mnats:.3f} mnats > {floor.kl_mean_limit:.3f} "
            f"(honest floor {floor.kl_mean_mnats:g} x margin {m})"
        )
    if f.kl_p99_mnats is not None and f.kl_p99_mnats > floor.kl_p99_limit:
        out.append(
            f"p99 KL {f.kl_p99_mnats:.3f} mnats > {floor.kl_p99_limit:.3f} "
            f"(honest floor {floor.kl_p99_mnats:g} x margin {m})"
        )
    if f.same_top_rate is not None and 1.0 - f.same_top_rate > floor.same_top_miss_limit:
        out.append(
            f"same top {100 * f.same_top_rate:.2f}% < {100 * (1 - floor.same_top_miss_limit):.2f}% "
            f"(honest floor {100 * floor.same_top_rate:g}%, misses x margin {m})"
        )
    return tuple(out)


def measure_distribution(
    oracle: Trace, candidate: Trace, outcomes: Mapping[str, str], floor: Floor | None
) -> RunDistribution:
    """The run's figures (`outcomes`: each prompt's `PromptResult.outcomes`) and, with a
    floor, which of them are beyond it."""
    pts = points(oracle, candidate, outcomes)
    overall = Figures.of(pts)
    by_class = tuple((name, Figures.of(sel)) for name in CLASSES if (sel := [p for p in pts if p.cls == name]))
    beyond = beyond_floor(overall, floor) if floor is not None and overall.positions >= MIN_POSITIONS else ()
    return RunDistribution(overall=overall, by_class=by_class, floor=floor, beyond_figures=beyond)
