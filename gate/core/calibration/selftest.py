"""Self-test by mutation, the records and the judging: does the gate catch faults
injected into an engine, and as what?

The run is `gate.workflows.calibration.selftest`; the faults themselves live with the engines
(`gate.engines.hf.mutants`) and arrive as `Mutation`s that build an engine. No torch here.

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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from gate.core.engine import Engine
from gate.core.traces.trace import Trace, TraceHeader
from gate.core.traces.validate import check_top_logprobs
from gate.core.verdict.doctrine import Doctrine
from gate.core.verdict.result import DEFECT, EXACT_TIE, STRICT_PASS, GateResult
from gate.errors import EngineError, TraceError
from gate.text import plural

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


class BuildsMutants(Protocol):
    """What an engine offers the self-test (`gate.engines.registry.mutants`): its unmutated
    build and its faults, on `model` with the user's `--engine-opt` strings."""

    def baseline_loader(self, model: str, options: Mapping[str, str]) -> Callable[[], Engine]: ...

    def mutations(
        self, model: str, options: Mapping[str, str], *, only: Sequence[str] | None = None
    ) -> list[Mutation]: ...


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
        changing = [m for m in self.mutants if m.changed_positions > 0]
        caught = sum(m.status == CAUGHT for m in changing)
        by_floor = sum(m.status == CAUGHT and m.changed_positions == 0 for m in self.mutants)
        met = sum(m.met for m in self.mutants)
        word = "passed" if self.ok else "FAILED"
        floor = f"; {by_floor} changing no token caught by the distribution verdict" if by_floor else ""
        return (
            f"selftest {word}: {caught}/{len(changing)} token-changing mutants caught{floor}; "
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
    dist = result.distribution
    beyond = dist is not None and dist.beyond
    floor_note = f"; the distribution verdict failed it ({'; '.join(dist.beyond_figures)})" if dist and beyond else ""
    if changed == 0:
        if result.divergences:
            return MISSED, False, "the mutant changed no token, yet the gate reported divergences"
        if beyond and expect == EXPECT_CAUGHT:
            return CAUGHT, True, f"no token changed on this suite{floor_note}"
        if expect == EXPECT_CAUGHT:
            return UNCHANGED, True, "no token changed on this suite: nothing to catch"
        return UNCHANGED, False, f"no token changed on this suite, so the expectation was not exercised{floor_note}"
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
        # The expectation is the token classes': a systematic one-step bias may also be
        # beyond the honest floor, which the why then says (a catch, not a miss).
        ok = DEFECT not in classes
        why = (
            f"all {reported} changes are within the doctrine's token rule ({_classes(c)}){floor_note}"
            if ok
            else f"expected ties and near ties only, found {_classes(c)}{floor_note}"
        )
        return CAUGHT, ok, why
    if expect == EXPECT_DEFECT:
        ok = DEFECT in classes
        why = f"reported as {_classes(c)}" + ("" if ok else ": expected at least one defect") + floor_note
        return CAUGHT, ok, why
    return CAUGHT, True, f"all {reported} changes reported ({_classes(c)}){floor_note}"


def _classes(c: Mapping[str, int]) -> str:
    ties = f"{plural(c['exact_ties'], 'exact tie')}, {plural(c['near_ties'], 'near tie')}"
    return f"{ties}, {plural(c['defects'], 'defect')}"
