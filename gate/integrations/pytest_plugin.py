"""The pytest plugin: the `gate_check` fixture, gating a candidate inside any test suite.

Installed with the package (entry point group `pytest11`, name `gate`), so a project's
tests need nothing but `pip install gate-llm`:

    def test_my_engine_matches_the_pin(gate_check):
        gate_check("traces/my-engine.jsonl")            # or an engine object

`gate_check(candidate, *, model=None, pins_dir=None, strict=False, near_tie_mnats=None,
near_tie_ulps=None, no_evidence=False)` gates the candidate against the pin exactly as
`gate run` does and returns the `GateResult`; a verdict that is not a pass fails the test
with the one-line summary and the reason. With `--gate-report-dir DIR` (or the ini option
`gate_report_dir`) every call writes its full report there, JSON and Markdown, named after
the test (a rerun replaces the reports of the same test).

pytest imports this module in every session on a machine with gate installed: it imports
pytest and the standard library only; gate's pipeline is imported when a test gates.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from gate.core.verdict.result import GateResult

REPORT_DIR_OPTION = "--gate-report-dir"
REPORT_DIR_INI = "gate_report_dir"
PINS_DIR_OPTION = "--gate-pins-dir"
PINS_DIR_INI = "gate_pins_dir"
_WRITTEN = pytest.StashKey[list[Path]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gate", "gate: token-exact gating against a pinned oracle")
    group.addoption(
        REPORT_DIR_OPTION,
        dest="gate_report_dir",
        default=None,
        metavar="DIR",
        help="write each gate_check's full report (JSON and Markdown, named after the test) into DIR",
    )
    group.addoption(
        PINS_DIR_OPTION,
        dest="gate_pins_dir",
        default=None,
        metavar="DIR",
        help="look for pins in DIR first (as `gate run --pins-dir`)",
    )
    parser.addini(REPORT_DIR_INI, "gate_check's report folder (as --gate-report-dir), relative to the rootdir")
    parser.addini(PINS_DIR_INI, "where gate_check looks for pins first (as --gate-pins-dir), relative to the rootdir")


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_WRITTEN] = []


def _folder(config: pytest.Config, option: str, ini: str) -> Path | None:
    """The command line's folder (relative to where pytest was started), else the ini's
    (relative to the rootdir), else None."""
    given = config.getoption(option)
    if given:
        return Path(config.invocation_params.dir, given)
    from_ini = config.getini(ini)
    if from_ini:
        return Path(config.rootpath, str(from_ini))
    return None


def report_stem(nodeid: str, call: int) -> str:
    """A file name for a test's report: its node id with anything outside [A-Za-z0-9._-]
    made '_', and the call's number after the first."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", nodeid).strip("_.") or "gate_check"
    return stem[:200] + (f"-{call}" if call > 1 else "")


class GateCheck:
    """The callable `gate_check` fixture of one test."""

    def __init__(self, node: pytest.Item, report_dir: Path | None, pins_dir: Path | None) -> None:
        self._node = node
        self._report_dir = report_dir
        self._pins_dir = pins_dir
        self._calls = 0
        self.reports: list[Path] = []

    def __call__(
        self,
        candidate: Any,
        *,
        model: str | None = None,
        pins_dir: str | os.PathLike[str] | None = None,
        strict: bool = False,
        near_tie_mnats: float | None = None,
        near_tie_ulps: float | None = None,
        no_evidence: bool = False,
    ) -> GateResult:
        from gate.errors import GateError
        from gate.integrations.gating import Overrides, failure_reason, gate_candidate, passed

        self._calls += 1
        try:
            outcome = gate_candidate(
                candidate,
                model=model,
                pins_dir=pins_dir if pins_dir is not None else self._pins_dir,
                strict=strict,
                overrides=Overrides(near_tie_mnats, near_tie_ulps, no_evidence),
            )
        except GateError as exc:
            pytest.fail(f"gate: error: {exc}" + (f"\nhint: {exc.hint}" if exc.hint else ""), pytrace=False)
        result = outcome.result
        written = self._write(result)
        self._node.user_properties.append(("gate", result.summary))
        if not passed(result):
            where = f"\nfull report: {written[0]}" if written else ""
            pytest.fail(f"gate: {result.summary}\n{failure_reason(result)}{where}", pytrace=False)
        return result

    def _write(self, result: GateResult) -> list[Path]:
        if self._report_dir is None:
            return []
        from gate.core.storage.atomic import atomic_write
        from gate.reports import render

        stem = report_stem(self._node.nodeid, self._calls)
        self._report_dir.mkdir(parents=True, exist_ok=True)
        out = []
        for fmt, suffix in (("json", ".json"), ("markdown", ".md")):
            path = self._report_dir / (stem + suffix)
            atomic_write(path, render(result, fmt).encode("utf-8"), overwrite=True)
            out.append(path)
        self.reports += out
        self._node.config.stash[_WRITTEN].extend(out)
        return out


@pytest.fixture
def gate_check(request: pytest.FixtureRequest) -> Callable[..., GateResult]:
    """Gate a candidate (a trace path, a Trace or an engine) against the pin; a verdict
    that is not a pass fails the test with the summary and the reason."""
    config = request.config
    return GateCheck(
        request.node,
        _folder(config, "gate_report_dir", REPORT_DIR_INI),
        _folder(config, "gate_pins_dir", PINS_DIR_INI),
    )


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    written = config.stash.get(_WRITTEN, [])
    if written:
        folders = sorted({str(p.parent) for p in written})
        terminalreporter.write_line(f"gate: {len(written)} report file(s) written to {', '.join(folders)}")
