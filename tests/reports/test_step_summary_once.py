"""The job summary gets the report once, whatever `--output` and `--format` say: a command
pointed at `$GITHUB_STEP_SUMMARY` appends its report there (as GitHub documents it, never
replacing what earlier steps wrote) and nothing is appended after it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers.gate_cli import invoke
from helpers.trace_builders import SEED_CANDIDATE, SEED_ORACLE

SEED = [str(SEED_ORACLE), str(SEED_CANDIDATE)]
HEADING = "## ☑️ gate: ratified pass"


@pytest.mark.parametrize("fmt", ["markdown", "json", "rich", "junit", "html"])
def test_output_to_the_step_summary_writes_the_report_once(tmp_path: Path, fmt: str) -> None:
    summary = tmp_path / "step-summary.md"
    summary.write_text("# earlier step\n")
    r = invoke(["compare", *SEED, "--format", fmt, "-o", str(summary)], env={"GITHUB_STEP_SUMMARY": str(summary)})
    assert r.exit_code == 0, r.output
    text = summary.read_text()
    assert text.startswith("# earlier step\n")  # appended, not replaced
    once = {"markdown": HEADING, "json": '"gate_report"', "rich": "verdict: ratified pass", "junit": "<testsuites"}
    marker = once.get(fmt, "<!doctype html>")
    assert text.count(marker) == 1, text
    if fmt != "markdown":
        assert HEADING not in text  # the asked format only, not the Markdown as well


def test_the_step_summary_through_a_symlink_is_the_same_file(tmp_path: Path) -> None:
    summary = tmp_path / "step-summary.md"
    summary.write_text("")
    link = tmp_path / "link.md"
    os.symlink(summary, link)
    r = invoke(["compare", *SEED, "--format", "markdown", "-o", str(link)], env={"GITHUB_STEP_SUMMARY": str(summary)})
    assert r.exit_code == 0, r.output
    assert summary.read_text().count(HEADING) == 1


def test_another_output_file_still_gets_the_summary_appended(tmp_path: Path) -> None:
    summary = tmp_path / "step-summary.md"
    out = tmp_path / "report.md"
    r = invoke(["compare", *SEED, "--format", "markdown", "-o", str(out)], env={"GITHUB_STEP_SUMMARY": str(summary)})
    assert r.exit_code == 0, r.output
    assert out.read_text().count(HEADING) == 1 and summary.read_text().count(HEADING) == 1


def test_only_the_report_is_appended_another_output_is_still_refused(tmp_path: Path) -> None:
    """`--save-trace $GITHUB_STEP_SUMMARY` is a trace over the job summary: refused as before."""
    from helpers.gate_cli import TOY_MODEL, record_toy_pin, register_fake

    with pytest.MonkeyPatch.context() as mp:
        register_fake(mp)
        pins = tmp_path / "pins"
        record_toy_pin(pins)
        summary = tmp_path / "step-summary.md"
        summary.write_text("# earlier step\n")
        argv = ["run", "--model", TOY_MODEL, "--pins-dir", str(pins), "--engine", "fake"]
        r = invoke([*argv, "--save-trace", str(summary)], env={"GITHUB_STEP_SUMMARY": str(summary)})
    assert r.exit_code == 2, r.output
    # Refused: a trace is never written over the job summary (a file of another kind).
    assert "--save-trace" in r.stderr and "another kind" in r.stderr
    assert summary.read_text() == "# earlier step\n"
