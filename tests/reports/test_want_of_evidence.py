"""A flip the evidence rule could not weigh only because the candidate reported no list
there is worded and counted as not judged for want of evidence, not as a defect found in
the numbers, and the verdict stays a fail. A flip whose oracle gap is beyond the evidence
rule's limit is a defect found in the numbers, list or no list.

The candidates are the default pin's own trace with one flip planted and every list
removed (tests/helpers/pin_candidates.py)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from helpers.pin_candidates import default_pin_trace, planted_defect, planted_flip

import gate
from gate.core.traces.trace import Trace
from gate.core.verdict.result import DEFECT
from gate.core.verdict.rules import RULE_NO_LIST
from gate.reports import render
from gate.reports._common import why
from gate.reports.reason import reason


def without_lists(trace: Trace) -> Trace:
    records = tuple(replace(r, top_logprobs=None, forced_token_ids=None, extra={}) for r in trace.records)
    return replace(trace, header=replace(trace.header, top_k=0), records=records)


@pytest.fixture(scope="module")
def unweighed() -> gate.GateResult:
    pin = default_pin_trace()
    # An oracle gap above the 125-mnat threshold and within the evidence rule's 4 units.
    return gate.compare(pin, without_lists(planted_flip(pin, 0.2, 0.45)))


@pytest.fixture(scope="module")
def beyond() -> gate.GateResult:
    pin = default_pin_trace()
    return gate.compare(pin, planted_defect(pin)[0])  # a 5-nat gap, no lists


def test_a_flip_unweighed_for_want_of_lists_is_worded_and_counted_so(unweighed: gate.GateResult) -> None:
    (d,) = unweighed.divergences
    assert d.cls == DEFECT and d.rule == RULE_NO_LIST and d.want_of_evidence
    sentence = why(d, unweighed.doctrine)
    assert sentence.startswith("not judged for want of evidence:"), sentence
    assert "the candidate reports no usable list here" in sentence
    assert unweighed.counts["defects"] == 1  # the spec's class count keeps its meaning
    assert unweighed.counts["not_judged_for_want_of_evidence"] == 1
    assert unweighed.verdict == "fail" and unweighed.exit_code == 1
    said = reason(unweighed)
    assert said.startswith("FAIL: 1 divergence not judged for want of evidence"), said
    assert "1 defect" not in said, said
    report = json.loads(render(unweighed, "json"))
    assert report["counts"]["not_judged_for_want_of_evidence"] == 1
    assert report["divergences"][0]["not_judged"] == "want_of_evidence"
    for fmt in ("rich", "markdown", "html", "junit"):
        assert "not judged for want of evidence" in render(unweighed, fmt), fmt


def test_a_flip_beyond_the_evidence_rule_is_a_defect_in_the_numbers_list_or_none(beyond: gate.GateResult) -> None:
    (d,) = beyond.divergences
    assert d.cls == DEFECT and not d.want_of_evidence
    assert why(d, beyond.doctrine).startswith("defect:")
    assert beyond.counts["not_judged_for_want_of_evidence"] == 0
    assert reason(beyond).startswith("FAIL: 1 defect in 1 prompt"), reason(beyond)
    assert "not_judged" not in json.loads(render(beyond, "json"))["divergences"][0]
