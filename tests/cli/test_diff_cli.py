"""`gate diff BASE NEW` on real reports: `gate compare --format json` over trace files built
with tests/helpers/trace_builders.py. A run against itself is exit 0; a worse run is exit 1
and the report names what changed; reports of different pins or doctrines are exit 2 with
one line naming the file and the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers.gate_cli import invoke
from helpers.trace_builders import candidate_record, filler, header, mixed_records, oracle_record, position, write_jsonl


def report(folder: Path, name: str, oracle: list[dict[str, Any]], cand: list[dict[str, Any]], *flags: str) -> Path:
    o = write_jsonl(folder / f"{name}-oracle.jsonl", header("oracle"), oracle)
    c = write_jsonl(folder / f"{name}-candidate.jsonl", header("candidate"), cand)
    out = folder / f"{name}.json"
    r = invoke(["compare", str(o), str(c), "--format", "json", "-o", str(out), *flags])
    assert r.exit_code in (0, 1), r.output
    return out


def worse_candidate(cand: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The mixed candidate with the near tie fixed ('near' strict again) and a new defect
    in the prompt that was strict ('strict' takes token 1 at position 2, far from a tie)."""
    oracle, _ = mixed_records()
    by_id = {o["id"]: o for o in oracle}
    out = []
    for rec in cand:
        if rec["id"] == "near":
            rec = candidate_record("near", by_id["near"]["token_ids"])
        elif rec["id"] == "strict":
            ids = list(by_id["strict"]["token_ids"])
            ids[2] = 1
            rec = candidate_record("strict", ids)
        out.append(rec)
    return out


@pytest.fixture
def runs(tmp_path: Path) -> dict[str, Path]:
    oracle, cand = mixed_records()
    return {
        "base": report(tmp_path, "base", oracle, cand),
        "worse": report(tmp_path, "worse", oracle, worse_candidate(cand)),
    }


def test_a_run_against_itself_is_exit_0(runs: dict[str, Path]) -> None:
    r = invoke(["diff", str(runs["base"]), str(runs["base"])])
    assert r.exit_code == 0, r.output
    assert "not worse: 0 prompts newly diverging, 0 fixed, 0 defects added, 0 removed, 0 class changes" in r.stdout


def test_a_worse_run_is_exit_1_naming_what_changed(runs: dict[str, Path]) -> None:
    r = invoke(["diff", str(runs["base"]), str(runs["worse"])])
    assert r.exit_code == 1, r.output
    out = r.stdout
    assert "worse: 1 prompt newly diverging, 1 fixed, 1 defect added, 0 removed" in out
    assert "1 new defect: 'strict' position 2" in out
    assert "1 prompt no longer ratified: 'strict'" in out
    assert "Fixed (strict again) (1)" in out and "'near'" in out
    # And the other way round the same change is an improvement: exit 0.
    back = invoke(["diff", str(runs["worse"]), str(runs["base"])])
    assert back.exit_code == 0, back.output
    assert "1 fixed, 0 defects added, 1 removed" in back.stdout


def test_a_class_change_is_listed(tmp_path: Path) -> None:
    # The near tie at 'near' position 5 becomes a defect when its oracle gap widens; the
    # pin is then another pin, so the class change is shown under a wider threshold instead.
    base = list(filler(100 + i) for i in range(8))
    base[5] = position(50, (51, -0.625), (52, -2.0), (53, -3.0))  # 125.0 mnats
    oracle = [oracle_record("p", base)]
    near = [candidate_record("p", [t[0][0] for t in base[:5]] + [51, 700, 701])]
    tie = [candidate_record("p", [t[0][0] for t in base[:5]] + [52, 700, 701])]  # 1500 mnats below: defect
    a = report(tmp_path, "a", oracle, near)
    b = report(tmp_path, "b", oracle, tie)
    r = invoke(["diff", str(a), str(b), "--format", "json"])
    assert r.exit_code == 1, r.output
    out = json.loads(r.stdout)
    assert out["class_changes"] == [{"prompt_id": "p", "position": 5, "before": "near_tie", "after": "defect"}]
    assert [d["position"] for d in out["defects_added"]] == [5]
    assert out["no_longer_ratified"] == ["p"]


