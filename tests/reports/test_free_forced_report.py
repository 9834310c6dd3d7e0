"""Every report says when a candidate's free run and forced decode disagree beyond the floor,
names the rule in its first line, and that it is not a pass. Pure."""

from __future__ import annotations

import html

import orjson
from helpers.free_forced_traces import floor_between, two_minded

from gate.core.verdict.adjudicate import compare
from gate.core.verdict.free_forced import RULE_FREE_FORCED
from gate.reports import render


def test_every_report_names_a_free_run_that_disagrees_with_its_forced_decode() -> None:
    oracle, cand = two_minded()
    r = compare(oracle, cand, floor_between(oracle, cand))
    assert r.verdict == "fail" and r.exit_code == 1
    for fmt in ("rich", "markdown", "html"):
        text = " ".join(html.unescape(render(r, fmt)).replace("\\", "").split())
        assert f"rule {RULE_FREE_FORCED}" in text, fmt
        assert "FREE RUN AND FORCED DECODE DISAGREE" in text, fmt
    rich = " ".join(render(r, "rich").split())
    assert rich.startswith("FAIL:") and RULE_FREE_FORCED in rich.split("Divergences")[0]
    assert "free run vs forced decode (the candidate against itself)" in rich
    assert "free run and forced decode disagree beyond honest drift" in rich  # the verdict line
    junit = render(r, "junit")
    assert 'name="distribution"' in junit and "DISAGREE" in junit
    js = orjson.loads(render(r, "json"))
    ff = js["distribution"]["free_forced"]
    assert ff["disagree"] is True and ff["rule"] == RULE_FREE_FORCED and ff["positions"] > 0
    assert js["distribution"]["beyond"] is False and RULE_FREE_FORCED in js["reason"]
