"""`gate diff BASE NEW`: what a run changed relative to another run against the same pin,
from their JSON reports; exit 1 when NEW is worse, 2 when the two cannot be compared."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from gate.cli import options

EXIT_CODES_DIFF = (
    "Exit codes: 0 NEW is not worse than BASE; 1 NEW is worse (a new defect, a prompt no longer ratified, the "
    "distribution beyond the pin's floor, a failing verdict where BASE passed); 2 the reports are unreadable or "
    "not runs against the same pin; 4 internal error (a bug in gate)."
)


class DiffFormat(StrEnum):
    rich = "rich"
    json = "json"
    markdown = "markdown"


def diff_files(*, base: Path, new: Path, report: options.ReportTarget) -> int:
    from gate.cli.output import emit, refuse_overwrite
    from gate.reports import check_format
    from gate.workflows.run.diff import diff_report_files

    fmt = check_format("ReportDiff", report.fmt)
    refuse_overwrite(report.force, (report.output, "--output"), inputs=(base, new))
    result = diff_report_files(base, new)
    emit(result, fmt, report.output, force=report.force)
    return result.exit_code


def register(app: typer.Typer) -> None:
    @app.command("diff", epilog=EXIT_CODES_DIFF)
    def diff_cmd(
        base: Annotated[Path, typer.Argument(metavar="BASE", help="The base run's JSON report (e.g. main's).")],
        new: Annotated[
            Path, typer.Argument(metavar="NEW", help="The new run's JSON report (e.g. the pull request's).")
        ],
        fmt: Annotated[
            DiffFormat,
            typer.Option("--format", help="Report format.", case_sensitive=False, rich_help_panel=options.OUTPUT_PANEL),
        ] = DiffFormat.rich,
        output: options.Output = None,
        force: options.Force = False,
    ) -> None:
        """What NEW changed relative to BASE, two runs against the same pin (their JSON reports):
        prompts newly diverging and fixed, divergences whose class changed, defects added and removed,
        the distribution figures before and after."""
        raise typer.Exit(diff_files(base=base, new=new, report=options.ReportTarget(fmt.value, output, force)))
