"""The doctrine as an ordered chain (`gate.core.verdict.chain`): the chain is the order the
doctrine page documents, each rule is named by a code the reports print and decides a case
of its own, and the order matters (swapping two rules changes a decision)."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gate.core.verdict.chain import CHAIN, PositionEvidence, Rule, classify, decide, position_evidence
from gate.core.verdict.doctrine import Doctrine, Evidence
from gate.core.verdict.evidence import RunDrift
from gate.core.verdict.floor import Floor
from gate.core.verdict.result import DEFECT, EXACT_TIE, NEAR_TIE
from gate.core.verdict.rules import RULES

DOCS = Path(__file__).resolve().parents[2] / "docs" / "reference" / "doctrine.md"
CLASS_WORDS = {"defect": DEFECT, "exact tie": EXACT_TIE, "near tie": NEAR_TIE}

# bf16 at |logit| 20: one grid step is 0.125 nats, and so is the evidence unit (floor 16).
LOGIT, STEP = 20.0, 0.125
ORACLE, CAND, OTHER = 5, 7, 9
EVIDENCE = Doctrine(near_tie_mnats=60.0, near_tie_ulps=2.0, dtype="bfloat16", evidence=Evidence(4.0, 2.0, 2.0))
GRID = Doctrine(near_tie_mnats=60.0, near_tie_ulps=2.0, dtype="bfloat16")
MNATS = Doctrine()
# Under a floor every list the candidate was asked for must be there: `not_greedy` answers first.
FLOORED = Doctrine(floor=Floor(kl_mean_mnats=1.0, kl_p99_mnats=10.0, same_top_rate=0.98, margin=1.2, measured_by="t"))
CALM = RunDrift(20, 0.5, 1.0, 1.0, 0.0, 2.0, 4.0)
DRIFTING = RunDrift(20, 2.5, 3.0, 4.0, 0.0, 2.0, 4.0)


def documented_chain() -> list[tuple[str, str, str]]:
    """(code, class, sentence) of each row of the doctrine page's "How a divergence is
    classified" table."""
    text = DOCS.read_text(encoding="utf-8")
    section = text.split("## How a divergence is classified", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\d+) \| `([a-z_]+)` \| ([a-z ]+) \| (.+) \|$", section, flags=re.MULTILINE)
    assert [int(n) for n, _, _, _ in rows] == list(range(1, len(rows) + 1))
    return [(code, CLASS_WORDS[cls], says) for _, code, cls, says in rows]


def flip(
    doctrine: Doctrine,
    gap_steps: float,
    margin_steps: float | None = None,
    *,
    candidate: int | None = CAND,
    top_logit: float | None = LOGIT,
    **kw: Any,
) -> PositionEvidence:
    """Oracle token 5 at -0.5, the candidate's `gap_steps` grid steps below it; the candidate's
    own list holds its token `margin_steps` steps above the oracle's (None: no list)."""
    o_lp, c_lp = -0.5, -0.5 - gap_steps * STEP
    top = sorted([(ORACLE, o_lp), (CAND, c_lp), (OTHER, -6.0)], key=lambda p: (-p[1], p[0]))
    own = None
    if margin_steps is not None:
        own = sorted([(CAND, -0.5), (ORACLE, -0.5 - margin_steps * STEP), (OTHER, -6.0)], key=lambda p: (-p[1], p[0]))
    return position_evidence(
        prompt_id="p",
        position=3,
        source="forced",
        top=top,
        oracle_token=ORACLE,
        candidate_token=candidate,
        doctrine=doctrine,
        top_logit=top_logit,
        candidate_top=own,
        **kw,
    )


# One case per rule, each decided by that rule: (code, doctrine, evidence).
CASES: list[tuple[str, Doctrine, PositionEvidence]] = [
    ("ran_out", MNATS, flip(MNATS, 1.0, candidate=None)),
    ("not_in_top_k", MNATS, flip(MNATS, 1.0, candidate=11)),
    ("not_greedy", FLOORED, flip(FLOORED, 0.0, not_greedy=True)),
    ("exact_tie", MNATS, flip(MNATS, 0.0)),
    ("near_tie_mnats", EVIDENCE, flip(EVIDENCE, 0.25, 1.0, drift=DRIFTING)),
    ("drift_beyond", EVIDENCE, flip(EVIDENCE, 2.0, 1.0, drift=DRIFTING)),
    ("oracle_gap_beyond", EVIDENCE, flip(EVIDENCE, 5.0, 1.0, drift=CALM)),
    ("negative_margin", EVIDENCE, flip(EVIDENCE, 2.0, -1.0, drift=CALM)),
    ("own_margin_beyond", EVIDENCE, flip(EVIDENCE, 2.0, 3.0, drift=CALM)),
    ("near_tie_evidence", EVIDENCE, flip(EVIDENCE, 3.0, 1.0, drift=CALM)),
    ("no_list", EVIDENCE, flip(EVIDENCE, 1.5, None, drift=CALM)),
    ("near_tie_grid_steps", GRID, flip(GRID, 1.5)),
    ("beyond_grid_steps", GRID, flip(GRID, 3.0)),
    ("beyond_mnats", MNATS, flip(MNATS, 4.0)),
]


