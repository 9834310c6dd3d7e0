"""Two runs' JSON reports against the same pin, compared (`gate diff BASE NEW`)."""

from __future__ import annotations

from pathlib import Path

from gate.core.storage.json_file import read_json
from gate.core.verdict.diff import ReportDiff, RunReport, diff_reports, parse_report

REPORT = "gate JSON report (`gate run --format json`)"


def read_report(path: Path) -> RunReport:
    """A JSON report read from `path`: bounded and checked before parsing (an object, so
    its first byte is `{`), then checked field by field and against itself."""
    return parse_report(read_json(path, what=REPORT, opens=b"{"), str(path))


def diff_report_files(base: Path, new: Path) -> ReportDiff:
    return diff_reports(read_report(base), read_report(new))
