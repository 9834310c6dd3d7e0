"""`gate compare ORACLE CANDIDATE`: adjudicate two trace files; no model, torch or engine
(`gate.workflows.run.compare`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gate.cli import options

if TYPE_CHECKING:
    from gate.workflows.run.compare import CompareRequest


def compare_files(*, request: CompareRequest, report: options.ReportTarget) -> int:
    from gate.cli.output import emit, refuse_overwrite
    from gate.reports import check_format
    from gate.workflows.run.compare import compare_traces

    fmt = check_format("GateResult", report.fmt)
    refuse_overwrite(report.force, (report.output, "--output"), inputs=(request.oracle, request.candidate))
    result = compare_traces(request)
    emit(result, fmt, report.output, force=report.force, details=report.details)
    return result.exit_code


def register(app: typer.Typer) -> None:
    @app.command("compare", epilog=options.EXIT_CODES_COMPARE)
    def compare_cmd(
        oracle: Annotated[Path, typer.Argument(metavar="ORACLE", help="Oracle trace (JSON Lines, format v1).")],
        candidate: Annotated[
            Path, typer.Argument(metavar="CANDIDATE", help="Candidate trace (JSON Lines, format v1).")
        ],
        near_tie_mnats: options.NearTieMnats = None,
        near_tie_ulps: options.NearTieUlps = None,
        no_evidence: options.NoEvidence = False,
        strict: options.Strict = False,
        fmt: options.GateFormatOpt = options.GateFormat.rich,
        output: options.Output = None,
        details: options.Details = False,
        force: options.Force = False,
    ) -> None:
        """Adjudicate two trace files without loading any model, torch or engine."""
        from gate.workflows.common.requests import DoctrineFlags
        from gate.workflows.run.compare import CompareRequest

        request = CompareRequest(oracle, candidate, DoctrineFlags(near_tie_mnats, near_tie_ulps, no_evidence), strict)
        raise typer.Exit(compare_files(request=request, report=options.ReportTarget(fmt.value, output, force, details)))
