"""Two runs' JSON reports against the same pin, compared (`gate diff BASE NEW`)."""

from __future__ import annotations

from pathlib import Path

from gate.core.storage.json_file import read_json
from gate.core.verdict.diff import ReportDiff, diff_reports, parse_report

REPORT = "gate JSON report (`gate run --format json`)"


def diff_report_files(base: Path, new: Path) -> ReportDiff:
    return diff_reports(
        parse_report(read_json(base, what=REPORT), str(base)), parse_report(read_json(new, what=REPORT), str(new))
    )
