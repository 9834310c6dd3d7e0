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
the test (a rerun replaces the reports of the same test; two tests never share a file: a
name the folding to safe characters made ambiguous carries a hash of the test's node id).

pytest imports this module in every session on a machine with gate installed: it imports
pytest and the standard library only; gate's pipeline is imported when a test gates.
"""

from __future__ import annotations

import hashlib
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
_WRITTEN = pytest.StashKey[dict[Path, None]]()
# Report stem -> the node id that wrote it, this session: a second node id folded onto one
# name (`sub/test_a.py::test_b`, `sub_test_a.py::test_b`) gets the hashed name.
_STEMS = pytest.StashKey[dict[str, str]]()
# Node ids made file names keep this much of their readable form.
_STEM_CHARS = 150


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
    config.stash[_WRITTEN] = {}
    config.stash[_STEMS] = {}
    folder = _folder(config, "gate_report_dir", REPORT_DIR_INI)
    if folder is not None and folder.exists() and not folder.is_dir():
        raise pytest.UsageError(f"{REPORT_DIR_OPTION} {folder}: is not a folder (a file of that name exists)")


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


def report_stem(nodeid: str, call: int, *, hashed: bool = False) -> str:
    """A file name for a test's report: its node id with anything outside [A-Za-z0-9._-]
    made '_', and the call's number after the first. Where that folding could make two node
    ids one name (a parametrized id or any character but the path's '/' and '::' folded, a
    cut past 150 characters), or when `hashed`, the first 12 hex digits of the node id's
    SHA-256 follow."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", nodeid).strip("_.") or "gate_check"
    plain = re.fullmatch(r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*(::[A-Za-z0-9._-]+)+", nodeid)
    if hashed or plain is None or len(stem) > _STEM_CHARS:
        digest = hashlib.sha256(nodeid.encode("utf-8")).hexdigest()[:12]
        stem = f"{stem[:_STEM_CHARS]}-{digest}"
    return stem + (f"-{call}" if call > 1 else "")


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
        error = ""
        try:
            outcome = gate_candidate(
                candidate,
                model=model,
                pins_dir=pins_dir if pins_dir is not None else self._pins_dir,
                strict=strict,
                overrides=Overrides(near_tie_mnats, near_tie_ulps, no_evidence),
            )
        except GateError as exc:
            error = f"gate: error: {exc}" + (f"\nhint: {exc.hint}" if exc.hint else "")
        if error:  # failed outside the handler: the message once, not again as a chained exception
            pytest.fail(error, pytrace=False)
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

        nodeid = self._node.nodeid
        stems = self._node.config.stash[_STEMS]
        stem = report_stem(nodeid, self._calls)
        if stems.setdefault(stem, nodeid) != nodeid:
            stem = report_stem(nodeid, self._calls, hashed=True)
        out = []
        problem = ""
        try:
            self._report_dir.mkdir(parents=True, exist_ok=True)
            for fmt, suffix in (("json", ".json"), ("markdown", ".md")):
                path = self._report_dir / (stem + suffix)
                atomic_write(path, render(result, fmt).encode("utf-8"), overwrite=True)
                out.append(path)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            problem = f"gate: error: {REPORT_DIR_OPTION} {self._report_dir}: cannot write the report ({reason})"
        if problem:
            pytest.fail(problem, pytrace=False)
        self.reports += out
        self._node.config.stash[_WRITTEN].update(dict.fromkeys(out))
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
    # Each file once, however often it was replaced.
    seen: dict[Path, None] = config.stash.get(_WRITTEN, {})
    written = list(seen)
    if written:
        folders = sorted({str(p.parent) for p in written})
        terminalreporter.write_line(f"gate: {len(written)} report file(s) written to {', '.join(folders)}")
