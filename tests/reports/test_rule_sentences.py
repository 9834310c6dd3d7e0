"""Each rule of the chain owns its sentence: `gate.core.verdict.chain.CHAIN` carries the words
a report prints for a divergence a rule decided, and `gate.reports._common.why` only fills in
the figures. So a new rule prints its own sentence, never another rule's, and no renderer
writes a rule's words itself."""

from __future__ import annotations

import re
import string
from dataclasses import replace
from pathlib import Path

import pytest
from helpers.trace_builders import mixed_result

from gate.core.verdict import chain
from gate.core.verdict.chain import CHAIN, SENTENCE_FIELDS, Rule, plain_rule
from gate.core.verdict.doctrine import Doctrine, Evidence
from gate.core.verdict.result import DEFECT, EXACT_TIE, NEAR_TIE
from gate.reports._common import why

REPORTS = Path(__file__).resolve().parents[2] / "gate" / "reports"
OPENINGS = {DEFECT: "defect: ", EXACT_TIE: "exact tie: ", NEAR_TIE: "near tie"}
FULL = Doctrine(near_tie_mnats=60.0, near_tie_ulps=2.0, dtype="bfloat16", evidence=Evidence(4.0, 2.0, 2.0))


def _fields(template: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


@pytest.mark.parametrize("rule", CHAIN, ids=[r.code for r in CHAIN])
def test_every_rule_has_a_sentence_over_the_named_figures_opening_with_its_class(rule: Rule) -> None:
    assert rule.sentence.startswith(OPENINGS[rule.cls]), rule.code
    assert _fields(rule.sentence) | _fields(rule.aside) <= set(SENTENCE_FIELDS.split()), rule.code


def test_a_new_rule_prints_its_own_sentence_not_another_s(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    divergence = next(d for d in mixed_result(tmp_path).divergences if d.cls == DEFECT and d.rule == "beyond_mnats")
    new = Rule("brand_new", DEFECT, lambda ev, doc: True, "says", "defect: a brand new rule found {below}", "")
    monkeypatch.setitem(chain.RULE_BY_CODE, "brand_new", new)
    assert why(replace(divergence, rule="brand_new"), FULL) == "defect: a brand new rule found 1,000.0 mnats"


def test_a_sentence_whose_limit_the_doctrine_lacks_is_its_class_s_plain_one(tmp_path: Path) -> None:
    near = next(d for d in mixed_result(tmp_path).divergences if d.cls == NEAR_TIE)
    by_grid = replace(near, rule="near_tie_grid_steps")
    assert why(by_grid, FULL).startswith("near tie by the grid rule")
    assert why(by_grid, 125.0) == why(replace(near, rule="near_tie_mnats"), 125.0)
    assert plain_rule(NEAR_TIE).code == "near_tie_mnats" and plain_rule(DEFECT).code == "beyond_mnats"


def test_no_renderer_writes_a_rule_s_words() -> None:
    """Every literal stretch of every sentence (a run of words between two figures) appears
    in no module of gate/reports/: the chain is the only place they are written."""
    stretches = {
        text.strip(" ;,:—()")
        for rule in CHAIN
        for template in (rule.sentence, rule.aside)
        for text, _, _, _ in string.Formatter().parse(template)
    }
    stretches = {s for s in stretches if len(s) >= 24}
    assert len(stretches) >= 12
    for path in sorted(REPORTS.glob("*.py")):
        source = re.sub(r"\s+", " ", path.read_text(encoding="utf-8"))
        found = [s for s in stretches if s in source]
        assert not found, (path.name, found)
