"""Why a divergence has its class, in one place (pure: no I/O, no torch).

- `PositionEvidence`: everything the doctrine weighs at one position where the candidate's
  token is not the oracle's, measured once (`position_evidence`).
- `CHAIN`: the doctrine as an ordered tuple of small rules, each named by the rule code the
  reports print (`Divergence.rule`, the JSON report's `rule`, `gate.core.verdict.rules`).
  A rule answers with its class or passes (None).
- `classify(evidence, doctrine)`: the first rule that answers. The last rule
  (`beyond_mnats`) always answers.

Each rule carries its words: `says`, its row of docs/reference/doctrine.md's table, and
`sentence`, what every report prints for a divergence it decided (`reports._common.why`
only fills in the figures).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from gate.core.traces.trace import TopList
from gate.core.verdict.doctrine import DEFAULT_DTYPE, Doctrine, Evidence
from gate.core.verdict.evidence import RunDrift, candidate_margin
from gate.core.verdict.grid import grid_step, logprob_slack
from gate.core.verdict.result import DEFECT, EXACT_TIE, NEAR_TIE, Divergence
from gate.core.verdict.rules import (
    RULE_BEYOND_GRID,
    RULE_BEYOND_MNATS,
    RULE_DRIFT_BEYOND,
    RULE_EVIDENCE,
    RULE_EXACT_TIE,
    RULE_GRID,
    RULE_MNATS,
    RULE_NEGATIVE_MARGIN,
    RULE_NO_LIST,
    RULE_NOT_GREEDY,
    RULE_NOT_IN_TOP_K,
    RULE_ORACLE_GAP,
    RULE_OWN_MARGIN,
    RULE_RAN_OUT,
)

# --------------------------------------------------------------------------- the evidence


@dataclass(frozen=True, slots=True)
class PositionEvidence:
    """What the doctrine weighs at one position (oracle token o, candidate token c != o).

    Two units, on purpose: `grid_step` is one step of the dtype's grid at the oracle's top
    logit (the grid rule's unit, `near_tie_ulps`; `gap_ulps`/`ulp_mnats` in reports), and
    `unit` is that step at max(|top logit|, the evidence rule's least logit), so that it
    never shrinks below the size where honest drift stops shrinking (the evidence rule's
    unit; `gap_units`/`unit_mnats`/`candidate_margin_ulps` in reports); they agree at
    |top logit| >= floor_logit, and below it the unit is the larger.
    """

    prompt_id: str
    position: int
    source: str  # FREE_RUN or FORCED
    top: TopList  # the oracle's top-k list here
    oracle_token: int
    candidate_token: int | None  # None: the candidate ran out before this position
    oracle_logprob: float
    # None where the candidate ran out or its token is not in the oracle's list.
    candidate_logprob: float | None
    lowest_logprob: float  # the oracle list's lowest: the lower bound of an unlisted token's gap
    top2_gap_mnats: float | None
    rank: int | None  # c's place in the list in torch.argmax's order (logprob desc, then id asc)
    grid_step: float | None  # nats; None without the oracle's top logit (`token_logits`)
    unit: float | None  # nats; None without the evidence rule or the top logit
    margin_units: float | None  # u_c: the candidate's own logprob of c minus o's, in units
    candidate_top: TopList | None  # the candidate's own list here (free run or forced)
    drift: RunDrift | None  # the run's drift (evidence rule only)
    not_greedy: bool  # not greedy over its own lists somewhere it shares the oracle's context
    # Its lists are all there (none absent, empty or short) at every position where it shares
    # the oracle's context: the evidence rule weighs a list only from a candidate that gave
    # them all (one that drops the lists that speak against it earns nothing by it).
    lists_complete: bool = True

    @property
    def gap_nats(self) -> float | None:
        """L[o] - L[c] in nats, straight from the logprobs (None: c not in the list)."""
        return None if self.candidate_logprob is None else self.oracle_logprob - self.candidate_logprob

    @property
    def gap_mnats(self) -> float | None:
        return None if self.candidate_logprob is None else 1000.0 * (self.oracle_logprob - self.candidate_logprob)

    @property
    def tie_break(self) -> str | None:
        """`lower_id`/`higher_id` where both logprobs are equal bit for bit, else None."""
        if self.candidate_token is None or self.candidate_logprob != self.oracle_logprob:
            return None
        return "lower_id" if self.candidate_token < self.oracle_token else "higher_id"


def position_evidence(
    *,
    prompt_id: str,
    position: int,
    source: str,
    top: TopList,
    oracle_token: int,
    candidate_token: int | None,
    doctrine: Doctrine,
    top_logit: float | None = None,
    candidate_top: TopList | None = None,
    drift: RunDrift | None = None,
    not_greedy: bool = False,
    lists_complete: bool = True,
) -> PositionEvidence:
    """The evidence at one position, measured in the doctrine's dtype and units.

    `top_logit`: the oracle's top logit here (`token_logits`); `candidate_top`: the
    candidate's own list here; `drift`: the run's; `not_greedy`: whether the candidate is not
    greedy over its own lists anywhere in the run."""
    lps = {int(t): float(lp) for t, lp in top}
    o_lp = lps[oracle_token]
    dtype = doctrine.dtype or DEFAULT_DTYPE
    step = grid_step(top_logit, dtype) if top_logit is not None else None
    ev = doctrine.evidence
    unit = grid_step(ev.unit_logit(top_logit), dtype) if ev is not None and top_logit is not None else None
    c_lp = lps.get(candidate_token) if candidate_token is not None else None
    rank = None
    margin = None
    if candidate_token is not None and c_lp is not None:
        rank = 1 + sum(1 for t, lp in lps.items() if lp > c_lp or (lp == c_lp and t < candidate_token))
        if unit is not None:
            margin = candidate_margin(candidate_top, oracle_token, candidate_token, unit)
    return PositionEvidence(
        prompt_id=prompt_id,
        position=position,
        source=source,
        top=top,
        oracle_token=oracle_token,
        candidate_token=candidate_token,
        oracle_logprob=o_lp,
        candidate_logprob=c_lp,
        lowest_logprob=min(lps.values()),
        top2_gap_mnats=1000.0 * (float(top[0][1]) - float(top[1][1])) if len(top) >= 2 else None,
        rank=rank,
        grid_step=step,
        unit=unit,
        margin_units=margin,
        candidate_top=candidate_top,
        drift=drift,
        not_greedy=not_greedy,
        lists_complete=lists_complete,
    )


# --------------------------------------------------------------------------- the rules


@dataclass(frozen=True, slots=True)
class Decision:
    cls: str  # EXACT_TIE, NEAR_TIE or DEFECT
    rule: str  # the code of the rule that answered


@dataclass(frozen=True, slots=True)
class Rule:
    """One link of the chain: when `applies`, it answers `cls` under its `code`. `sentence`
    is a `str.format` template over `SENTENCE_FIELDS` (where the doctrine at hand lacks a
    limit it names, the report says `plain_rule(cls)`'s); `aside` follows it where the
    candidate's gap is known and not zero."""

    code: str  # as the reports print it (gate.core.verdict.rules)
    cls: str
    applies: Callable[[PositionEvidence, Doctrine], bool]
    says: str  # one sentence: what it decides (docs/reference/doctrine.md)
    sentence: str  # what the reports print for a divergence it decided
    aside: str = ""
    wanting: str = ""  # the sentence where it is not judged for want of evidence (Divergence.want_of_evidence)

    def __call__(self, ev: PositionEvidence, doctrine: Doctrine) -> Decision | None:
        return Decision(self.cls, self.code) if self.applies(ev, doctrine) else None


class _Weighed(NamedTuple):
    rule: Evidence
    unit: float
    candidate_logprob: float
    margin_units: float


def _evidence_at(ev: PositionEvidence, doctrine: Doctrine) -> _Weighed | None:
    """What the evidence rule weighs here, or None where it cannot be weighed (no rule, no
    unit, or no margin: the candidate's own list lacks either token, or it has none)."""
    rule, unit, c_lp, margin = doctrine.evidence, ev.unit, ev.candidate_logprob, ev.margin_units
    if rule is None or unit is None or c_lp is None or margin is None or not ev.lists_complete:
        return None
    return _Weighed(rule, unit, c_lp, margin)


def _within(gap: float | None, limit: float, *logprobs: float) -> bool:
    """0 < gap <= limit, each limit allowing one float32 rounding of the oracle's logprobs
    compared (a limit of 0 allows nothing: only a tie bit for bit is a tie)."""
    return gap is not None and 0.0 < gap <= limit + (logprob_slack(*logprobs) if limit > 0.0 else 0.0)


def _ran_out(ev: PositionEvidence, doctrine: Doctrine) -> bool:
    return ev.candidate_token is None


def _not_in_top_k(ev: PositionEvidence, doctrine: Doctrine) -> bool:
    return ev.candidate_logprob is None


def _not_greedy(ev: PositionEvidence, doctrine: Doctrine) -> bool:
    # Its lists contradict its own choices somewhere: its flips prove nothing (a sampler
    # with a penalty left on, logprobs taken before it). Under a floor every list it was
    # asked for must be there, so dropping the ones that show it is not a pass either. Without
    # one a candidate may give no lists and is then judged on the oracle's alone: its lists
    # cannot make defect what that judgement ratifies (less evidence never ratifies more).
    if not ev.not_greedy:
        return False
    if doctrine.floor is not None:
        return True
    bare = replace(ev, candidate_top=None, margin_units=None, drift=None, not_greedy=False, lists_complete=False)
    return decide(bare, doctrine).cls == DEFECT


def _exact_tie(ev: PositionEvidence, doctrine: Doctrine) -> bool:
    return ev.tie_break is not None


def _near_tie_mnats(ev: PositionEvidence, doctrine: Doctrine) -> bool:
    # One bf16 step taken between two float32 logprobs reads 125.0 or 125.00012 mnats: the
    # threshold allows that one rounding, so an honest near tie cannot flip class on it.
    if ev.candidate_logprob is None:
        return False
    limit = doctrine.near_tie_mnats / 1000.0
    return _within(ev.gap_nats, limit, ev.oracle_logprob, ev.candidate_logprob)


def _drift_beyond(ev: PositionEvidence, doctrine: Doctrine) -> bool:
    # Only allowances beyond the mnats need the grid; a drifting run earns none of them.
    return ev.grid_step is not None and ev.drift is not None and ev.drift.beyond


def _oracle_gap_beyond(ev: PositionEvidence, doctrine: Doctrine) -> bool:
    at = _evidence_at(ev, doctrine)
    return at is not None and not _within(
        ev.gap_nats, at.rule.oracle_ulps * at.unit, ev.oracle_logprob, at.candidate_logprob
    )


def _negative_margin(ev: PositionEvidence, doctrine: Doctrine) -> bool:
    # Its own list ranks the oracle's token above the one it took: no allowance.
    at = _evidence_at(ev, doctrine)
    return at is not None and at.margin_units < 0.0


def _own_margin_beyond(ev: PositionEvidence, doctrine: Doctrine) -> bool:
    at = _evidence_at(ev, doctrine)
    if at is None:
        return False
    # One float32 rounding of the two logprobs in question, taken at the oracle's values of
    # them: the candidate's own list cannot buy more slack by reporting logprobs of a larger
    # size (at -1e6 one float32 step is 0.06 nats), nor a far-down entry widen it.
    limit = at.rule.candidate_ulps * at.unit
    slack = logprob_slack(ev.oracle_logprob, at.candidate_logprob) if limit > 0.0 else 0.0
    return at.margin_units * at.unit > limit + slack


def _near_tie_evidence(ev: PositionEvidence, doctrine: Doctrine) -> bool:
    # Reached only past the three limits above: the rule weighed here ratifies.
    return _evidence_at(ev, doctrine) is not None


def _no_list(ev: PositionEvidence, doctrine: Doctrine) -> bool:
    # The doctrine asks for the candidate's own list here: its absence earns nothing,
    # wherever the candidate's other lists are (less evidence never ratifies more).
    return ev.grid_step is not None and doctrine.evidence is not None


def _near_tie_grid_steps(ev: PositionEvidence, doctrine: Doctrine) -> bool:
    if ev.grid_step is None or doctrine.near_tie_ulps is None or ev.candidate_logprob is None:
        return False
    return _within(ev.gap_nats, doctrine.near_tie_ulps * ev.grid_step, ev.oracle_logprob, ev.candidate_logprob)


def _beyond_grid_steps(ev: PositionEvidence, doctrine: Doctrine) -> bool:
    return ev.grid_step is not None and doctrine.near_tie_ulps is not None


def _always(ev: PositionEvidence, doctrine: Doctrine) -> bool:
    return True


# The sentence a defect past the mnats starts with: the last rule's, which the rules that
# name a further limit carry on.
_BEYOND = "defect: the candidate's token is {below}{steps} below the oracle's, above the {mnats}-mnat threshold"

# The doctrine, in order: the first rule that answers decides. Rules that need what a
# position may lack (a logit, a unit, the candidate's own list) pass without it.
CHAIN: tuple[Rule, ...] = (
    Rule(
        RULE_RAN_OUT,
        DEFECT,
        _ran_out,
        "the candidate stopped before this position",
        "defect: the candidate stopped before the oracle's continuation ended",
    ),
    Rule(
        RULE_NOT_IN_TOP_K,
        DEFECT,
        _not_in_top_k,
        "the candidate's token is not in the oracle's top-k list",
        (
            "defect: the candidate's token {candidate_token} is not in the oracle's top-k; it is at least "
            "{lower_bound} mnats below the oracle's"
        ),
    ),
    Rule(
        RULE_NOT_GREEDY,
        DEFECT,
        _not_greedy,
        (
            "the candidate is not greedy over its own logprobs where it shares the oracle's context: no "
            "allowance (without a floor, none beyond what the oracle's list alone ratifies)"
        ),
        (
            "defect: the candidate is not greedy over its own logprobs (at some position of the run it did not take "
            "the top of the list it reports; see 'not greedy'), so its flips earn no allowance"
        ),
        aside="; the candidate's token is {below} below the oracle's",
    ),
    Rule(
        RULE_EXACT_TIE,
        EXACT_TIE,
        _exact_tie,
        "both logprobs are equal bit for bit: a tie-break convention",
        "exact tie: both logprobs are {logprob} bit for bit; the candidate took the {direction} id{tie_rule}",
    ),
    Rule(
        RULE_MNATS,
        NEAR_TIE,
        _near_tie_mnats,
        "0 < the oracle's gap ≤ `near_tie_mnats`",
        "near tie: the candidate's token is {below}{steps} below the oracle's, within the {mnats}-mnat threshold",
    ),
    Rule(
        RULE_DRIFT_BEYOND,
        DEFECT,
        _drift_beyond,
        "the top logit is known and the run drifts beyond the evidence rule's limits: no allowance past the mnats",
        _BEYOND + "; the run drifts beyond the doctrine (see 'run drift'), so no allowance in units or grid steps",
    ),
    Rule(
        RULE_ORACLE_GAP,
        DEFECT,
        _oracle_gap_beyond,
        "evidence rule (the candidate's own list holds both tokens): the oracle's gap is beyond `oracle_ulps` units",
        _BEYOND + ", and the oracle's gap is {gap_units} {unit}, beyond the evidence rule's {oracle_ulps:g}",
    ),
    Rule(
        RULE_NEGATIVE_MARGIN,
        DEFECT,
        _negative_margin,
        "evidence rule: the candidate's own list ranks the oracle's token above the one it took",
        _BEYOND
        + (
            "; the candidate's own list ranks the oracle's token above the one it took (margin {margin_units} "
            "units): a negative margin earns no allowance"
        ),
    ),
    Rule(
        RULE_OWN_MARGIN,
        DEFECT,
        _own_margin_beyond,
        "evidence rule: the candidate's own margin for its token is beyond `candidate_ulps` units",
        _BEYOND
        + (
            "; the candidate's own list holds its token {margin_units} units above the oracle's, beyond the "
            "evidence rule's {candidate_ulps:g}: a clear choice, not a near tie"
        ),
    ),
    Rule(
        RULE_EVIDENCE,
        NEAR_TIE,
        _near_tie_evidence,
        "evidence rule: the oracle's gap and the candidate's own margin are both within their limits",
        (
            "near tie by the evidence rule: the oracle's gap is {gap_units} {unit} (limit {oracle_ulps:g}; "
            "{below}{steps}) and the candidate's own list holds its token {margin_units} units above the oracle's "
            "(limit {candidate_ulps:g}), in a run not found drifting beyond the doctrine — beyond the "
            "{mnats}-mnat threshold"
        ),
    ),
    Rule(
        RULE_NO_LIST,
        DEFECT,
        _no_list,
        "evidence rule, but no usable own list here (wherever its other lists are): its absence earns nothing",
        _BEYOND
        + (
            "; the candidate reports no usable list here ({part}), which the evidence rule needs: judged by the "
            "threshold alone (less evidence never ratifies more)"
        ),
        wanting=(
            "not judged for want of evidence: the candidate's token is {below}{steps} below the oracle's, above the "
            "{mnats}-mnat threshold, and the oracle's gap is {gap_units} {unit}, within the evidence rule's "
            "{oracle_ulps:g}; but the candidate reports no usable list here ({part}), which the rule needs to weigh "
            "it: not ratified (less evidence never ratifies more)"
        ),
    ),
    Rule(
        RULE_GRID,
        NEAR_TIE,
        _near_tie_grid_steps,
        "the oracle's top logit is known and the gap is within `near_tie_ulps` steps of its grid",
        (
            "near tie by the grid rule: the candidate's token is {below}{steps} below the oracle's, within "
            "{near_tie_ulps:g} grid steps (no own list weighed here) — beyond the {mnats}-mnat threshold"
        ),
    ),
    Rule(
        RULE_BEYOND_GRID,
        DEFECT,
        _beyond_grid_steps,
        "the oracle's top logit is known, `near_tie_ulps` is set, and the gap is beyond it",
        _BEYOND + " and beyond the grid rule's {near_tie_ulps:g} steps",
    ),
    Rule(RULE_BEYOND_MNATS, DEFECT, _always, "always: no rule above ratified the gap", _BEYOND),
)
RULE_BY_CODE: dict[str, Rule] = {rule.code: rule for rule in CHAIN}
# The figures a sentence may name, space-separated (gate.reports._common.why fills them in).
SENTENCE_FIELDS = (
    "below steps mnats unit gap_units margin_units oracle_ulps candidate_ulps near_tie_ulps logprob direction "
    "tie_rule candidate_token lower_bound part"
)


def plain_rule(cls: str) -> Rule:
    """The rule whose sentence a divergence of class `cls` gets where its own rule's cannot be
    said (it names a limit the doctrine at hand lacks, or its code is not the chain's)."""
    return RULE_BY_CODE[{EXACT_TIE: RULE_EXACT_TIE, NEAR_TIE: RULE_MNATS}.get(cls, RULE_BEYOND_MNATS)]


def decide(ev: PositionEvidence, doctrine: Doctrine, chain: Sequence[Rule] = CHAIN) -> Decision:
    """The first rule of `chain` that answers."""
    for rule in chain:
        decision = rule(ev, doctrine)
        if decision is not None:
            return decision
    raise ValueError("no rule of the chain answered (its last rule must always answer)")


def classify(ev: PositionEvidence, doctrine: Doctrine, chain: Sequence[Rule] = CHAIN) -> Divergence:
    """The divergence at one position: its figures, and the class and rule of the first rule
    of `chain` that answers."""
    decision = decide(ev, doctrine, chain)
    gap = ev.gap_nats
    # Not ratified only for want of the candidate's list: the oracle's gap is within the
    # evidence rule's limit, so its list alone could have decided (the class stays defect).
    want = (
        decision.rule == RULE_NO_LIST
        and doctrine.evidence is not None
        and ev.unit is not None
        and ev.candidate_logprob is not None
        and _within(gap, doctrine.evidence.oracle_ulps * ev.unit, ev.oracle_logprob, ev.candidate_logprob)
    )
    common: dict[str, Any] = {
        "prompt_id": ev.prompt_id,
        "position": ev.position,
        "source": ev.source,
        "oracle_token": ev.oracle_token,
        "candidate_token": ev.candidate_token,
        "top2_gap_mnats": ev.top2_gap_mnats,
        "oracle_logprob": ev.oracle_logprob,
        "ulp_mnats": 1000.0 * ev.grid_step if ev.grid_step is not None else None,
        "unit_mnats": 1000.0 * ev.unit if ev.unit is not None else None,
        "cls": decision.cls,
        "rule": decision.rule,
    }
    if gap is None:
        return Divergence(
            **common,
            oracle_minus_candidate_mnats=None,
            gap_lower_bound_mnats=1000.0 * (ev.oracle_logprob - ev.lowest_logprob),
            candidate_rank=None,
            tie_break=None,
        )
    return Divergence(
        **common,
        oracle_minus_candidate_mnats=ev.gap_mnats,
        gap_lower_bound_mnats=None,
        candidate_rank=ev.rank,
        tie_break=ev.tie_break,
        candidate_logprob=ev.candidate_logprob,
        # In nats straight from the logprobs: a round trip through mnats could add a rounding.
        gap_ulps=gap / ev.grid_step if ev.grid_step is not None else None,
        candidate_margin_ulps=ev.margin_units,
        gap_units=gap / ev.unit if ev.unit is not None else None,
        want_of_evidence=want,
    )
