"""The records of a verdict: each divergence, each prompt's result, the whole result with its
counts, verdict, exit code and one-line summary (pure; `gate.core.verdict.adjudicate` makes them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gate.core.traces.moe import RoutingFlip, RoutingSummary
from gate.core.verdict.distribution import RunDistribution
from gate.core.verdict.doctrine import Doctrine
from gate.core.verdict.evidence import RunDrift
from gate.core.verdict.own_lists import NotGreedy
from gate.core.verdict.run_record import RunRecord
from gate.text import plural

EXACT_TIE = "exact_tie"
NEAR_TIE = "near_tie"
DEFECT = "defect"
_SEVERITY = {EXACT_TIE: 0, NEAR_TIE: 1, DEFECT: 2}

FREE_RUN = "free_run"
FORCED = "forced"


STRICT_PASS = "strict_pass"
RATIFIED_PASS = "ratified_pass"
FAIL = "fail"

ALTERNATIVES_SHOWN = 5

# Per-position outcome codes, one character each in `PromptResult.outcomes`.
OUTCOME_MATCH = "m"  # the candidate took the oracle's token (free run, or forced where given)
OUTCOME_EXACT_TIE = "e"
OUTCOME_NEAR_TIE = "n"
OUTCOME_DEFECT = "d"
OUTCOME_UNADJUDICATED = "u"  # downstream of a free-run divergence, without forced data
OUTCOME_OF_CLASS = {EXACT_TIE: OUTCOME_EXACT_TIE, NEAR_TIE: OUTCOME_NEAR_TIE, DEFECT: OUTCOME_DEFECT}
OUTCOME_NAMES = {
    OUTCOME_MATCH: "match",
    OUTCOME_EXACT_TIE: "exact tie",
    OUTCOME_NEAR_TIE: "near tie",
    OUTCOME_DEFECT: "defect",
    OUTCOME_UNADJUDICATED: "unadjudicated",
}


@dataclass(frozen=True, slots=True)
class Divergence:
    """One classified position (`gate.core.verdict.chain.classify` makes it).

    Two units, on purpose (the JSON keys are the report's, kept as they are): `gap_ulps`
    counts steps of the dtype's grid at the oracle's top logit (`ulp_mnats` each), the grid
    rule's unit, while `gap_units` and `candidate_margin_ulps` count the evidence rule's
    unit (`unit_mnats` each), that step taken at max(|top logit|, floor_logit) so that it
    never shrinks below where honest drift stops shrinking; the two agree at |top logit| >=
    floor_logit."""

    prompt_id: str
    position: int
    source: str
    oracle_token: int
    candidate_token: int | None
    cls: str
    top2_gap_mnats: float | None
    oracle_minus_candidate_mnats: float | None
    gap_lower_bound_mnats: float | None
    candidate_rank: int | None
    tie_break: str | None
    # Beyond the spec's keys: what a person adjudicating needs to see.
    oracle_logprob: float | None = None
    candidate_logprob: float | None = None
    gap_ulps: float | None = None
    ulp_mnats: float | None = None
    forced_mode: str | None = None
    # The candidate's own margin for its token at the flip, in grid steps (evidence doctrine).
    candidate_margin_ulps: float | None = None
    oracle_text: str | None = None
    candidate_text: str | None = None
    alternatives: tuple[tuple[int, float, str | None], ...] = ()
    # MoE models: the first router flip at or before this position (gate.core.verdict.routing).
    routing_flip: RoutingFlip | None = None
    # The code of the rule that decided the class (`gate.core.verdict.chain.CHAIN`).
    rule: str = ""
    gap_units: float | None = None
    unit_mnats: float | None = None
    # A defect only for want of the candidate's own list (rule no_list, the oracle's gap
    # within the evidence rule's limit): not judged, rather than found wrong in the numbers.
    want_of_evidence: bool = False

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "prompt_id": self.prompt_id,
            "position": self.position,
            "source": self.source,
            "oracle_token": self.oracle_token,
            "candidate_token": self.candidate_token,
            "class": self.cls,
            "top2_gap_mnats": self.top2_gap_mnats,
            "oracle_minus_candidate_mnats": self.oracle_minus_candidate_mnats,
            "gap_lower_bound_mnats": self.gap_lower_bound_mnats,
            "candidate_rank": self.candidate_rank,
            "tie_break": self.tie_break,
            "oracle_logprob": self.oracle_logprob,
            "candidate_logprob": self.candidate_logprob,
        }
        if self.gap_ulps is not None:
            out["gap_ulps"] = self.gap_ulps
        if self.ulp_mnats is not None:
            out["ulp_mnats"] = self.ulp_mnats
        if self.forced_mode is not None:
            out["forced_mode"] = self.forced_mode
        if self.candidate_margin_ulps is not None:
            out["candidate_margin_ulps"] = self.candidate_margin_ulps  # floored units, like gap_units
            out["candidate_margin_units"] = self.candidate_margin_ulps
        if self.gap_units is not None:
            out["gap_units"] = self.gap_units
        if self.unit_mnats is not None:
            out["unit_mnats"] = self.unit_mnats
        if self.rule:
            out["rule"] = self.rule
        if self.want_of_evidence:
            out["not_judged"] = "want_of_evidence"
        if self.oracle_text is not None:
            out["oracle_text"] = self.oracle_text
        if self.candidate_text is not None:
            out["candidate_text"] = self.candidate_text
        if self.routing_flip is not None:
            out["routing_flip"] = self.routing_flip.to_dict()
        return out


@dataclass(frozen=True, slots=True)
class PromptResult:
    id: str
    strict: bool
    ratified: bool
    positions: int
    positions_matched: int
    first_divergence: int | None
    unadjudicated: int = 0
    extra_candidate_tokens: int = 0
    prompt: str | None = None
    # One OUTCOME_* character per oracle position (what a report colours): match, exact
    # tie, near tie, defect or unadjudicated. Empty when built without it.
    outcomes: str = ""
    # Positions where forced decoding, in the context of the candidate's own free run
    # (the matched prefix and the first divergence), chose another token than that run.
    forced_disagrees_with_free_run: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "strict": self.strict,
            "ratified": self.ratified,
            "positions": self.positions,
            "positions_matched": self.positions_matched,
            "first_divergence": self.first_divergence,
            "unadjudicated_positions": self.unadjudicated,
            "extra_candidate_tokens": self.extra_candidate_tokens,
            "outcomes": self.outcomes,
            "forced_disagrees_with_free_run": self.forced_disagrees_with_free_run,
        }


@dataclass(frozen=True, slots=True)
class GateResult:
    doctrine: Doctrine
    prompts: tuple[PromptResult, ...]
    divergences: tuple[Divergence, ...]
    model: str = ""
    oracle_engine: str = ""
    candidate_engine: str = ""
    # What ran (`gate run`): None for two trace files compared as they are.
    run: RunRecord | None = None
    # Attachments for the reports, e.g. the HTML report's "figures" (`gate.core.calibration.calibrate`).
    meta: dict[str, Any] = field(default_factory=dict)
    # What the inputs say that a person should know but that does not decide the verdict
    # (the two headers name different models, say). Shown in every report.
    warnings: tuple[str, ...] = ()
    # MoE models whose oracle recorded its routing (gate.core.verdict.routing).
    routing: RoutingSummary | None = None
    # The run's drift against the oracle (evidence doctrine only).
    drift: RunDrift | None = None
    # Where the candidate's choice is not a maximum of its own reported list (the first
    # NOT_GREEDY_KEPT), and how many there are in all.
    not_greedy: tuple[NotGreedy, ...] = ()
    not_greedy_total: int = 0
    # The run's distribution against the oracle's, and against the pin's floor when it has one.
    distribution: RunDistribution | None = None
    # The oracle trace's identity (`gate.core.traces.digest`): two reports with the same
    # value were judged against the same pin (`gate diff` checks it).
    oracle_sha256: str = ""

    @property
    def counts(self) -> dict[str, int]:
        classes = [d.cls for d in self.divergences]
        return {
            "prompts": len(self.prompts),
            "strict_pass": sum(p.strict for p in self.prompts),
            "ratified_pass": sum(p.ratified for p in self.prompts),
            "positions": sum(p.positions for p in self.prompts),
            "positions_matched": sum(p.positions_matched for p in self.prompts),
            "unadjudicated_positions": sum(p.unadjudicated for p in self.prompts),
            "exact_ties": classes.count(EXACT_TIE),
            "near_ties": classes.count(NEAR_TIE),
            "defects": classes.count(DEFECT),
            # Of the defects, those not judged for want of the candidate's lists (an addition).
            "not_judged_for_want_of_evidence": sum(d.want_of_evidence for d in self.divergences),
        }

    @property
    def verdict(self) -> str:
        if self.distribution is not None and self.distribution.beyond:
            return FAIL  # numerics beyond honest drift: not the reference model, flips or not
        if self.distribution is not None and self.distribution.insufficient:
            return FAIL  # a floor the candidate reported too little to be judged by: never a silent pass
        if self.distribution is not None and self.distribution.disagrees:
            return FAIL  # its free run and its forced decode disagree beyond honest drift
        if all(p.strict for p in self.prompts):
            return STRICT_PASS
        if all(p.ratified for p in self.prompts):
            return RATIFIED_PASS
        return FAIL

    @property
    def exit_code(self) -> int:
        verdict = self.verdict
        if verdict == STRICT_PASS or (verdict == RATIFIED_PASS and not self.doctrine.strict):
            return 0
        return 1

    @property
    def summary(self) -> str:
        return summary_line(self)

    def to_dict(self) -> dict[str, Any]:
        return {
            "gate_report": 1,
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "doctrine": self.doctrine.to_dict(),
            "counts": self.counts,
            "prompts": [p.to_dict() for p in self.prompts],
            "divergences": [d.to_dict() for d in self.divergences],
            "summary": self.summary,
            "model": self.model,
            "oracle_engine": self.oracle_engine,
            "candidate_engine": self.candidate_engine,
            "warnings": list(self.warnings),
            **({"oracle_sha256": self.oracle_sha256} if self.oracle_sha256 else {}),
            # A report of part of the suite says so, and what ran (a complete run's report
            # stays the same whether it was sharded, resumed or run at once).
            **({"meta": self.run.to_dict()} if self.run is not None and self.run.partial else {}),
            **({"routing": self.routing.to_dict()} if self.routing is not None else {}),
            **({"drift": self.drift.to_dict()} if self.drift is not None else {}),
            **(
                {"not_greedy": [g.to_dict() for g in self.not_greedy], "not_greedy_total": self.not_greedy_total}
                if self.not_greedy_total
                else {}
            ),
            **({"distribution": self.distribution.to_dict()} if self.distribution is not None else {}),
            # Where the pin was recorded and where the candidate ran (`gate run`).
            **({"machine": dict(self.run.machine)} if self.run is not None and self.run.machine else {}),
            **({"doctrine_source": self.doctrine.source} if self.doctrine.source else {}),
        }


def summary_line(result: GateResult) -> str:
    """`6/7 prompts strict 16/16, 108/112 positions; 7/7 ratified (1 exact tie, 0 near ties, 0 defects)`."""
    c = result.counts
    lengths = {p.positions for p in result.prompts}
    per_prompt = f" {next(iter(lengths))}/{next(iter(lengths))}" if len(lengths) == 1 else ""
    return (
        f"{c['strict_pass']}/{c['prompts']} prompts strict{per_prompt}, "
        f"{c['positions_matched']}/{c['positions']} positions; "
        f"{c['ratified_pass']}/{c['prompts']} ratified "
        f"({plural(c['exact_ties'], 'exact tie', 'exact ties')}, "
        f"{plural(c['near_ties'], 'near tie', 'near ties')}, "
        f"{plural(c['defects'], 'defect', 'defects')})"
    )


def summary_legend(result: GateResult) -> str | None:
    """What the summary's `strict 16/16` counts, when it shows one: every prompt has the
    same number of positions, and a strict prompt matched all of them. None otherwise."""
    lengths = {p.positions for p in result.prompts}
    if len(lengths) != 1:
        return None
    n = next(iter(lengths))
    return (
        f"(strict {n}/{n}: every prompt has {n} oracle positions, and a strict prompt matches the oracle's "
        f"tokens at all {n} of them)"
    )
