"""Every format leads with the verdict and its reason in one sentence: which rule or which
floor, by how much, where. The failing run is built like the llama.cpp Q4_1 build (defects,
and a distribution beyond the pin's honest floor) from the default pin's own trace."""

from __future__ import annotations

import html
import re
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

import orjson
import pytest
from helpers.failing_run import failing_result
from helpers.trace_builders import SEED_CANDIDATE, SEED_ORACLE

from gate.core.traces.reader import read_trace
from gate.core.verdict.adjudicate import compare
from gate.core.verdict.result import DEFECT, GateResult
from gate.core.verdict.run_record import RunRecord
from gate.reports import render
from gate.reports.reason import reason

FIRST_LINES = 6


@pytest.fixture(scope="module")
def failing(tmp_path_factory: pytest.TempPathFactory) -> GateResult:
    return failing_result(tmp_path_factory.mktemp("failing"))


def test_the_failing_run_is_the_q4_1_kind(failing: GateResult) -> None:
    """The builder's run fails both ways, as the Q4_1 build does."""
    d = failing.distribution
    assert failing.verdict == "fail" and failing.counts["defects"] == 4
    assert d is not None and d.beyond and failing.counts["near_ties"] >= 1


def test_the_reason_names_the_rule_the_gap_the_place_and_the_floor(failing: GateResult) -> None:
    said = reason(failing)
    worst = max(
        (d for d in failing.divergences if d.cls == DEFECT),
        key=lambda d: d.oracle_minus_candidate_mnats or 0.0,
    )
    assert said.startswith("FAIL: 4 defects in 4 prompts of 41 (rule ")
    assert worst.rule in said and f"at prompt '{worst.prompt_id}' position {worst.position}" in said
    assert f"{worst.oracle_minus_candidate_mnats:,.1f} mnats" in said
    d = failing.distribution
    assert d is not None and d.deciding_floor is not None
    assert "the distribution is beyond the honest floor (mean KL " in said
    assert f"> {d.deciding_floor.kl_mean_limit:.3f}" in said
    assert "\n" not in said


def flat(text: str) -> str:
    return " ".join(html.unescape(text).split())


@pytest.mark.parametrize("fmt", ["rich", "markdown", "junit", "json"])
def test_every_format_says_why_it_failed_in_its_first_lines(failing: GateResult, fmt: str) -> None:
    text = render(failing, fmt)
    head = flat("\n".join(text.splitlines()[:FIRST_LINES]))
    if fmt == "markdown":
        head = head.replace("\\", "")
    assert flat(reason(failing)) in head, head
    # and nothing else comes first: the figures and the provenance come after it
    assert "Mean    KLD" not in head and "doctrine:" not in head


def test_the_html_card_holds_the_verdict_the_reason_and_the_counts(failing: GateResult) -> None:
    page = render(failing, "html")
    card = re.search(r'<header class="verdict[^"]*" id="verdict">(.*?)</header>', page, re.S)
    assert card is not None
    text = flat(re.sub(r"<[^>]+>", " ", card.group(1)))
    assert text.startswith("FAIL ")
    assert flat(reason(failing)).removeprefix("FAIL: ") in text
    assert "4 defects" in text and "35/41 prompts strict" in text
    # the distribution block and the provenance are not in the card
    assert "Mean KLD" not in text and "honest floor ×" not in text and "doctrine" not in text
    assert '<section id="distribution">' in page and "<details" in page


def test_json_carries_the_reason_right_after_the_exit_code(failing: GateResult) -> None:
    data = orjson.loads(render(failing, "json"))
    assert list(data)[:4] == ["gate_report", "verdict", "exit_code", "reason"]
    assert data["reason"] == reason(failing)


def test_junit_opens_with_the_reason(failing: GateResult) -> None:
    root = ET.fromstring(render(failing, "junit").encode())
    props = root.find("testsuite/properties")
    assert props is not None
    first = props.find("property")
    assert first is not None and first.get("name") == "reason" and first.get("value") == reason(failing)


def test_a_pass_says_why_it_passed() -> None:
    seed = compare(read_trace(SEED_ORACLE), read_trace(SEED_CANDIDATE))
    said = reason(seed)
    assert said.startswith("RATIFIED PASS: 1 of 7 prompts diverge only at ties (1 exact tie; ")
    assert "position 7" in said
    assert said.endswith("no honest floor was given (the oracle trace's header carries none)")


def test_a_floor_missing_from_a_pin_is_said_to_be_the_pins() -> None:
    seed = compare(read_trace(SEED_ORACLE), read_trace(SEED_CANDIDATE))
    ran = replace(seed, run=RunRecord(command="gate run", pin="oracle_pins/x/pin.jsonl"))
    for fmt in ("rich", "markdown", "html", "junit"):
        text = flat(render(ran, fmt)).replace("\\", "")
        assert "the pin carries no honest floor" in text, fmt
        assert "oracle trace" not in text, fmt


def test_strict_mode_says_the_exit_code(tmp_path: Path) -> None:
    from gate.core.verdict.doctrine import Doctrine

    seed = compare(read_trace(SEED_ORACLE), read_trace(SEED_CANDIDATE), Doctrine(strict=True))
    said = reason(seed)
    assert said.startswith("RATIFIED PASS (exit 1 under --strict): ")
    assert "--strict asks for every prompt strict" in said
