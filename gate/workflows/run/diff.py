"""Two runs' JSON reports against the same pin, compared (`gate diff BASE NEW`)."""

from __future__ import annotations

import stat
from pathlib import Path

import orjson

from gate.core.storage.json_file import read_json
from gate.core.verdict.diff import TRACE_NOT_REPORT, ReportDiff, RunReport, diff_reports, parse_report
from gate.errors import InputError

REPORT = "gate JSON report (`gate run --format json`)"


def read_report(path: Path) -> RunReport:
    """A JSON report read from `path`: bounded and checked before parsing (an object, so
    its first byte is `{`), then checked field by field and against itself. A trace given
    for a report is named for what it is."""
    try:
        raw = read_json(path, what=REPORT, opens=b"{")
    except InputError as exc:
        if _is_trace(path):
            raise InputError(f"{path}: {TRACE_NOT_REPORT}") from None
        raise exc from None
    return parse_report(raw, str(path))


def _is_trace(path: Path) -> bool:
    """`path` is a regular file whose first line (within 64 KiB) is a trace header."""
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            return False
        with open(path, "rb") as fh:
            first = fh.read(64 * 1024).split(b"\n", 1)[0]
        head = orjson.loads(first)
    except (OSError, orjson.JSONDecodeError):
        return False
    return isinstance(head, dict) and "gate_trace" in head


def diff_report_files(base: Path, new: Path) -> ReportDiff:
    return diff_reports(read_report(base), read_report(new))
