"""Schedule invariance: the candidate against itself (pure: no I/O, no torch).

`gate invariance` runs one engine over the pin's prompts under a baseline schedule and under
other schedules (cells: a repeat, another batch size, a needle prompt alone and inside a batch,
the prompts shuffled, more threads, a chunked prefill, forced decoding along its own tokens).
Each cell is compared with its reference run position by position here:

- the baseline run plays the oracle's role: `compare` of `gate.core.verdict.adjudicate`
  classifies every token flip by the pin's doctrine (exact tie, near tie, defect), judging a
  flip by the reference's own logprob gap and, under the evidence rule, the cell's margin and
  its drift against the reference;
- `bitwise_identical`: the same tokens, and every top-k list bit for bit, at every position
  where both runs saw the same context (the free run up to and including its first
  divergence; every position of a cell forced along the reference's tokens);
- `max_abs_delta_mnats`: the largest |logprob difference| over the token ids both top-k
  lists hold at those positions, in millinats.

A cell's verdict: `varies` when a flip is a defect or the cell drifts further than the
doctrine allows (`RunDrift.beyond`); else `bitwise_invariant` when bit-identical; else
`invariant_within_noise`. The matrix is as good as its worst cell that ran.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gate.core.traces.trace import PromptRecord, Trace
from gate.core.verdict.adjudicate import compare
from gate.core.verdict.doctrine import Doctrine
from gate.core.verdict.evidence import RunDrift, aligned_tops
from gate.core.verdict.result import DEFECT, EXACT_TIE, NEAR_TIE, Divergence, GateResult
from gate.errors import InputError

INVARIANCE_VERSION = 1

BITWISE_INVARIANT = "bitwise_invariant"
INVARIANT_WITHIN_NOISE = "invariant_within_noise"
VARIES = "varies"
NOT_RUN = "not_run"
_RANK = {BITWISE_INVARIANT: 0, INVARIANT_WITHIN_NOISE: 1, VARIES: 2}

# How many flips a cell lists in the reports (all are counted).
FLIPS_SHOWN = 10


@dataclass(frozen=True, slots=True)
class Schedule:
    """One schedule: the cell's name, the knobs it sets (knob name -> value, the
    vocabulary of `gate.core.engine.SCHEDULE_KNOBS`, plus the workflow's own arrangement
    keys such as `order` or `needle`), and a sentence saying what it compares."""

    cell: str
    knobs: Mapping[str, Any] = field(default_factory=dict)
    description: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"cell": self.cell, **dict(self.knobs), "description": self.description}

    def label(self) -> str:
        shown = ", ".join(f"{k}={v}" for k, v in self.knobs.items())
        return f"{self.cell} ({shown})" if shown else self.cell


@dataclass(frozen=True, slots=True)
class PinVerdict:
    """A schedule's own verdict against the pin (free run only: positions after a prompt's
    first divergence from the pin are unadjudicated)."""

    verdict: str
    counts: Mapping[str, int]

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, **dict(self.counts)}


@dataclass(frozen=True, slots=True)
class CacheReuse:
    """What the engine says its prefix cache served during a cell's judged run: requests
    served with a cached prefix, and the prompt tokens they took from the cache. A note on
    the cell only: the engine's own count, so it never changes a verdict (an engine that
    omits it must not judge better or worse for that)."""

    requests_hit: int
    tokens_reused: int

    def to_dict(self) -> dict[str, int]:
        return {"requests_hit": self.requests_hit, "tokens_reused": self.tokens_reused}


PREFIX_CACHE_CELL = "prefix_cache"


@dataclass(frozen=True, slots=True)
class CellResult:
    """One cell of the matrix: what ran (or why not) and how it compares with its reference."""

    schedule: Schedule
    ran: bool = True
    reason: str | None = None  # why the cell did not run
    reference: str = "baseline"  # the run this cell is compared with
    prompts: int = 0
    positions: int = 0
    bitwise_identical: bool | None = None
    token_flips: Mapping[str, int] = field(default_factory=lambda: {EXACT_TIE: 0, NEAR_TIE: 0, DEFECT: 0})
    max_abs_delta_mnats: float | None = None
    prompts_differing: int = 0
    unadjudicated_positions: int = 0
    flips: tuple[Divergence, ...] = ()
    drift: RunDrift | None = None
    pin: PinVerdict | None = None
    cache_reuse: CacheReuse | None = None  # the prefix_cache cell's, where the engine reports it

    @property
    def verdict(self) -> str:
        if not self.ran:
            return NOT_RUN
        if self.token_flips.get(DEFECT, 0) or (self.drift is not None and self.drift.beyond):
            return VARIES
        if self.bitwise_identical:
            return BITWISE_INVARIANT
        return INVARIANT_WITHIN_NOISE

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "schedule": self.schedule.to_dict(),
            "ran": self.ran,
            "verdict": self.verdict,
        }
        if not self.ran:
            out["reason"] = self.reason
            return out
        out.update(
            {
                "reference": self.reference,
                "prompts": self.prompts,
                "positions": self.positions,
                "bitwise_identical": self.bitwise_identical,
                "token_flips": dict(self.token_flips),
                "max_abs_delta_mnats": self.max_abs_delta_mnats,
                "prompts_differing": self.prompts_differing,
                "unadjudicated_positions": self.unadjudicated_positions,
                "flips": [_flip_dict(d) for d in self.flips[:FLIPS_SHOWN]],
            }
        )
        if self.drift is not None:
            out["drift"] = self.drift.to_dict()
        if self.pin is not None:
            out["pin"] = self.pin.to_dict()
        if self.schedule.cell == PREFIX_CACHE_CELL:
            out["cache_reuse"] = self.cache_reuse.to_dict() if self.cache_reuse is not None else None
        return out

    @property
    def reuse_note(self) -> str | None:
        """The prefix_cache cell's sentence on what the engine's cache served (None for any
        other cell, or one that did not run)."""
        if not self.ran or self.schedule.cell != PREFIX_CACHE_CELL:
            return None
        reuse = self.cache_reuse
        if reuse is None:
            return "the engine does not report its cache reuse"
        if reuse.requests_hit == 0 and reuse.tokens_reused == 0:
            return "the engine served nothing from its prefix cache: this cell did not exercise it"
        return (
            f"the engine served {reuse.tokens_reused} prompt token(s) from its prefix cache "
            f"over {reuse.requests_hit} of the judged run's {self.prompts} request(s)"
        )


def _flip_dict(d: Divergence) -> dict[str, Any]:
    return {
        "prompt_id": d.prompt_id,
        "position": d.position,
        "source": d.source,
        "class": d.cls,
        "reference_token": d.oracle_token,
        "cell_token": d.candidate_token,
        "reference_gap_mnats": d.oracle_minus_candidate_mnats,
        "reference_text": d.oracle_text,
        "cell_text": d.candidate_text,
    }


@dataclass(frozen=True, slots=True)
class InvarianceResult:
    """The matrix: the baseline, every cell, the verdict and the exit code."""

    engine: str
    model: str
    baseline: Schedule
    cells: tuple[CellResult, ...]
    doctrine: Doctrine
    strict: bool = False
    baseline_pin: PinVerdict | None = None
    engine_options: Mapping[str, str] = field(default_factory=dict)
    knobs: Mapping[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    meta: Mapping[str, Any] = field(default_factory=dict)

    @property
    def ran(self) -> tuple[CellResult, ...]:
        return tuple(c for c in self.cells if c.ran)

    @property
    def verdict(self) -> str:
        ran = self.ran
        if not ran:
            raise InputError("gate invariance: no cell ran, so there is nothing to judge")
        return max((c.verdict for c in ran), key=_RANK.__getitem__)

    @property
    def exit_code(self) -> int:
        """1 when a cell varies (a defect flip, or drift beyond the doctrine); with
        `strict`, also when any cell is short of bit-identical; else 0."""
        verdict = self.verdict
        if verdict == VARIES or (self.strict and verdict != BITWISE_INVARIANT):
            return 1
        return 0

    @property
    def summary(self) -> str:
        ran = self.ran
        counts = {v: sum(c.verdict == v for c in ran) for v in _RANK}
        skipped = len(self.cells) - len(ran)
        flips = {k: sum(c.token_flips.get(k, 0) for c in ran) for k in (EXACT_TIE, NEAR_TIE, DEFECT)}
        deltas = [c.max_abs_delta_mnats for c in ran if c.max_abs_delta_mnats is not None]
        worst = f", max |Δlogprob| {max(deltas):.1f} mnats" if deltas else ""
        return (
            f"{self.verdict}: {len(ran)} cell(s) run against the baseline: {counts[BITWISE_INVARIANT]} bit-identical, "
            f"{counts[INVARIANT_WITHIN_NOISE]} within noise, {counts[VARIES]} varying"
            f"{f' ({skipped} not run)' if skipped else ''}; token flips: {flips[EXACT_TIE]} exact tie(s), "
            f"{flips[NEAR_TIE]} near tie(s), {flips[DEFECT]} defect(s){worst}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "gate_invariance": INVARIANCE_VERSION,
            "engine": self.engine,
            "model": self.model,
            "baseline": {
                **self.baseline.to_dict(),
                **({"pin": self.baseline_pin.to_dict()} if self.baseline_pin is not None else {}),
            },
            "cells": [c.to_dict() for c in self.cells],
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "strict": self.strict,
            "summary": self.summary,
            "doctrine": self.doctrine.to_dict(),
            "engine_options": dict(self.engine_options),
            "schedule_knobs": dict(self.knobs),
            "notes": list(self.notes),
            **({"meta": dict(self.meta)} if self.meta else {}),
        }


# --------------------------------------------------------------------------- comparison


def as_role(trace: Trace, role: str) -> Trace:
    return replace(trace, header=replace(trace.header, role=role))


def forced_record(reference: PromptRecord, token_ids: Sequence[int], tops: Sequence[Any] | None) -> PromptRecord:
    """A cell forced along the reference's own tokens: the reference's free run, with the
    cell's choices and top-k at every position as forced data (the trace's addition)."""
    forced_top = reference.forced_top_logprobs
    if tops is not None:
        forced_top = [[[int(t), float(lp)] for t, lp in pos] for pos in tops]
    return replace(
        reference, forced_token_ids=tuple(int(t) for t in token_ids), token_logits=None, forced_top_logprobs=forced_top
    )


def compare_runs(
    reference: Trace,
    cell: Trace,
    doctrine: Doctrine,
    schedule: Schedule,
    *,
    reference_name: str = "baseline",
    pin: PinVerdict | None = None,
) -> CellResult:
    """Compare a cell's run with its reference run of the same engine (prompts matched by
    id; the reference restricted to the cell's prompts). Two runs of one engine are judged
    against each other, not against the pin's float32 reference: its floor does not apply."""
    doctrine = replace(doctrine, reference_floor=None)
    wanted = {r.id for r in cell.records}
    ref = replace(reference, records=tuple(at_least_logit(r, doctrine) for r in reference.records if r.id in wanted))
    if len(ref.records) != len(cell.records):
        missing = sorted(wanted - {r.id for r in ref.records})
        raise InputError(f"cell {schedule.cell!r}: prompt(s) {missing[:5]} are not in the reference run")
    result: GateResult = compare(as_role(ref, "oracle"), as_role(cell, "candidate"), doctrine)
    by_id = cell.by_id()
    positions = 0
    identical = True
    differing = 0
    worst: float | None = None
    for o in ref.records:
        c = by_id[o.id]
        same = _same_tokens(o, c)
        for i, ctop in aligned_tops(o, c, cell.path):
            positions += 1
            otop = o.top_logprobs[i] if o.top_logprobs is not None and i < len(o.top_logprobs) else None
            if otop is None:
                same = False
                continue
            if _plain(otop) != _plain(ctop):
                same = False
            delta = _max_delta(otop, ctop)
            if delta is not None and (worst is None or delta > worst):
                worst = delta
        if not same:
            differing += 1
            identical = False
    counts = result.counts
    return CellResult(
        schedule=schedule,
        reference=reference_name,
        prompts=len(ref.records),
        positions=positions,
        bitwise_identical=identical,
        token_flips={EXACT_TIE: counts["exact_ties"], NEAR_TIE: counts["near_ties"], DEFECT: counts["defects"]},
        max_abs_delta_mnats=worst,
        prompts_differing=differing,
        unadjudicated_positions=counts["unadjudicated_positions"],
        flips=result.divergences,
        drift=result.drift,
        pin=pin,
    )


