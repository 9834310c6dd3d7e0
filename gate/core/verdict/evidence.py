"""The candidate's own evidence: how close it saw a flip, and how far it drifts over a run.

Pure functions over token ids and logprobs (no I/O, no torch), used by the adjudication
when the doctrine asks for evidence (`Doctrine.evidence`); the rules that weigh it are in
`gate.core.verdict.chain`.

Everything is measured in steps of the model dtype's grid at the size of the oracle's top
logit at that position (`grid_step` of the pin's `token_logits`), never less than the step
at the rule's least logit (`Evidence.floor_logit`, 16: 125 mnats in bf16), the unit honest drift comes in: two
engines running the same bf16 weights disagree by whole grid steps, the step doubles with
each binade of the logit, and below |logit| 16 the error no longer shrinks with it.

- At a flip (oracle token o, candidate token c), `u_o` = (L[o] - L[c]) / step is the
  oracle's gap and `u_c` = (C[c] - C[o]) / step the candidate's own margin for its token,
  from the candidate's top-k at that position (its free-run list at the first divergence,
  its `forced_top_logprobs` at a forced one). Their sum is how far the candidate moved the
  pair at this one position.
- The run's drift: at every position where the candidate's context is the oracle's (its
  free run up to and including the first divergence; every position of a prompt it was
  teacher-forced through; both lists where it has both), the *swing* of the oracle's top-1-minus-top-2 difference,
  ((L[o] - L[r]) - (C[o] - C[r])) / step, r the oracle's runner-up. Honest engines swing
  by a fraction of a step around 0; an engine that moves the runner-up (or anything else
  near the top) by a few steps at every position swings by that much everywhere, flip or
  no flip. The doctrine bounds the median of |swing| where the drift happens: over the
  run, over each prompt, and over each window of generated positions (positions 0-15,
  16-31, ... pooled across prompts), each judged once it holds 16 positions; and its
  upper tail, the run's p90 of |swing|. A bias confined to late positions (a KV-cache
  block bug) or to some prompts cannot hide in the healthy positions' median.
- The candidate's own choice must be a maximum of its own list at every position (free run
  and forced), within one float32 rounding: a candidate whose sampler does not take the
  top of the logprobs it reports (a penalty left on, logprobs recorded before it) earns no
  allowance from them anywhere (`NotGreedy`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from gate.core.traces.trace import PromptRecord, Trace
from gate.core.verdict.coverage import context_lists
from gate.core.verdict.doctrine import Evidence
from gate.core.verdict.grid import grid_step, logprob_slack
from gate.core.verdict.own_lists import FORCED, CandidateEvidence, OwnLists, forced_tops, free_tops

# Fewer measured positions than this and the drift (of the run, a prompt, a window) is not
# judged: too little evidence.
MIN_DRIFT_POSITIONS = 16
# The windows of generated positions the drift is judged over (pooled across prompts).
DRIFT_WINDOW = 16


@dataclass(frozen=True, slots=True)
class DriftWindow:
    """The median |swing| over one prompt or one window of generated positions."""

    kind: str  # "prompt" or "positions"
    name: str  # the prompt id, or "16-31"
    positions: int
    median_ulps: float

    def label(self) -> str:
        return f"prompt {self.name}" if self.kind == "prompt" else f"positions {self.name}"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "positions": self.positions, "median_ulps": self.median_ulps}


# The largest |logprob| a greedy token can have: it has p >= 1/V, so |logprob| <= ln V, under 16
# nats for any vocabulary under 8.8 million tokens. A rounding slack taken from a run's own
# logprobs is taken at no larger size.
GREEDY_LOGPROB_BOUND = 16.0


@dataclass(frozen=True, slots=True)
class RunDrift:
    """The run's swing statistics, in evidence units (the grid step at the least logit or above; None: no
    position could be measured), with the judged windows (prompts, position blocks)."""

    positions: int
    median_ulps: float | None
    p90_ulps: float | None
    max_ulps: float | None
    mean_signed_ulps: float | None
    limit_ulps: float | None = None
    # The limit on the run's p90 of |swing| (the tail); None: not judged.
    tail_limit_ulps: float | None = None
    # Every prompt and every window of positions with at least MIN_DRIFT_POSITIONS measured.
    windows: tuple[DriftWindow, ...] = ()
    # What float32 rounding can move a swing by, in units: one rounding of each of its two
    # differences, taken at the oracle's logprobs (the largest over the run). Each limit
    # allows it, so a drift at its limit cannot flip on a rounding.
    slack_ulps: float = 0.0

    @property
    def judged(self) -> bool:
        return self.median_ulps is not None and self.positions >= MIN_DRIFT_POSITIONS

    @property
    def beyond_where(self) -> tuple[str, ...]:
        """Where the drift is beyond the doctrine: `run median 2.50 > 2`, `p90 ...`, `prompt 'x' ...`."""
        if not self.judged or self.limit_ulps is None:
            return ()
        out: list[str] = []
        limit, slack = self.limit_ulps, self.slack_ulps if self.limit_ulps > 0.0 else 0.0
        if (self.median_ulps or 0.0) > limit + slack:
            out.append(f"run median {self.median_ulps:.2f} > {limit:g}")
        tail = self.tail_limit_ulps
        if tail is not None and (self.p90_ulps or 0.0) > tail + (self.slack_ulps if tail > 0.0 else 0.0):
            out.append(f"run p90 {self.p90_ulps:.2f} > {tail:g}")
        out.extend(
            f"{w.label()} median {w.median_ulps:.2f} > {limit:g} ({w.positions} positions)"
            for w in self.windows
            if w.median_ulps > limit + slack
        )
        return tuple(out)

    @property
    def beyond(self) -> bool:
        """The drift is further than the doctrine allows somewhere (a broken engine, flip or no flip)."""
        return bool(self.beyond_where)

    def worst(self, kind: str) -> DriftWindow | None:
        ws = [w for w in self.windows if w.kind == kind]
        return max(ws, key=lambda w: w.median_ulps) if ws else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "positions": self.positions,
            "median_ulps": self.median_ulps,
            "p90_ulps": self.p90_ulps,
            "max_ulps": self.max_ulps,
            "mean_signed_ulps": self.mean_signed_ulps,
            "limit_ulps": self.limit_ulps,
            "beyond": self.beyond,
            # Additions: what the figures count, the tail's limit, where the drift was judged.
            "unit": "evidence units (the dtype's grid step at max(|top logit|, floor_logit))",
            "judged": self.judged,
            "min_positions": MIN_DRIFT_POSITIONS,
            "p90_limit_ulps": self.tail_limit_ulps,
            "windows": [w.to_dict() for w in self.windows],
            "beyond_where": list(self.beyond_where),
        }

    def line(self) -> str:
        if self.median_ulps is None:
            return "run drift: not measured (no candidate top-k at positions sharing the oracle's context)"
        figures = (
            f"median {self.median_ulps:.2f}, p90 {self.p90_ulps:.2f}, max {self.max_ulps:.2f} units over "
            f"{self.positions} positions"
        )
        if not self.judged:
            return f"run drift: not judged ({self.positions} < {MIN_DRIFT_POSITIONS} positions): {figures}"
        limits = ""
        if self.limit_ulps is not None:
            tail = f", p90 limit {self.tail_limit_ulps:g}" if self.tail_limit_ulps is not None else ""
            limits = f" (median limit {self.limit_ulps:g} over the run, each prompt and each window{tail})"
        worst = [w for w in (self.worst("prompt"), self.worst("positions")) if w is not None]
        at = "; worst " + ", ".join(f"{w.label()} {w.median_ulps:.2f}" for w in worst) if worst else ""
        return f"run drift: {figures}{limits}{at}"


def lp_map(top: Sequence[Sequence[Any]]) -> dict[int, float]:
    return {int(t): float(lp) for t, lp in top}


def step_at(oracle: PromptRecord, i: int, grid: Any) -> float | None:
    """The grid step at the oracle's top logit at position i (None without token_logits).

    `grid` is `gate.core.verdict.grid.grid_step` bound to the doctrine's dtype."""
    logits = oracle.token_logits
    if logits is None or i >= len(logits):
        return None
    value = logits[i]
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        return None
    return float(grid(float(value)))


