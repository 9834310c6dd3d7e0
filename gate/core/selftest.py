"""Self-test by mutation: does the gate catch faults injected into an engine, and as what?

The orchestration only; the faults themselves live with the engines (`gate.engines.mutants`)
and arrive here as `Mutation`s that build an engine. No torch here.

For a pin, the unmutated engine first records a *reference*: its own free run over the
pinned prompts, taken as an oracle trace. Each mutated engine then runs the same prompts
and is gated twice:
- against the reference, which isolates the fault: the unmutated engine reproduces the
  reference exactly, so every position the mutant changes is the fault's doing, and every
  one must be reported (teacher-forced along the reference's tokens, so a tie early in a
  prompt cannot hide a later change);
- against the pin (the vLLM oracle), which is what a user of `gate run` would see; that
  verdict also carries the honest drift between the two engines.

A mutant is *caught* when it changed at least one token and the gate, against the
reference, reports a divergence at every changed position. Each mutation states what the
gate must call it (`Expectation`); the self-test passes when every mutation meets it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from gate.core.adjudicate import DEFECT, EXACT_TIE, STRICT_PASS, GateResult, compare
from gate.core.doctrine import Doctrine
from gate.core.pins import Pin
from gate.core.runner import Progress, engine_call, run_candidate
from gate.core.trace import PromptRecord, Trace, TraceError, TraceHeader, check_top_logprobs
from gate.engines.base import Engine
from gate.errors import EngineError

SELFTEST_VERSION = 1
# The self-test's grid allowance unless the person sets one: one step of the dtype's grid
# is what honest engines drift by, so the one-step fault must come out ratified.
SELFTEST_NEAR_TIE_ULPS = 1.0

# What the gate must call a mutation's changes.
EXPECT_EXACT_TIES = "exact_ties"  # every change an exact tie, the higher id taken (tie-break faults)
EXPECT_NO_DEFECT = "no_defect"  # changes within the doctrine's allowance: ties and near ties only
EXPECT_DEFECT = "defect"  # at least one change reported as a defect
EXPECT_CAUGHT = "caught"  # every change reported, whatever its class; changing nothing is allowed
EXPECTATIONS = (EXPECT_EXACT_TIES, EXPECT_NO_DEFECT, EXPECT_DEFECT, EXPECT_CAUGHT)

# Status of one mutant.
CAUGHT = "caught"  # changed tokens and the gate reported every change
MISSED = "missed"  # changed tokens and the gate did not report them all
UNCHANGED = "unchanged"  # produced exactly the reference's tokens: nothing to catch


@dataclass(frozen=True, slots=True)
class Mutation:
    """A fault to inject: `load()` builds the mutated engine (closed after its run)."""

    name: str
    description: str
    expect: str
    load: Callable[[], Engine]

    def __post_init__(self) -> None:
        if self.expect not in EXPECTATIONS:
            raise ValueError(f"mutation {self.name!r}: unknown expectation {self.expect!r}")


@dataclass(frozen=True, slots=True)
class Verdict:
    """The essentials of one adjudication: verdict, counts, and the divergences' classes."""

    verdict: str
    summary: str
    counts: Mapping[str, int]
    tie_breaks: Mapping[str, int]
    max_gap_ulps: float | None

    @classmethod
    def of(cls, result: GateResult) -> Verdict:
        ties: dict[str, int] = {}
        for d in result.divergences:
            if d.tie_break is not None:
                ties[d.tie_break] = ties.get(d.tie_break, 0) + 1
        ulps = [d.gap_ulps for d in result.divergences if d.gap_ulps is not None]
        return cls(result.verdict, result.summary, result.counts, ties, max(ulps) if ulps else None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "summary": self.summary,
            "counts": dict(self.counts),
            "tie_breaks": dict(self.tie_breaks),
            "max_gap_ulps": self.max_gap_ulps,
        }


