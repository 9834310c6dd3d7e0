"""The pure comparison of two reports (`gate.core.verdict.diff`): what counts as worse,
what refuses, and the oracle digest that tells one pin from another. Reports are real
`GateResult.to_dict()` output of the mixed traces (tests/helpers/trace_builders.py), edited
where a case needs a field no trace builder reaches (the distribution's floor)."""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from helpers.trace_builders import mixed_records, mixed_result, write_pair

from gate.core.traces.digest import trace_sha256
from gate.core.traces.reader import read_trace
from gate.core.verdict.diff import diff_reports, parse_report
from gate.errors import InputError


@pytest.fixture
def report(tmp_path: Path) -> dict[str, Any]:
    return mixed_result(tmp_path).to_dict()


def diff(base: dict[str, Any], new: dict[str, Any]) -> Any:
    return diff_reports(parse_report(base, "base.json"), parse_report(new, "new.json"))


def test_a_report_against_itself_is_not_worse(report: dict[str, Any]) -> None:
    d = diff(report, copy.deepcopy(report))
    assert d.exit_code == 0 and d.worse == ()
    assert (d.newly_diverging, d.fixed, d.class_changes, d.defects_added, d.defects_removed) == ((), (), (), (), ())


def test_the_digest_names_the_oracle_not_the_folder(tmp_path: Path) -> None:
    o1, _ = write_pair(tmp_path, *mixed_records(), name="one")
    o2, _ = write_pair(tmp_path, *mixed_records(), name="two")
    assert trace_sha256(read_trace(o1)) == trace_sha256(read_trace(o2))
    oracle = read_trace(o1)
    moved = replace(oracle, records=(replace(oracle.records[0], token_ids=(1, *oracle.records[0].token_ids[1:])),))
    assert trace_sha256(moved) != trace_sha256(oracle)
    re_recorded = replace(oracle, header=replace(oracle.header, extra={"created_at": "2026-01-01T00:00:00Z"}))
    assert trace_sha256(re_recorded) != trace_sha256(oracle)


def test_the_report_carries_the_digest(report: dict[str, Any], tmp_path: Path) -> None:
    o, _ = write_pair(tmp_path, *mixed_records(), name="again")
    assert report["oracle_sha256"] == trace_sha256(read_trace(o))


def test_a_defect_that_becomes_a_near_tie_is_not_worse_and_the_reverse_is(report: dict[str, Any]) -> None:
    worse = copy.deepcopy(report)
    near = next(d for d in worse["divergences"] if d["class"] == "near_tie")
    near["class"] = "defect"
    p = next(p for p in worse["prompts"] if p["id"] == near["prompt_id"])
    p["ratified"] = False
    d = diff(report, worse)
    assert d.exit_code == 1
    where = f"{near['prompt_id']!r} position {near['position']}"
    assert [c.line() for c in d.class_changes] == [f"{where}: near tie → defect"]
    assert [x.key for x in d.defects_added] == [(near["prompt_id"], near["position"])]
    assert d.no_longer_ratified == (near["prompt_id"],)
    back = diff(worse, report)
    assert back.exit_code == 0 and [x.key for x in back.defects_removed] == [(near["prompt_id"], near["position"])]


def with_distribution(report: dict[str, Any], *, beyond: bool, kl: float) -> dict[str, Any]:
    out = copy.deepcopy(report)
    out["distribution"] = {
        "positions": 64,
        "kl_mnats": {"mean": kl, "p99": 10 * kl},
        "same_top": {"rate": 0.99},
        "judged": True,
        "beyond": beyond,
        "beyond_figures": [f"mean KL {kl:.3f} mnats > 1.000"] if beyond else [],
        "limits": {"kl_mean_mnats": 1.0, "kl_p99_mnats": 20.0, "same_top_rate": 0.9},
    }
    return out


def test_the_distribution_crossing_its_floor_is_worse(report: dict[str, Any]) -> None:
    base = with_distribution(report, beyond=False, kl=0.5)
    d = diff(base, with_distribution(report, beyond=True, kl=1.5))
    assert d.exit_code == 1
    assert d.worse == ("the distribution crossed the pin's floor (mean KL 1.500 mnats > 1.000)",)
    # Beyond in both: NEW did not cross anything; and a KL that rose within the floor is not worse.
    both = diff(with_distribution(report, beyond=True, kl=2.0), with_distribution(report, beyond=True, kl=1.5))
    assert both.worse == ()
    assert diff(base, with_distribution(report, beyond=False, kl=0.9)).exit_code == 0


def test_a_verdict_that_fails_where_base_passed_is_worse(report: dict[str, Any]) -> None:
    # A consistent passing base: every divergence a tie and every prompt ratified (a pass over
    # a defect is a report that contradicts itself, which gate diff refuses).
    passing = copy.deepcopy(report)
    for d in passing["divergences"]:
        if d["class"] == "defect":
            d["class"] = "near_tie"
            d.pop("not_judged", None)
    for p in passing["prompts"]:
        p["ratified"] = True
    passing["exit_code"] = 0
    passing["verdict"] = "ratified_pass"
    d = diff(passing, report)
    assert "the verdict went from ratified pass to fail" in d.worse


def test_strict_differs_only_with_a_note(report: dict[str, Any]) -> None:
    strict = copy.deepcopy(report)
    strict["doctrine"]["strict"] = True
    d = diff(report, strict)
    assert d.exit_code == 0 and "doctrine.strict is False in BASE and True in NEW" in d.notes[0]


def drop_last_prompt(r: dict[str, Any]) -> None:
    """A report of one prompt fewer, its divergences gone with it (still a consistent report)."""
    gone = r["prompts"].pop()["id"]
    r["divergences"] = [d for d in r["divergences"] if d["prompt_id"] != gone]


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda r: r.update(model="x/y"), "'model'"),
        (lambda r: r.update(oracle_sha256="0" * 64), "'oracle_sha256'"),
        (lambda r: r["doctrine"].update(near_tie_mnats=1.0), "'doctrine.near_tie_mnats'"),
        (lambda r: drop_last_prompt(r), "'prompts'"),
    ],
)
def test_not_the_same_pin_refuses_naming_the_field(report: dict[str, Any], edit: Any, field: str) -> None:
    other = copy.deepcopy(report)
    edit(other)
    with pytest.raises(InputError, match=f"new.json: field {field}"):
        diff(report, other)


def test_a_report_without_a_digest_is_compared_with_a_note(report: dict[str, Any]) -> None:
    old = copy.deepcopy(report)
    del old["oracle_sha256"]
    d = diff(old, report)
    assert d.exit_code == 0 and "base.json: no oracle_sha256" in d.notes[0]


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (lambda r: r.update(gate_report=2), "field 'gate_report': expected 1"),
        (lambda r: r.pop("verdict"), "field 'verdict': expected a verdict, missing"),
        (lambda r: r["prompts"][1].update(ratified="yes"), "field 'prompts[1].ratified': expected true or false"),
        (lambda r: r["divergences"][0].update({"class": "tie"}), "field 'divergences[0].class': expected one of"),
        (lambda r: r["divergences"][0].update(position=True), "field 'divergences[0].position': expected an int"),
        (lambda r: r.update(distribution=[]), "field 'distribution': expected an object"),
    ],
)
def test_a_malformed_report_names_its_field(report: dict[str, Any], edit: Any, said: str) -> None:
    bad = copy.deepcopy(report)
    edit(bad)
    with pytest.raises(InputError, match="^bad.json: " + said.replace("[", r"\[").replace("]", r"\]")):
        parse_report(bad, "bad.json")
