"""Every report says when a pin's floor could not judge what the candidate reported, and that
it is not a pass (the distribution verdict's `distribution_not_judged`). Pure."""

from __future__ import annotations

import html

import orjson
from helpers.evidence_cuts import apply_cuts
from helpers.generated_traces import DOCTRINES, build

from gate.core.verdict.adjudicate import compare
from gate.reports import render


def test_every_report_names_a_run_the_floor_could_not_judge() -> None:
    oracle, cand = build(seed=3, noise=0.0)
    cut = apply_cuts(cand, oracle, [("drop_entry", 1)])
    r = compare(oracle, cut, DOCTRINES["floor"])
    assert r.verdict == "fail" and r.exit_code == 1
    for fmt in ("rich", "markdown", "html"):
        text = " ".join(html.unescape(render(r, fmt)).replace("\\", "").split())
        assert "NOT JUDGED" in text and "1 list shorter than the pin's top_k 4" in text, fmt
        assert "Not a pass (exit 1, rule distribution_not_judged)" in text, fmt
    assert "could not judge what the candidate reported" in " ".join(render(r, "rich").split())
    junit = render(r, "junit")
    assert 'name="distribution"' in junit and "NOT JUDGED" in junit
    js = orjson.loads(render(r, "json"))
    dist = js["distribution"]
    assert dist["rule"] == "distribution_not_judged" and dist["judged"] is False
    assert dist["coverage"]["short_lists"] == 1 and "shorter" in dist["not_judged_reason"]