@dataclass(frozen=True, slots=True)
class MutantOutcome:
    name: str
    description: str
    expect: str
    status: str
    met: bool
    why: str
    changed_prompts: int
    changed_positions: int
    reported_positions: int
    against_reference: Verdict
    against_pin: Verdict
    seconds: float
    # The full adjudications, for renderers that show divergences (not serialised).
    reference_result: GateResult | None = field(default=None, compare=False, repr=False)
    pin_result: GateResult | None = field(default=None, compare=False, repr=False)
    # The mutant's trace, forced along the reference's tokens where it diverged.
    candidate: Trace | None = field(default=None, compare=False, repr=False)

    @property
    def classes(self) -> str:
        """The reference adjudication's classes in words: `3 exact ties`, `1 near tie, 2 defects`."""
        c = self.against_reference.counts
        parts = [
            f"{c[key]} {word if c[key] == 1 else word + 's'}"
            for key, word in (("exact_ties", "exact tie"), ("near_ties", "near tie"), ("defects", "defect"))
            if c.get(key)
        ]
        return ", ".join(parts) or "none"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "expect": self.expect,
            "status": self.status,
            "met": self.met,
            "why": self.why,
            "changed_prompts": self.changed_prompts,
            "changed_positions": self.changed_positions,
            "reported_positions": self.reported_positions,
            "classes": self.classes,
            "against_reference": self.against_reference.to_dict(),
            "against_pin": self.against_pin.to_dict(),
            "seconds": round(self.seconds, 3),
        }


@dataclass(frozen=True, slots=True)
class SelfTestResult:
    model: str
    engine: str
    doctrine: Doctrine
    prompts: int
    positions: int
    reference_exact_ties: int
    baseline_against_pin: Verdict
    mutants: tuple[MutantOutcome, ...]
    seconds: float
    # The unmutated engine's free run as an oracle trace (not serialised).
    reference: Trace | None = field(default=None, compare=False, repr=False)

    @property
    def ok(self) -> bool:
        return all(m.met for m in self.mutants)

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    @property
    def summary(self) -> str:
        caught = sum(m.status == CAUGHT for m in self.mutants)
        changed = sum(m.status != UNCHANGED for m in self.mutants)
        met = sum(m.met for m in self.mutants)
        word = "passed" if self.ok else "FAILED"
        return (
            f"selftest {word}: {caught}/{changed} token-changing mutants caught; "
            f"{met}/{len(self.mutants)} classified as expected"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "gate_selftest": SELFTEST_VERSION,
            "ok": self.ok,
            "exit_code": self.exit_code,
            "summary": self.summary,
            "model": self.model,
            "engine": self.engine,
            "doctrine": self.doctrine.to_dict(),
            "prompts": self.prompts,
            "positions": self.positions,
            "reference_exact_ties": self.reference_exact_ties,
            "baseline_against_pin": self.baseline_against_pin.to_dict(),
            "mutants": [m.to_dict() for m in self.mutants],
            "seconds": round(self.seconds, 3),
        }


# --------------------------------------------------------------------------- the reference


def reference_trace(candidate: Trace, *, name: str = "reference") -> Trace:
    """An engine's own free run, re-labelled as an oracle trace.

    Its chosen tokens must be the greedy choice of its own top-k lists, ties broken to the
    lowest id (`torch.argmax`'s rule, which the oracle role requires); an engine that breaks
    that is an engine failure here, not bad input.
    """
    for rec in candidate.records:
        if rec.top_logprobs is None:
            raise EngineError(f"{name}: the unmutated engine gave no top logprobs for prompt {rec.id!r}")
        try:
            check_top_logprobs(f"<{name}>", None, list(rec.top_logprobs), rec.token_ids, oracle=True)
        except TraceError as exc:
            raise EngineError(f"{name}: prompt {rec.id!r}: {exc.problem}") from None
    h = candidate.header
    header = TraceHeader(role="oracle", model=h.model, top_k=h.top_k, engine=h.engine, extra=dict(h.extra))
    records = tuple(replace(r, forced_token_ids=None) for r in candidate.records)
    return Trace(header=header, records=records, path=f"<{name}>")


def exact_top2_ties(trace: Trace) -> int:
    """Positions where the oracle's top two logprobs are equal bit for bit."""
    return sum(
        1
        for rec in trace.records
        for top in rec.top_logprobs or ()
        if len(top) >= 2 and float(top[0][1]) == float(top[1][1])
    )


