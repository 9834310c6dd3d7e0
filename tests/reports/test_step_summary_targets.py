"""`$GITHUB_STEP_SUMMARY` is appended to, so it is held to the rule of every output: never
one of the command's inputs (by identity), never a gate data file (a pin, golden, trace,
progress file, prompt list, oracle.json), and never waited on (an append to a FIFO with no
reader blocked forever). It used to be appended to whatever it named: a careless
`GITHUB_STEP_SUMMARY=pin.jsonl` put a Markdown report inside the pin. An input or a data
file is exit 2 before any work, naming the variable; a summary that cannot be appended to
is a warning; the runner's own summary file is appended to as before."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.gate_cli import invoke
from helpers.trace_builders import SEED_CANDIDATE, SEED_ORACLE

HEADING = "## ☑️ gate: ratified pass"


def _copies(tmp_path: Path) -> tuple[Path, Path]:
    oracle, cand = tmp_path / "o.jsonl", tmp_path / "c.jsonl"
    shutil.copy(SEED_ORACLE, oracle)
    shutil.copy(SEED_CANDIDATE, cand)
    return oracle, cand


@pytest.mark.parametrize("which", ["oracle", "candidate", "symlink to the oracle"])
def test_the_summary_is_never_an_input(tmp_path: Path, which: str) -> None:
    oracle, cand = _copies(tmp_path)
    target = {"oracle": oracle, "candidate": cand}.get(which)
    if target is None:
        target = tmp_path / "link.md"
        os.symlink(oracle, target)
    before = oracle.read_bytes(), cand.read_bytes()
    r = invoke(["compare", str(oracle), str(cand)], env={"GITHUB_STEP_SUMMARY": str(target)})
    assert r.exit_code == 2, r.output
    assert "GITHUB_STEP_SUMMARY" in r.stderr and "input" in r.stderr
    assert (oracle.read_bytes(), cand.read_bytes()) == before


@pytest.mark.parametrize("as_output", [False, True], ids=["summary", "--output the summary"])
def test_the_summary_is_never_a_gate_data_file(tmp_path: Path, as_output: bool) -> None:
    oracle, cand = _copies(tmp_path)
    other_pin = tmp_path / "other-pin.jsonl"
    shutil.copy(SEED_ORACLE, other_pin)
    before = other_pin.read_bytes()
    extra = ["-o", str(other_pin)] if as_output else []
    r = invoke(["compare", str(oracle), str(cand), *extra], env={"GITHUB_STEP_SUMMARY": str(other_pin)})
    assert r.exit_code == 2, r.output
    assert "GITHUB_STEP_SUMMARY" in r.stderr and "pin (oracle trace)" in r.stderr
    assert other_pin.read_bytes() == before


def test_a_fifo_as_the_summary_is_not_waited_on(tmp_path: Path) -> None:
    """A summary that cannot be appended to is a warning, and the verdict stands (as for a
    directory); an append to a FIFO with no reader used to wait forever."""
    oracle, cand = _copies(tmp_path)
    fifo = tmp_path / "summary.fifo"
    os.mkfifo(fifo)
    env = {**os.environ, "GITHUB_STEP_SUMMARY": str(fifo), "PYTHONPATH": os.pathsep.join(sys.path)}
    p = subprocess.run(
        [sys.executable, "-m", "gate", "compare", str(oracle), str(cand)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr  # the seed candidate's ratified pass
    assert "warning: cannot append to GITHUB_STEP_SUMMARY" in p.stderr and "regular file" in p.stderr


def test_the_runners_summary_file_is_appended_to_as_before(tmp_path: Path) -> None:
    oracle, cand = _copies(tmp_path)
    summary = tmp_path / "step_summary_abc.md"
    summary.write_text("# earlier step\n")
    r = invoke(["compare", str(oracle), str(cand)], env={"GITHUB_STEP_SUMMARY": str(summary)})
    assert r.exit_code == 0, r.output
    text = summary.read_text()
    assert text.startswith("# earlier step\n") and text.count(HEADING) == 1
