"""The candidate's own evidence: how close it saw a flip, and how far it drifts over a run.

Pure functions over token ids and logprobs (no I/O, no torch), used by the adjudication
when the doctrine asks for evidence (`Doctrine.candidate_margin_ulps`, `max_drift_ulps`).

Everything is measured in steps of the model dtype's grid at the size of the oracle's top
logit at that position (`grid_step` of the pin's `token_logits`), floored at the step of
`Evidence.floor_logit` (16: 125 mnats in bf16), the unit honest drift comes in: two
engines running the same bf16 weights disagree by whole grid steps, the step doubles with
each binade of the logit, and below |logit| 16 the error no longer shrinks with it.

- At a flip (oracle token o, candidate token c), `u_o` = (L[o] - L[c]) / step is the
  oracle's gap and `u_c` = (C[c] - C[o]) / step the candidate's own margin for its token,
  from the candidate's top-k at that position (its free-run list at the first divergence,
  its `forced_top_logprobs` at a forced one). Their sum is how far the candidate moved the
  pair at this one position.
- The run's drift: at every position where the candidate's context is the oracle's (its
  free run up to and including the first divergence; every position of a prompt it was
  teacher-forced through), the *swing* of the oracle's top-1-minus-top-2 difference,
  ((L[o] - L[r]) - (C[o] - C[r])) / step, r the oracle's runner-up. Honest engines swing
  by a fraction of a step around 0; an engine that moves the runner-up (or anything else
  near the top) by a few steps at every position swings by that much everywhere, flip or
  no flip. The median of |swing| over the run is the figure the doctrine bounds.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from gate.core.traces.trace import PromptRecord, Trace
from gate.core.verdict.doctrine import Evidence
from gate.core.verdict.grid import grid_step, logprob_slack
from gate.errors import InputError

# The candidate record field with its top-k at each teacher-forced position (an addition to
# trace v1: candidate only, optional, one list per oracle position, like `top_logprobs`).
FORCED_TOP_KEY = "forced_top_logprobs"
# Fewer matched positions than this and the run's drift is not judged (too little evidence).
MIN_DRIFT_POSITIONS = 16


@dataclass(frozen=True, slots=True)
class RunDrift:
    """The run's swing statistics, in grid steps (None: no position could be measured)."""

    positions: int
    median_ulps: float | None
    p90_ulps: float | None
    max_ulps: float | None
    mean_signed_ulps: float | None
    limit_ulps: float | None = None

    @property
    def judged(self) -> bool:
        return self.median_ulps is not None and self.positions >= MIN_DRIFT_POSITIONS

    @property
    def beyond(self) -> bool:
        """The run drifts further than the doctrine allows (a broken engine, flip or no flip)."""
        return self.judged and self.limit_ulps is not None and (self.median_ulps or 0.0) > self.limit_ulps

    def to_dict(self) -> dict[str, Any]:
        return {
            "positions": self.positions,
            "median_ulps": self.median_ulps,
            "p90_ulps": self.p90_ulps,
            "max_ulps": self.max_ulps,
            "mean_signed_ulps": self.mean_signed_ulps,
            "limit_ulps": self.limit_ulps,
            "beyond": self.beyond,
        }

    def line(self) -> str:
        if self.median_ulps is None:
            return "run drift: not measured (no candidate top-k at positions sharing the oracle's context)"
        limit = f" (limit {self.limit_ulps:g})" if self.limit_ulps is not None else ""
        return (
            f"run drift: median {self.median_ulps:.2f}{limit}, p90 {self.p90_ulps:.2f}, "
            f"max {self.max_ulps:.2f} grid steps over {self.positions} positions"
        )


def lp_map(top: Sequence[Sequence[Any]]) -> dict[int, float]:
    return {int(t): float(lp) for t, lp in top}


def step_at(oracle: PromptRecord, i: int, grid: Any) -> float | None:
    """The grid step at the oracle's top logit at position i (None without token_logits).

    `grid` is `gate.core.verdict.adjudicate.grid_step` bound to the doctrine's dtype (passed in:
    this module sits below the adjudication)."""
    logits = oracle.extra.get("token_logits")
    if not isinstance(logits, list) or i >= len(logits):
        return None
    value = logits[i]
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        return None
    return float(grid(float(value)))


def forced_tops(rec: PromptRecord, n: int, path: str = "candidate") -> Sequence[Sequence[Any]] | None:
    """The record's `forced_top_logprobs` (one list per oracle position), or None."""
    raw = rec.extra.get(FORCED_TOP_KEY)
    if raw is None:
        return None
    if not isinstance(raw, list) or len(raw) != n:
        size = len(raw) if isinstance(raw, list) else type(raw).__name__
        raise InputError(
            f"{path}: prompt {rec.id!r}: field {FORCED_TOP_KEY!r}: expected one top-k list per oracle position "
            f"({n}), found {size}"
        )
    for i, pos in enumerate(raw):
        if not isinstance(pos, list) or not all(
            isinstance(p, list) and len(p) == 2 and isinstance(p[0], int) and isinstance(p[1], (int, float))
            for p in pos
        ):
            raise InputError(
                f"{path}: prompt {rec.id!r}: field {FORCED_TOP_KEY!r}[{i}]: expected [[token_id, logprob], ...]"
            )
    return raw