def changed_positions(reference: Trace, mutant: Trace) -> tuple[int, int]:
    """(prompts whose free run differs, positions whose forced choice differs) from the reference.

    A prompt whose free run equals the reference's has the reference's context throughout
    and so no changed position; one that differs was forced along the reference's tokens.
    """
    cand = mutant.by_id()
    prompts = positions = 0
    for ref in reference.records:
        c = cand[ref.id]
        if tuple(c.token_ids[: len(ref.token_ids)]) == tuple(ref.token_ids):
            continue
        prompts += 1
        forced = c.forced_token_ids
        if forced is None:  # not forced: at least the first divergence changed
            positions += 1
            continue
        positions += sum(1 for a, b in zip(forced, ref.token_ids, strict=True) if a != b)
    return prompts, positions


def reported_positions(result: GateResult) -> int:
    return len({(d.prompt_id, d.position) for d in result.divergences})


# --------------------------------------------------------------------------- judging


def judge(expect: str, changed: int, result: GateResult) -> tuple[str, bool, str]:
    """(status, expectation met, why) for a mutant that changed `changed` positions."""
    reported = reported_positions(result)
    if changed == 0:
        if result.verdict != STRICT_PASS:
            return MISSED, False, "the mutant changed no token, yet the gate reported divergences"
        if expect == EXPECT_CAUGHT:
            return UNCHANGED, True, "no token changed on this suite: nothing to catch"
        return UNCHANGED, False, "no token changed on this suite, so the expectation was not exercised"
    if reported < changed or result.verdict == STRICT_PASS:
        return MISSED, False, f"the mutant changed {changed} positions but the gate reported {reported}"
    c = result.counts
    classes = {d.cls for d in result.divergences}
    if expect == EXPECT_EXACT_TIES:
        ok = classes == {EXACT_TIE} and all(d.tie_break == "higher_id" for d in result.divergences)
        why = (
            f"all {reported} changes are exact ties broken to the higher id"
            if ok
            else f"expected only exact ties broken to the higher id, found {_classes(c)}"
        )
        return CAUGHT, ok, why
    if expect == EXPECT_NO_DEFECT:
        ok = DEFECT not in classes
        why = (
            f"all {reported} changes are within the doctrine ({_classes(c)})"
            if ok
            else f"expected ties and near ties only, found {_classes(c)}"
        )
        return CAUGHT, ok, why
    if expect == EXPECT_DEFECT:
        ok = DEFECT in classes
        why = f"reported as {_classes(c)}" + ("" if ok else ": expected at least one defect")
        return CAUGHT, ok, why
    return CAUGHT, True, f"all {reported} changes reported ({_classes(c)})"


def _classes(c: Mapping[str, int]) -> str:
    return f"{c['exact_ties']} exact ties, {c['near_ties']} near ties, {c['defects']} defects"


# --------------------------------------------------------------------------- orchestration


class _Quiet:
    def phase(self, name: str, total: int) -> None:
        pass

    def advance(self, n: int = 1) -> None:
        pass


def force_along(
    engine: Engine,
    oracle: Trace,
    free: Trace,
    *,
    known: Mapping[str, PromptRecord] | None = None,
    progress: Progress | None = None,
) -> Trace:
    """`free` with `forced_token_ids` on every prompt whose free run left `oracle`'s tokens.

    A forced decode depends only on the prompt and the tokens fed, so a record in `known`
    that was forced along the very same tokens is reused instead of decoded again (the
    mutant's run against the pin reuses its run against the reference wherever the
    reference and the pin agree).
    """
    progress = progress or _Quiet()
    name = getattr(engine, "name", "engine")
    cand = free.by_id()
    todo = [o for o in oracle.records if tuple(cand[o.id].token_ids[: len(o.token_ids)]) != tuple(o.token_ids)]
    progress.phase("force", len(todo))
    forced: dict[str, PromptRecord] = {}
    for o in todo:
        prior = (known or {}).get(o.id)
        if prior is not None and prior.forced_token_ids is not None:
            forced[o.id] = replace(cand[o.id], forced_token_ids=prior.forced_token_ids, extra=dict(prior.extra))
            progress.advance()
            continue
        # Only the choices are needed: no top-k lists (top_k 0) saves a softmax per step.
        fd = engine_call(engine, "force", partial(engine.force, o.prompt_token_ids, o.token_ids, 0))
        if len(fd.token_ids) != len(o.token_ids):
            raise EngineError(
                f"engine {name!r}: force returned {len(fd.token_ids)} choices for {len(o.token_ids)} tokens "
                f"(prompt {o.id!r})"
            )
        c = cand[o.id]
        forced[o.id] = replace(
            c, forced_token_ids=tuple(int(t) for t in fd.token_ids), extra={**c.extra, "forced_mode": fd.mode}
        )
        progress.advance()
    return replace(free, records=tuple(forced.get(r.id, r) for r in free.records))


