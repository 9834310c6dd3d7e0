"""`gate compare` end to end: the seed case in every format, exit codes, --output, the CI
job summary, input errors, and that neither `gate --help` nor `gate compare` imports torch."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from helpers.gate_cli import invoke
from helpers.trace_builders import (
    SEED_CANDIDATE,
    SEED_ORACLE,
    candidate_record,
    filler,
    mixed_records,
    oracle_record,
    write_pair,
)

SEED = [str(SEED_ORACLE), str(SEED_CANDIDATE)]
SEED_SUMMARY = "6/7 prompts strict 16/16, 108/112 positions; 7/7 ratified (1 exact tie, 0 near ties, 0 defects)"
TIE_RULE = "torch.argmax and vLLM take the lowest id among equal maxima"


@pytest.fixture(scope="session", autouse=True)
def fixed_width() -> Iterator[None]:
    """Rich lays tables out to the terminal: pin the width so output does not depend on it."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COLUMNS", "120")
        mp.delenv("GITHUB_STEP_SUMMARY", raising=False)
        yield


def test_seed_rich_report() -> None:
    r = invoke(["compare", *SEED])
    assert r.exit_code == 0, r.output
    out = r.stdout
    lines = out.splitlines()
    assert SEED_SUMMARY in lines
    assert "verdict: ratified pass (exit 0)" in lines
    assert "EXACT TIE" in out and "p6 · position 7 · free run" in out
    assert "464" in out and "1445" in out and "-0.8293954133987427" in out
    assert "= bit for bit" in out and "rank 2 in the oracle's top-k" in out
    assert "higher_id" in out
    assert TIE_RULE in " ".join(x.strip(" │") for x in lines)  # the panel may wrap it
    assert '"import numpy as np"' in out
    assert "\x1b[" not in out  # not a terminal: no colour codes
    assert max(len(x) for x in lines) <= 120


def test_seed_strict_fails() -> None:
    r = invoke(["compare", *SEED, "--strict"])
    assert r.exit_code == 1, r.output
    assert "verdict: ratified pass (exit 1 under --strict)" in r.stdout


def test_seed_json_report() -> None:
    r = invoke(["compare", *SEED, "--format", "json"])
    assert r.exit_code == 0, r.output
    report = orjson.loads(r.stdout)
    assert r.stderr == ""  # nothing beside the JSON: `2>&1 | jq` must parse
    assert report["summary"] == SEED_SUMMARY
    assert report["gate_report"] == 1
    assert report["verdict"] == "ratified_pass" and report["exit_code"] == 0
    assert report["doctrine"] == {"near_tie_mnats": 125.0, "strict": False}
    assert report["counts"] == {
        "prompts": 7,
        "strict_pass": 6,
        "ratified_pass": 7,
        "positions": 112,
        "positions_matched": 108,
        "unadjudicated_positions": 8,
        "exact_ties": 1,
        "near_ties": 0,
        "defects": 0,
        "not_judged_for_want_of_evidence": 0,
    }
    assert [p["id"] for p in report["prompts"]] == [f"p{i}" for i in range(7)]
    for p in report["prompts"]:
        assert {"id", "strict", "ratified", "positions", "positions_matched", "first_divergence"} <= set(p)
    assert report["prompts"][6]["first_divergence"] == 7
    assert report["prompts"][0]["first_divergence"] is None
    (d,) = report["divergences"]
    assert {
        k: d[k]
        for k in (
            "prompt_id",
            "position",
            "source",
            "oracle_token",
            "candidate_token",
            "class",
            "top2_gap_mnats",
            "oracle_minus_candidate_mnats",
            "gap_lower_bound_mnats",
            "candidate_rank",
            "tie_break",
        )
    } == {
        "prompt_id": "p6",
        "position": 7,
        "source": "free_run",
        "oracle_token": 464,
        "candidate_token": 1445,
        "class": "exact_tie",
        "top2_gap_mnats": 0.0,
        "oracle_minus_candidate_mnats": 0.0,
        "gap_lower_bound_mnats": None,
        "candidate_rank": 2,
        "tie_break": "higher_id",
    }
    assert report["summary"] == SEED_SUMMARY
    strict = orjson.loads(invoke(["compare", *SEED, "--format", "json", "--strict"]).stdout)
    assert strict["exit_code"] == 1 and strict["doctrine"]["strict"] is True


def test_seed_markdown_junit_html() -> None:
    md = invoke(["compare", *SEED, "--format", "markdown"])
    assert md.exit_code == 0, md.output
    assert f"**{SEED_SUMMARY}**" in md.stdout
    assert "| p6 | 7 | free run | 🟦 exact tie | 464 | 1445 |" in md.stdout
    junit = invoke(["compare", *SEED, "--format", "junit"])
    assert junit.exit_code == 0, junit.output
    root = ET.fromstring(junit.stdout.encode())
    assert root.get("tests") == "7" and root.get("failures") == "0"
    html = invoke(["compare", *SEED, "--format", "html"])
    assert html.exit_code == 0, html.output
    assert html.stdout.startswith("<!doctype html>") and SEED_SUMMARY in html.stdout