def at_least_logit(rec: PromptRecord, doctrine: Doctrine) -> PromptRecord:
    """A reference without raw logits, under the evidence rule, sized at the rule's least
    logit: its unit is the grid step at max(|top logit|, floor_logit), never less than the
    step at the least logit, so taking that is the smallest unit the rule allows: a flip the rule
    ratifies with it, it would ratify with the true logits too, and the drift counts at
    least as many units (`gate.core.verdict.doctrine.Evidence`). (A flip whose cell top-k
    lacks either token earns no allowance in grid steps under the evidence rule.)"""
    ev = doctrine.evidence
    if ev is None or rec.token_logits is not None:
        return rec
    return replace(rec, token_logits=[float(ev.floor_logit)] * len(rec.token_ids))


def pin_verdict(result: GateResult) -> PinVerdict:
    counts = result.counts
    keep = ("prompts", "strict_pass", "ratified_pass", "exact_ties", "near_ties", "defects", "unadjudicated_positions")
    return PinVerdict(verdict=result.verdict, counts={k: counts[k] for k in keep})


def not_run(schedule: Schedule, reason: str) -> CellResult:
    return CellResult(schedule=schedule, ran=False, reason=reason)


def _same_tokens(o: PromptRecord, c: PromptRecord) -> bool:
    if c.forced_token_ids is not None:
        return tuple(c.forced_token_ids) == tuple(o.token_ids)
    return tuple(c.token_ids) == tuple(o.token_ids) and c.finish_reason == o.finish_reason


def _plain(top: Sequence[Sequence[Any]]) -> list[tuple[int, float]]:
    return [(int(t), float(lp)) for t, lp in top]


def _max_delta(a: Sequence[Sequence[Any]], b: Sequence[Sequence[Any]]) -> float | None:
    """The largest |logprob difference| in mnats over the ids both top-k lists hold."""
    lb = {int(t): float(lp) for t, lp in b}
    deltas = [abs(float(lp) - lb[int(t)]) for t, lp in a if int(t) in lb]
    return 1000.0 * max(deltas) if deltas else None
