"""A pytest plugin: under CI (`CI=true`), a test that skips fails instead.

CI installs everything the suite needs (`scripts/install.sh --dev`, Debian's chromium), so
a skip there means a test CI meant to run did not run: the browser test without a browser,
an engine test without its engine. `GATE_CI_ALLOWED_SKIPS` (a regular expression matched
against the skip's reason) names the skips a CI machine accepts; by default none.
Expected failures (`xfail`) are not skips. Loaded by tests/conftest.py.
"""

from __future__ import annotations

import os
import re
from collections.abc import Generator
from typing import Any

import pytest


def skip_reason(report: pytest.TestReport) -> str:
    longrepr: Any = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def under_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("true", "1", "yes")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if not (under_ci() and report.skipped) or hasattr(report, "wasxfail"):
        return
    reason = skip_reason(report)
    allowed = os.environ.get("GATE_CI_ALLOWED_SKIPS", "")
    if allowed and re.search(allowed, reason):
        return
    report.outcome = "failed"
    report.longrepr = f"skipped under CI=true, where every test is meant to run: {reason}"