def _same_tokens(reference: Trace, pin: Trace, forced: Trace) -> dict[str, PromptRecord]:
    """The records of `forced` (forced along the reference) usable against the pin: those of
    prompts where the reference and the pin have the same tokens."""
    ref = reference.by_id()
    done = forced.by_id()
    return {r.id: done[r.id] for r in pin.records if r.id in ref and ref[r.id].token_ids == r.token_ids}


@contextmanager
def _engine(load: Callable[[], Engine], name: str) -> Iterator[Engine]:
    engine = engine_call(name, "load", load)
    try:
        yield engine
    finally:
        engine_call(name, "close", engine.close)


def run_selftest(
    pin: Pin,
    baseline: Callable[[], Engine],
    mutations: Sequence[Mutation],
    doctrine: Doctrine,
    *,
    progress: Progress | None = None,
    on_mutant: Callable[[str], None] | None = None,
) -> SelfTestResult:
    """Run the unmutated engine, then every mutation, over `pin`'s prompts and judge them."""
    start = time.perf_counter()
    progress = progress or _Quiet()
    announce = on_mutant or (lambda _name: None)

    announce("reference")
    with _engine(baseline, "baseline") as engine:
        info = engine_call(engine, "info", engine.info)
        base_free = run_candidate(engine, pin, progress=progress, info=info)
        reference = reference_trace(base_free)
        base_forced = force_along(engine, pin.trace, base_free, progress=progress)
    baseline_vs_pin = compare(pin.trace, base_forced, doctrine)

    outcomes: list[MutantOutcome] = []
    for m in mutations:
        announce(m.name)
        t0 = time.perf_counter()
        with _engine(m.load, m.name) as engine:
            free = run_candidate(engine, pin, progress=progress)
            vs_ref = force_along(engine, reference, free, progress=progress)
            known = _same_tokens(reference, pin.trace, vs_ref)
            vs_pin = force_along(engine, pin.trace, free, known=known, progress=progress)
        r_ref = compare(reference, vs_ref, doctrine)
        r_pin = compare(pin.trace, vs_pin, doctrine)
        prompts, changed = changed_positions(reference, vs_ref)
        status, met, why = judge(m.expect, changed, r_ref)
        outcomes.append(
            MutantOutcome(
                name=m.name,
                description=m.description,
                expect=m.expect,
                status=status,
                met=met,
                why=why,
                changed_prompts=prompts,
                changed_positions=changed,
                reported_positions=reported_positions(r_ref),
                against_reference=Verdict.of(r_ref),
                against_pin=Verdict.of(r_pin),
                seconds=time.perf_counter() - t0,
                reference_result=r_ref,
                pin_result=r_pin,
                candidate=vs_ref,
            )
        )
    return SelfTestResult(
        model=pin.model,
        engine=f"{info.get('name', 'engine')} {info.get('version', '')}".strip(),
        doctrine=doctrine,
        prompts=len(reference.records),
        positions=sum(len(r.token_ids) for r in reference.records),
        reference_exact_ties=exact_top2_ties(reference),
        baseline_against_pin=Verdict.of(baseline_vs_pin),
        mutants=tuple(outcomes),
        seconds=time.perf_counter() - start,
        reference=reference,
    )