def test_output_file_and_force(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    r = invoke(["compare", *SEED, "--format", "json", "--output", str(out)])
    assert r.exit_code == 0, r.output
    assert r.stdout == ""
    assert orjson.loads(out.read_bytes())["verdict"] == "ratified_pass"
    assert f"report written to {out}" in r.stderr
    again = invoke(["compare", *SEED, "--format", "json", "--output", str(out)])
    assert again.exit_code == 2, again.output
    assert "already exists" in again.stderr and "Traceback" not in again.stderr
    forced = invoke(["compare", *SEED, "--output", str(out), "--force"])
    assert forced.exit_code == 0, forced.output
    text = out.read_text()
    assert SEED_SUMMARY in text.splitlines() and "\x1b[" not in text  # rich as plain text


def test_bad_format_is_a_usage_error() -> None:
    r = invoke(["compare", *SEED, "--format", "yaml"])
    assert r.exit_code == 2, r.output
    assert "'--format'" in r.stderr and "'yaml' is not one of 'rich', 'json'" in r.stderr
    assert "Traceback" not in r.stderr


def test_near_tie_threshold_option(tmp_path: Path) -> None:
    o, c = write_pair(tmp_path, *mixed_records())
    wide = orjson.loads(invoke(["compare", str(o), str(c), "--format", "json"]).stdout)
    narrow = orjson.loads(invoke(["compare", str(o), str(c), "--format", "json", "--near-tie-mnats", "100"]).stdout)
    assert wide["counts"]["near_ties"] == 2 and narrow["counts"]["near_ties"] == 1  # 125.0 > 100; 62.5 <= 100
    assert narrow["doctrine"]["near_tie_mnats"] == 100.0
    bad = invoke(["compare", str(o), str(c), "--near-tie-mnats", "-1"])
    assert bad.exit_code == 2 and "--near-tie-mnats" in bad.stderr


@pytest.mark.parametrize("fmt", ["json", "rich", "junit"])
def test_step_summary_is_appended_for_any_format(tmp_path: Path, fmt: str) -> None:
    summary = tmp_path / "step-summary.md"
    summary.write_text("# earlier step\n")
    r = invoke(["compare", *SEED, "--format", fmt], env={"GITHUB_STEP_SUMMARY": str(summary)})
    assert r.exit_code == 0, r.output
    text = summary.read_text()
    assert text.startswith("# earlier step\n")  # appended, not replaced
    assert f"**{SEED_SUMMARY}**" in text and "## ☑️ gate: ratified pass" in text


def test_unwritable_step_summary_warns_and_keeps_the_verdict(tmp_path: Path) -> None:
    r = invoke(["compare", *SEED, "--format", "json", "--strict"], env={"GITHUB_STEP_SUMMARY": str(tmp_path)})
    assert r.exit_code == 1, r.output  # the gate's own exit code, not 2 or 3
    assert "warning: cannot append to GITHUB_STEP_SUMMARY" in r.stderr
    assert orjson.loads(r.stdout)["exit_code"] == 1


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("missing", "missing prompt(s) 'b'"),
        ("extra", "prompt(s) 'x' are not in the oracle"),
        ("prompt drift", "prompt 'b': prompt_token_ids differ at index 0"),
    ],
)
def test_prompt_matching_errors_exit_2(tmp_path: Path, case: str, expected: str) -> None:
    oracle = [oracle_record("a", [filler(1)]), oracle_record("b", [filler(2)])]
    cand = [candidate_record("a", [1]), candidate_record("b", [2])]
    if case == "missing":
        cand = cand[:1]
    elif case == "extra":
        cand.append(candidate_record("x", [3]))
    else:
        cand[1]["prompt_token_ids"] = [99, 12, 13]
    o, c = write_pair(tmp_path, oracle, cand)
    r = invoke(["compare", str(o), str(c)])
    assert r.exit_code == 2, r.output
    assert expected in r.stderr
    assert r.stderr.startswith("gate: error: ") and r.stderr.count("\n") == 1
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_missing_file_and_swapped_roles_exit_2(tmp_path: Path) -> None:
    r = invoke(["compare", str(tmp_path / "nope.jsonl"), str(SEED_CANDIDATE)])
    assert r.exit_code == 2 and "no such file" in r.stderr and "Traceback" not in r.stderr
    swapped = invoke(["compare", str(SEED_CANDIDATE), str(SEED_ORACLE)])
    assert swapped.exit_code == 2 and "expected an oracle trace" in swapped.stderr


def test_a_defect_exits_1(tmp_path: Path) -> None:
    o, c = write_pair(tmp_path, *mixed_records())
    r = invoke(["compare", str(o), str(c), "--format", "json"])
    assert r.exit_code == 1, r.output
    assert orjson.loads(r.stdout)["verdict"] == "fail"


HEAVY = ("torch", "vllm", "transformers")


def _imported(args: list[str]) -> set[str]:
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "gate", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "120"},
        check=False,
    )
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    names = set()
    for line in proc.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    assert "gate" in names  # the probe works: it sees gate's own imports
    return names


@pytest.mark.parametrize(
    "args",
    [["--help"], ["compare", *SEED, "--format", "json"], ["compare", *SEED]],
    ids=["help", "compare-json", "compare-rich"],
)
def test_no_torch_imported(args: list[str]) -> None:
    names = _imported(args)
    assert not names & set(HEAVY), sorted(names & set(HEAVY))