def aligned_tops(
    oracle: PromptRecord, candidate: PromptRecord, path: str = "candidate"
) -> Iterator[tuple[int, Sequence[Sequence[Any]]]]:
    """(position, the candidate's top-k there) wherever the candidate's context is the oracle's."""
    n = len(oracle.token_ids)
    forced = forced_tops(candidate, n, path)
    if forced is not None:
        yield from enumerate(forced)
        return
    top = candidate.top_logprobs
    if top is None:
        return
    ot, ct = oracle.token_ids, candidate.token_ids
    for i in range(min(n, len(top), len(ct))):
        yield i, top[i]
        if ct[i] != ot[i]:
            return  # downstream of a divergence the contexts differ


def swing(oracle_top: Sequence[Sequence[Any]], candidate_top: Sequence[Sequence[Any]], step: float) -> float | None:
    """The swing of the oracle's top-1-minus-top-2 difference, candidate vs oracle, in steps
    (positive: the candidate holds the runner-up closer); None where either is missing."""
    if len(oracle_top) < 2 or step <= 0:
        return None
    o, r = int(oracle_top[0][0]), int(oracle_top[1][0])
    c = lp_map(candidate_top)
    if o not in c or r not in c:
        return None
    d_oracle = float(oracle_top[0][1]) - float(oracle_top[1][1])
    return (d_oracle - (c[o] - c[r])) / step


def run_drift(oracle: Trace, candidate: Trace, grid: Any, *, limit_ulps: float | None = None) -> RunDrift:
    """The swing statistics of a run (see the module doc); prompts matched by id."""
    cand = candidate.by_id()
    swings: list[float] = []
    for o in oracle.records:
        c = cand.get(o.id)
        if c is None or o.top_logprobs is None:
            continue
        for i, ctop in aligned_tops(o, c, candidate.path):
            step = step_at(o, i, grid)
            if step is None:
                continue
            s = swing(o.top_logprobs[i], ctop, step)
            if s is not None:
                swings.append(s)
    return summarise(swings, limit_ulps)


def summarise(swings: Sequence[float], limit_ulps: float | None = None) -> RunDrift:
    if not swings:
        return RunDrift(0, None, None, None, None, limit_ulps)
    # Plain arithmetic, not `statistics` (which imports `fractions`): the core stays cheap
    # to import, the way `gate compare` is.
    mags = sorted(abs(s) for s in swings)
    n = len(mags)
    median = mags[n // 2] if n % 2 else (mags[n // 2 - 1] + mags[n // 2]) / 2.0
    p90 = mags[min(n - 1, math.ceil(0.9 * n) - 1)]
    return RunDrift(
        positions=n,
        median_ulps=float(median),
        p90_ulps=float(p90),
        max_ulps=float(mags[-1]),
        mean_signed_ulps=float(math.fsum(swings) / n),
        limit_ulps=limit_ulps,
    )


def candidate_margin(
    candidate_top: Sequence[Sequence[Any]] | None, oracle_token: int, candidate_token: int, step: float
) -> float | None:
    """u_c: the candidate's own logprob of its token minus the oracle's token's, in steps
    (None when its top-k there lacks either token)."""
    if candidate_top is None or step <= 0:
        return None
    c = lp_map(candidate_top)
    if oracle_token not in c or candidate_token not in c:
        return None
    return (c[candidate_token] - c[oracle_token]) / step


def flip_top(
    candidate: PromptRecord, position: int, source: str, n: int, path: str = "candidate"
) -> Sequence[Sequence[Any]] | None:
    """The candidate's top-k at a flip: its free-run list at the first divergence (same
    context as the oracle's), its forced list at a forced one."""
    if source == "forced":
        forced = forced_tops(candidate, n, path)
        return forced[position] if forced is not None else None
    top = candidate.top_logprobs
    return top[position] if top is not None and position < len(top) else None


def evidence_near(
    o_lp: float,
    c_lp: float,
    margin: float,
    step: float,
    evidence: Evidence,
    candidate_top: Sequence[Sequence[Any]] | None,
) -> bool:
    """The evidence rule at one flip: the oracle's gap and the candidate's own margin both
    within their limits (each up to one float32 rounding of its logprobs, as `logprob_slack`)."""
    if not 0.0 < o_lp - c_lp <= evidence.oracle_ulps * step + logprob_slack(o_lp, c_lp):
        return False
    own = {int(t): float(lp) for t, lp in candidate_top or ()}
    slack = logprob_slack(*own.values()) if own else 0.0
    return margin * step <= evidence.candidate_ulps * step + slack


def own_margin(
    candidate: PromptRecord,
    position: int,
    old: int | None,
    new: int | None,
    dtype: str,
    evidence: Evidence | None,
    drift: RunDrift | None,
) -> float | None:
    """Where the oracle has no evidence (a context it never saw), the candidate's own: the
    margin in grid steps, at its own top logit, by which it took `new` over `old`, when that
    is within the doctrine's `candidate_ulps` in a run whose drift is within the doctrine;
    else None."""
    top, logits = candidate.top_logprobs, candidate.extra.get("token_logits")
    if evidence is None or old is None or new is None or top is None or (drift is not None and drift.beyond):
        return None
    if not isinstance(logits, list) or position >= min(len(logits), len(top)):
        return None
    value = logits[position]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    margin = candidate_margin(top[position], old, new, grid_step(evidence.unit_logit(float(value)), dtype))
    return margin if margin is not None and margin <= evidence.candidate_ulps else None
