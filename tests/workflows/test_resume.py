"""Resumable runs: the progress file, `gate run --resume`, Ctrl-C's partial report (exit 130).

The fake engine raises KeyboardInterrupt (a Ctrl-C) or RuntimeError (a crash) before its
N-th prompt when GATE_FAKE_INTERRUPT_AFTER / GATE_FAKE_CRASH_AFTER say so: environment,
not engine options, so the resumed run has the very options of the interrupted one. A
child `gate run` killed with SIGKILL mid-run is the out-of-memory kill.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from helpers.gate_cli import TOY_MODEL, register_fake, run_fake

from gate.core.traces.reader import read_trace
from gate.workflows.common.progress import default_progress_path

# A mutation with exact ties everywhere a quarter of positions tie: the report has
# free-run and forced divergences, so "equal reports" compares something.
MUTATION = ("--engine-opt", "tie_break=highest")


@pytest.fixture(autouse=True)
def _fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    register_fake(monkeypatch)
    monkeypatch.setenv("GATE_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.delenv("GATE_FAKE_INTERRUPT_AFTER", raising=False)
    monkeypatch.delenv("GATE_FAKE_CRASH_AFTER", raising=False)
    monkeypatch.delenv("GATE_FAKE_INTERRUPT_FORCE", raising=False)


run = run_fake


def stable(report: dict[str, Any]) -> dict[str, Any]:
    """The report without what differs run to run (timings, when)."""
    return {k: v for k, v in report.items() if k != "meta"}


def generated(history: list[tuple[str, Any]]) -> list[str]:
    return [pid for call, ids in history if call == "generate" for pid in ids]


def test_ctrl_c_prints_the_partial_report_and_resume_equals_an_uninterrupted_run(
    pins: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from helpers.fake_engine import FakeEngine

    whole = run(pins, *MUTATION)
    assert whole.exit_code == 0, whole.output
    expected = json.loads(whole.stdout)
    assert expected["divergences"]  # the comparison below has substance

    progress = tmp_path / "progress.jsonl"
    monkeypatch.setenv("GATE_FAKE_INTERRUPT_AFTER", "2")
    r = run(pins, *MUTATION, "--progress-file", str(progress))
    assert r.exit_code == 130, r.output
    partial = json.loads(r.stdout)
    assert partial["counts"]["prompts"] == 2 and [p["id"] for p in partial["prompts"]] == ["p00", "p01"]
    assert "interrupted after 2 of 6 prompts" in r.stderr and "--resume" in r.stderr
    kept = read_trace(progress, role="candidate")
    assert [rec.id for rec in kept.records] == ["p00", "p01"]
    assert kept.header.extra["engine_options"] == {"tie_break": "highest"}

    monkeypatch.delenv("GATE_FAKE_INTERRUPT_AFTER")
    FakeEngine.history.clear()
    resumed = run(pins, *MUTATION, "--progress-file", str(progress), "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert generated(FakeEngine.history) == ["p02", "p03", "p04", "p05"]  # only what was left
    assert stable(json.loads(resumed.stdout)) == stable(expected)
    assert "resuming" in resumed.stderr and "2 of 6 prompts already done" in resumed.stderr
    assert not progress.exists()  # a finished run removes its progress file


def test_ctrl_c_while_forcing_keeps_the_whole_free_run(
    pins: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from helpers.fake_engine import FakeEngine

    expected = json.loads(run(pins, *MUTATION).stdout)
    progress = tmp_path / "progress.jsonl"
    monkeypatch.setenv("GATE_FAKE_INTERRUPT_FORCE", "1")
    r = run(pins, *MUTATION, "--progress-file", str(progress))
    assert r.exit_code == 130, r.output
    partial = json.loads(r.stdout)
    assert partial["counts"]["prompts"] == 6
    assert partial["counts"]["unadjudicated_positions"] > 0  # nothing was forced
    assert len(read_trace(progress).records) == 6

    monkeypatch.delenv("GATE_FAKE_INTERRUPT_FORCE")
    FakeEngine.history.clear()
    resumed = run(pins, *MUTATION, "--progress-file", str(progress), "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert generated(FakeEngine.history) == []
    assert [c for c, _ in FakeEngine.history if c == "force"]
    assert stable(json.loads(resumed.stdout)) == stable(expected)


def test_a_torn_last_line_is_dropped_and_that_prompt_rerun(
    pins: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from helpers.fake_engine import FakeEngine

    expected = json.loads(run(pins, *MUTATION).stdout)
    progress = tmp_path / "progress.jsonl"
    monkeypatch.setenv("GATE_FAKE_INTERRUPT_AFTER", "3")
    assert run(pins, *MUTATION, "--progress-file", str(progress)).exit_code == 130
    lines = progress.read_bytes().splitlines(keepends=True)
    assert len(lines) == 4  # header + 3 prompts
    # A SIGKILL in the middle of writing the third record.
    progress.write_bytes(b"".join(lines[:3]) + lines[3][: len(lines[3]) // 2])

    monkeypatch.delenv("GATE_FAKE_INTERRUPT_AFTER")
    FakeEngine.history.clear()
    resumed = run(pins, *MUTATION, "--progress-file", str(progress), "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert generated(FakeEngine.history) == ["p02", "p03", "p04", "p05"]
    assert stable(json.loads(resumed.stdout)) == stable(expected)


def test_resume_after_an_engine_crash_uses_the_default_progress_file(
    pins: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from helpers.fake_engine import FakeEngine

    expected = json.loads(run(pins).stdout)
    monkeypatch.setenv("GATE_FAKE_CRASH_AFTER", "4")
    r = run(pins)
    assert r.exit_code == 3, r.output
    assert "crashed after 4 prompts" in r.stderr
    progress = default_progress_path(TOY_MODEL, "fake")
    assert progress.is_relative_to(tmp_path / "runs")
    assert len(read_trace(progress).records) == 4

    monkeypatch.delenv("GATE_FAKE_CRASH_AFTER")
    FakeEngine.history.clear()
    resumed = run(pins, "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert generated(FakeEngine.history) == ["p04", "p05"]
    assert stable(json.loads(resumed.stdout)) == stable(expected)


def test_resume_refuses_a_progress_file_of_another_run(
    pins: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    progress = tmp_path / "progress.jsonl"
    monkeypatch.setenv("GATE_FAKE_INTERRUPT_AFTER", "2")
    assert run(pins, *MUTATION, "--progress-file", str(progress)).exit_code == 130
    monkeypatch.delenv("GATE_FAKE_INTERRUPT_AFTER")
    r = run(pins, "--progress-file", str(progress), "--resume")  # without the mutation's option
    assert r.exit_code == 2, r.output
    assert "is from another run" in r.stderr and "'engine_options'" in r.stderr
    r = run(pins, *MUTATION, "--engine-opt", "weights_sha256=toy-weights-0", "--progress-file", str(progress))
    assert r.exit_code == 0, r.output  # without --resume: a fresh run replaces it
    assert "replacing the progress file" in r.stderr


def test_resume_without_a_progress_file_is_exit_2(pins: Path, tmp_path: Path) -> None:
    r = run(pins, "--resume", "--progress-file", str(tmp_path / "none.jsonl"))
    assert r.exit_code == 2, r.output
    assert "nothing to resume" in r.stderr


def test_save_trace_keeps_its_progress_beside_it(pins: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "cand.jsonl"
    monkeypatch.setenv("GATE_FAKE_INTERRUPT_AFTER", "1")
    assert run(pins, "--save-trace", str(out)).exit_code == 130
    assert not out.exists()
    assert len(read_trace(tmp_path / "cand.jsonl.partial.jsonl").records) == 1
    monkeypatch.delenv("GATE_FAKE_INTERRUPT_AFTER")
    r = run(pins, "--save-trace", str(out), "--resume")
    assert r.exit_code == 0, r.output
    assert [rec.id for rec in read_trace(out).records] == [f"p{i:02d}" for i in range(6)]
    assert not (tmp_path / "cand.jsonl.partial.jsonl").exists()


def test_a_sigkilled_run_resumes_to_the_uninterrupted_report(pins: Path, tmp_path: Path) -> None:
    """A child `gate run` killed with SIGKILL (as the OOM killer does) mid-run."""
    expected = json.loads(run(pins, *MUTATION).stdout)
    progress = tmp_path / "progress.jsonl"
    tests = Path(__file__).parents[1]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tests), os.environ.get("PYTHONPATH", "")]),
        "GATE_FAKE_SLEEP": "0.2",
    }
    cmd = [sys.executable, "-m", "gate", "run", "--model", TOY_MODEL, "--pins-dir", str(pins)]
    cmd += ["--engine", "helpers.fake_engine:FakeEngine", *MUTATION, "--progress-file", str(progress)]
    child = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if progress.exists() and progress.read_bytes().count(b"\n") >= 3:  # header + 2 prompts
                break
            assert child.poll() is None, "the child finished before it could be killed"
            time.sleep(0.02)
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait(30)
    assert child.returncode == -signal.SIGKILL
    done = len(read_trace(progress).records)
    assert 2 <= done < 6
    resumed = run(pins, *MUTATION, "--progress-file", str(progress), "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert f"{done} of 6 prompts already done" in resumed.stderr
    assert stable(json.loads(resumed.stdout)) == stable(expected)


def test_an_unwritable_default_progress_folder_does_not_stop_a_run(
    pins: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("GATE_RUNS_DIR", str(blocker))
    r = run(pins)
    assert r.exit_code == 0, r.output
    assert "running without a progress file" in r.stderr
    # A progress file asked for by name must be writable.
    r = run(pins, "--progress-file", str(blocker / "p.jsonl"))
    assert r.exit_code == 2, r.output
    assert "cannot write there" in r.stderr