def test_the_chain_is_the_documented_order() -> None:
    assert [(r.code, r.cls, r.says) for r in CHAIN] == documented_chain()


def test_every_rule_is_named_by_a_code_the_reports_print() -> None:
    codes = [r.code for r in CHAIN]
    assert len(set(codes)) == len(codes)
    assert set(codes) == set(RULES)
    assert CHAIN[-1].code == "beyond_mnats"  # the last rule always answers


@pytest.mark.parametrize(("code", "doctrine", "ev"), CASES, ids=[c[0] for c in CASES])
def test_each_rule_decides_its_case_and_the_report_prints_its_code(
    code: str, doctrine: Doctrine, ev: PositionEvidence
) -> None:
    rule = next(r for r in CHAIN if r.code == code)
    d = classify(ev, doctrine)
    assert (d.cls, d.rule) == (rule.cls, code)
    assert d.to_dict()["rule"] == code and d.to_dict()["class"] == rule.cls
    # Every rule before it passes; it answers.
    at = CHAIN.index(rule)
    assert all(r(ev, doctrine) is None for r in CHAIN[:at])
    assert rule(ev, doctrine) is not None


def _swapped(a: str, b: str) -> tuple[Rule, ...]:
    chain = list(CHAIN)
    i, j = (next(k for k, r in enumerate(chain) if r.code == c) for c in (a, b))
    chain[i], chain[j] = chain[j], chain[i]
    return tuple(chain)


@pytest.mark.parametrize(
    ("first", "second", "case", "swapped_to"),
    [
        ("not_greedy", "exact_tie", "not_greedy", (EXACT_TIE, "exact_tie")),
        ("near_tie_mnats", "drift_beyond", "near_tie_mnats", (DEFECT, "drift_beyond")),
        ("oracle_gap_beyond", "near_tie_evidence", "oracle_gap_beyond", (NEAR_TIE, "near_tie_evidence")),
        ("no_list", "near_tie_grid_steps", "no_list", (NEAR_TIE, "near_tie_grid_steps")),
        ("ran_out", "beyond_mnats", "ran_out", (DEFECT, "beyond_mnats")),
    ],
)
def test_the_order_decides(first: str, second: str, case: str, swapped_to: tuple[str, str]) -> None:
    """Swapping two rules changes a decision: the order test above guards something real."""
    _, doctrine, ev = next(c for c in CASES if c[0] == case)
    assert (decide(ev, doctrine).cls, decide(ev, doctrine).rule) == (
        next(r.cls for r in CHAIN if r.code == case),
        case,
    )
    changed = decide(ev, doctrine, _swapped(first, second))
    assert (changed.cls, changed.rule) == swapped_to


def test_a_chain_without_a_last_word_is_refused() -> None:
    _, doctrine, ev = next(c for c in CASES if c[0] == "beyond_mnats")
    with pytest.raises(ValueError, match="no rule"):
        decide(ev, doctrine, CHAIN[:-1])


@pytest.mark.parametrize(("code", "doctrine", "ev"), CASES, ids=[c[0] for c in CASES])
def test_less_evidence_never_ratifies_more(code: str, doctrine: Doctrine, ev: PositionEvidence) -> None:
    """Dropping the candidate's own list here (its part keeps lists elsewhere), or the oracle's
    top logit, never turns a defect into a tie."""
    before = classify(ev, doctrine)
    fewer = [
        replace(ev, candidate_top=None, margin_units=None),
        replace(ev, grid_step=None, unit=None, margin_units=None),
    ]
    for less in fewer:
        if before.cls == DEFECT:
            assert classify(less, doctrine).cls == DEFECT, (code, less)


@pytest.mark.parametrize("gap", [0.0, 0.2])
def test_without_a_floor_not_greedy_never_undoes_what_the_oracle_list_alone_ratifies(gap: float) -> None:
    """Without a floor a candidate may give no lists at all and is judged on the oracle's
    list alone: an exact tie or a tie within the mnats stays one, whatever its lists show
    (else dropping them would pass it); past the mnats, not greedy is a defect."""
    tie = flip(EVIDENCE, gap, 1.0, drift=CALM, not_greedy=True)
    assert classify(tie, EVIDENCE).cls != DEFECT
    beyond = flip(EVIDENCE, 3.0, 1.0, drift=CALM, not_greedy=True)
    assert (classify(beyond, EVIDENCE).cls, classify(beyond, EVIDENCE).rule) == (DEFECT, "not_greedy")
    # The same flip from a greedy candidate whose lists are complete is ratified by the evidence rule,
    assert classify(replace(beyond, not_greedy=False), EVIDENCE).cls == NEAR_TIE
    # and from one whose lists are not all there, it is not.
    assert classify(replace(beyond, not_greedy=False, lists_complete=False), EVIDENCE).cls == DEFECT
