"""Every divergence says which rule decided it, in every report, and the
HTML histogram is coloured by the verdict's class against the doctrine's own threshold."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from helpers.gate_cli import invoke
from helpers.pin_attacks import PIN, candidate, flipped, gap, oracle_dicts, own_step, raise_runner_up, unit, write

from gate.core.verdict.rules import RULES


def _honest_flips() -> Any:
    """Forced flips at gaps of 1-2 grid steps, the candidate's own margin half a unit:
    near ties by the evidence rule (and some by the fixed mnats)."""
    picks: dict[tuple[int, int], int] = {}
    for p, rec in enumerate(oracle_dicts()):
        for i in range(len(rec["token_ids"])):
            if 0.0 < gap(rec, i) <= 2 * own_step(rec, i) and len(picks) < 12:
                picks[(p, i)] = int(rec["top_logprobs"][i][1][0])

    def own(p: int, rec: dict[str, Any], i: int, top: list[list[Any]]) -> list[list[Any]]:
        if (p, i) not in picks:
            return [list(x) for x in top]
        g = gap(rec, i) / unit(rec, i)
        return raise_runner_up(g + 0.5)(p, rec, i, top)

    return candidate(own, only_forced_flips=True)


def test_every_divergence_names_its_rule_in_the_json_report(tmp_path: Path) -> None:
    for name, built in (("honest", _honest_flips()), ("clear", flipped(empty=False)), ("empty", flipped(True))):
        path = write(tmp_path / f"{name}.jsonl", *built)
        r = invoke(["compare", str(PIN), str(path), "--format", "json"])
        report = json.loads(r.stdout)
        assert report["divergences"], name
        for d in report["divergences"]:
            assert d["rule"] in RULES, d
            if d["rule"] in ("near_tie_evidence", "oracle_gap_beyond", "own_margin_beyond"):
                # Units named for what they count: the evidence unit beside the logit's own grid.
                assert d["gap_units"] * d["unit_mnats"] == pytest_approx(d["oracle_minus_candidate_mnats"])
                assert d["gap_ulps"] * d["ulp_mnats"] == pytest_approx(d["oracle_minus_candidate_mnats"])
                assert d["candidate_margin_units"] == d["candidate_margin_ulps"]


def pytest_approx(x: float) -> Any:
    import pytest

    return pytest.approx(x, rel=1e-9, abs=1e-9)


def test_a_near_tie_the_evidence_rule_ratified_never_says_the_mnat_threshold_did(tmp_path: Path) -> None:
    path = write(tmp_path / "c.jsonl", *_honest_flips())
    report = json.loads(invoke(["compare", str(PIN), str(path), "--format", "json"]).stdout)
    rules = {d["rule"] for d in report["divergences"]}
    assert "near_tie_evidence" in rules, rules
    for fmt in ("rich", "html"):  # junit details only the prompts that fail
        text = " ".join(invoke(["compare", str(PIN), str(path), "--format", fmt]).stdout.split())
        assert "near tie by the evidence rule" in text, fmt
        for sentence in re.findall(r"near tie by the evidence rule[^—]*", text):
            assert "within the 125" not in sentence
    md = invoke(["compare", str(PIN), str(path), "--format", "markdown"]).stdout
    assert "near\\_tie\\_evidence" in md  # the markdown table's "decided by" column


def test_defects_name_the_limit_they_failed_in_every_report(tmp_path: Path) -> None:
    path = write(tmp_path / "c.jsonl", *flipped(empty=False))
    # Read through the panels' borders: a sentence wraps where the width (COLUMNS) says.
    text = " ".join(invoke(["compare", str(PIN), str(path)]).stdout.replace("│", " ").split())
    assert "beyond the evidence rule's 2: a clear choice" in text
    path = write(tmp_path / "e.jsonl", *flipped(empty=True))
    for fmt in ("rich", "junit", "html"):
        text = " ".join(invoke(["compare", str(PIN), str(path), "--format", fmt]).stdout.split())
        assert "less evidence never ratifies more" in text, fmt


def test_the_html_histogram_is_coloured_by_class_against_the_doctrine_s_threshold(tmp_path: Path) -> None:
    """Ten defects at gaps inside the evidence rule's oracle limit (their own lists were
    missing): red bars left of the threshold line, never amber ones."""
    path = write(tmp_path / "c.jsonl", *flipped(empty=True))
    html = invoke(["compare", str(PIN), str(path), "--format", "html"]).stdout
    hist = html[html.index('<svg class="hist"') :]
    hist = hist[: hist.index("</svg>")]
    bars = re.findall(r'<rect [^>]*class="([^"]+)"><title>([^<]*)</title>', hist)
    counts: dict[str, int] = {}
    for css, title in bars:
        counts[css] = counts.get(css, 0) + int(title.rsplit(": ", 1)[1])
    assert counts.get("o-defect") == 10 and "o-near" not in counts, bars
    assert "evidence: oracle gap ≤ 4" in hist and "evidence units" in hist