def aligned_tops(
    oracle: PromptRecord, candidate: PromptRecord, path: str = "candidate", own: OwnLists | None = None
) -> Iterator[tuple[int, Sequence[Sequence[Any]]]]:
    """(position, the candidate's top-k there) wherever the candidate's context is the oracle's."""
    n = len(oracle.token_ids)
    forced = own.forced if own is not None else forced_tops(candidate, n, path)
    if forced is not None:
        yield from enumerate(forced)
        return
    top = own.free if own is not None else candidate.top_logprobs
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


def run_drift(
    oracle: Trace,
    candidate: Trace,
    grid: Any,
    *,
    limit_ulps: float | None = None,
    tail_limit_ulps: float | None = None,
    evidence: CandidateEvidence | None = None,
) -> RunDrift:
    """The swing statistics of a run (see the module doc); prompts matched by id."""
    cand = candidate.by_id()
    swings: list[float] = []
    slack = 0.0
    per_prompt: dict[str, list[float]] = {}
    per_window: dict[int, list[float]] = {}
    for o in oracle.records:
        c = cand.get(o.id)
        if c is None or o.top_logprobs is None:
            continue
        mine = per_prompt.setdefault(o.id, [])
        # Free-run and forced lists are both measured where both share the oracle's context.
        tops: Iterator[tuple[int, Any]] = (
            ((i, t) for i, _, t in context_lists(o, c, evidence.own(o.id)))
            if evidence is not None
            else aligned_tops(o, c, candidate.path)
        )
        for i, ctop in tops:
            step = step_at(o, i, grid)
            if step is None or ctop is None:
                continue
            s = swing(o.top_logprobs[i], ctop, step)
            if s is not None:
                pair = o.top_logprobs[i]
                slack = max(slack, 2.0 * logprob_slack(float(pair[0][1]), float(pair[1][1])) / step)
                swings.append(s)
                mine.append(s)
                per_window.setdefault(i // DRIFT_WINDOW, []).append(s)
    windows = [
        DriftWindow("prompt", pid, len(v), _median(sorted(map(abs, v))))
        for pid, v in per_prompt.items()
        if len(v) >= MIN_DRIFT_POSITIONS
    ]
    windows += [
        DriftWindow("positions", _window_name(b), len(v), _median(sorted(map(abs, v))))
        for b, v in sorted(per_window.items())
        if len(v) >= MIN_DRIFT_POSITIONS
    ]
    return summarise(swings, limit_ulps, tail_limit_ulps=tail_limit_ulps, windows=tuple(windows), slack_ulps=slack)


def _window_name(block: int) -> str:
    return f"{block * DRIFT_WINDOW}-{(block + 1) * DRIFT_WINDOW - 1}"


def _median(mags: Sequence[float]) -> float:
    n = len(mags)
    return float(mags[n // 2] if n % 2 else (mags[n // 2 - 1] + mags[n // 2]) / 2.0)


def summarise(
    swings: Sequence[float],
    limit_ulps: float | None = None,
    *,
    tail_limit_ulps: float | None = None,
    windows: tuple[DriftWindow, ...] = (),
    slack_ulps: float = 0.0,
) -> RunDrift:
    if not swings:
        return RunDrift(0, None, None, None, None, limit_ulps, tail_limit_ulps)
    # Plain arithmetic, not `statistics` (which imports `fractions`): the core stays cheap
    # to import, the way `gate compare` is.
    mags = sorted(abs(s) for s in swings)
    n = len(mags)
    p90 = mags[min(n - 1, math.ceil(0.9 * n) - 1)]
    return RunDrift(
        positions=n,
        median_ulps=_median(mags),
        p90_ulps=float(p90),
        max_ulps=float(mags[-1]),
        mean_signed_ulps=float(math.fsum(swings) / n),
        limit_ulps=limit_ulps,
        tail_limit_ulps=tail_limit_ulps,
        windows=windows,
        slack_ulps=slack_ulps,
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
    context as the oracle's), its forced list at a forced one (matched to the oracle's
    positions on each call: for one-off use; `compare` does it once, `CandidateEvidence`)."""
    own = OwnLists(free_tops(candidate), forced_tops(candidate, n, path) if source == FORCED else None)
    return own.at(source, position)


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
    is within the doctrine's `candidate_ulps` (and not negative) in a run whose drift is
    within the doctrine; else None."""
    top, logits = candidate.top_logprobs, candidate.token_logits
    if evidence is None or old is None or new is None or top is None or (drift is not None and drift.beyond):
        return None
    if logits is None or position >= min(len(logits), len(top)):
        return None
    value = logits[position]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    step = grid_step(evidence.unit_logit(float(value)), dtype)
    margin = candidate_margin(top[position], old, new, step)
    if margin is None or margin < 0.0:
        return None
    # One float32 rounding of the two logprobs, as every limit allows, taken at no larger size
    # than a greedy token's logprob can have (and its rival's, within the limit of it): the run's
    # own list, the only values here, cannot buy more slack by reporting logprobs far down.
    limit = evidence.candidate_ulps * step
    own = lp_map(top[position])
    bound = (GREEDY_LOGPROB_BOUND, GREEDY_LOGPROB_BOUND + limit)
    slack = logprob_slack(*(min(abs(own[t]), b) for t, b in zip((new, old), bound, strict=True))) if limit else 0.0
    return margin if margin * step <= limit + slack else None