def test_reports_of_different_pins_are_exit_2_naming_the_field(tmp_path: Path, runs: dict[str, Path]) -> None:
    oracle, cand = mixed_records()
    oracle[0] = {**oracle[0], "prompt_token_ids": [11, 12, 14]}
    cand[0] = {**cand[0], "prompt_token_ids": [11, 12, 14]}
    other = report(tmp_path, "other", oracle, cand)
    r = invoke(["diff", str(runs["base"]), str(other)])
    assert r.exit_code == 2, r.output
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert f"gate: error: {other}: field 'oracle_sha256' is " in r.stderr
    assert "not runs against the same pin" in r.stderr


def test_another_doctrine_is_exit_2_naming_the_doctrine_field(tmp_path: Path, runs: dict[str, Path]) -> None:
    oracle, cand = mixed_records()
    wider = report(tmp_path, "wider", oracle, cand, "--near-tie-mnats", "300")
    r = invoke(["diff", str(runs["base"]), str(wider)])
    assert r.exit_code == 2, r.output
    assert "field 'doctrine.near_tie_mnats' is 300.0" in r.stderr


def test_another_model_is_exit_2(tmp_path: Path, runs: dict[str, Path]) -> None:
    data = json.loads(runs["base"].read_text())
    data["model"] = "other/model"
    other = tmp_path / "other-model.json"
    other.write_text(json.dumps(data))
    r = invoke(["diff", str(runs["base"]), str(other)])
    assert r.exit_code == 2, r.output
    assert "field 'model' is 'other/model'" in r.stderr


@pytest.mark.parametrize(
    ("content", "said"),
    [
        ("{not json", "not JSON"),
        ('{"gate_report": 2}', "field 'gate_report': expected 1"),
        ('{"gate_report": 1, "model": "m", "doctrine": {}, "verdict": "fail", "exit_code": 1}', "field 'prompts'"),
    ],
)
def test_an_unreadable_report_is_one_line_naming_file_and_field(
    tmp_path: Path, runs: dict[str, Path], content: str, said: str
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    r = invoke(["diff", str(runs["base"]), str(bad)])
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith(f"gate: error: {bad}: ") and said in r.stderr
    assert r.stderr.count("\n") == 1


def test_a_missing_report_is_exit_2(tmp_path: Path, runs: dict[str, Path]) -> None:
    r = invoke(["diff", str(tmp_path / "nope.json"), str(runs["base"])])
    assert r.exit_code == 2, r.output
    assert "nope.json: cannot read the gate JSON report" in r.stderr


def test_markdown_is_a_short_pull_request_comment(runs: dict[str, Path]) -> None:
    r = invoke(["diff", str(runs["base"]), str(runs["worse"]), "--format", "markdown"])
    assert r.exit_code == 1, r.output
    md = r.stdout
    assert md.startswith("## ❌ gate diff: worse than the base")
    assert "- **1 new defect: 'strict' position 2**" in md
    assert len(md.splitlines()) < 50


def test_the_output_is_never_an_input(runs: dict[str, Path]) -> None:
    before = runs["base"].read_bytes()
    r = invoke(["diff", str(runs["base"]), str(runs["worse"]), "-o", str(runs["base"]), "--force"])
    assert r.exit_code == 2, r.output
    assert runs["base"].read_bytes() == before


def test_the_job_summary_gets_the_diff_once(runs: dict[str, Path], tmp_path: Path) -> None:
    summary = tmp_path / "summary.md"
    r = invoke(
        ["diff", str(runs["base"]), str(runs["worse"]), "--format", "json"], env={"GITHUB_STEP_SUMMARY": str(summary)}
    )
    assert r.exit_code == 1, r.output
    assert summary.read_text().count("gate diff: worse than the base") == 1
