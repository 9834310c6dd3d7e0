"""tests/helpers/ci_skips.py: under CI=true a skipped test fails the run; elsewhere it skips."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

SAMPLE = """
import pytest

def test_runs():
    pass

@pytest.mark.skipif(True, reason="no headless browser")
def test_browser():
    pass

def test_skips_inside():
    pytest.skip("no engine here")

@pytest.mark.xfail(reason="known", strict=True)
def test_expected_failure():
    assert False
"""


def run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    clean = {k: v for k, v in os.environ.items() if k not in ("CI", "GATE_CI_ALLOWED_SKIPS")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "helpers.ci_skips", "-p", "no:cacheprovider", "test_sample.py"],
        cwd=tmp_path,
        env={**clean, "PYTHONPATH": str(TESTS), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_skips_pass_outside_ci(tmp_path: Path) -> None:
    r = run(tmp_path)
    assert r.returncode == 0, r.stdout
    assert "1 passed, 2 skipped, 1 xfailed" in r.stdout


def test_under_ci_a_skip_fails_the_run(tmp_path: Path) -> None:
    r = run(tmp_path, CI="true")
    assert r.returncode == 1, r.stdout
    # A skip in the test body fails it; a skipif mark (decided at setup) is an error: both fail the run.
    assert "1 failed, 1 passed, 1 xfailed, 1 error" in r.stdout
    assert "skipped under CI=true, where every test is meant to run: no headless browser" in r.stdout


def test_a_ci_machine_may_name_the_skips_it_accepts(tmp_path: Path) -> None:
    r = run(tmp_path, CI="true", GATE_CI_ALLOWED_SKIPS="no engine")
    assert r.returncode == 1, r.stdout
    assert "1 passed, 1 skipped, 1 xfailed, 1 error" in r.stdout
