"""`gate compare ORACLE CANDIDATE`: adjudicate two trace files; no model, torch or engine."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gate.cli import options


def compare_files(
    *,
    oracle: Path,
    candidate: Path,
    near_tie_mnats: float | None,
    near_tie_ulps: float | None,
    no_evidence: bool = False,
    strict: bool,
    fmt: str,
    output: Path | None,
    force: bool,
    details: bool = False,
) -> int:
    from gate.cli.common import doctrine_overrides
    from gate.cli.output import emit, refuse_overwrite
    from gate.core.traces.trace import read_trace
    from gate.core.verdict.adjudicate import compare
    from gate.core.verdict.doctrine import header_doctrine, resolve_doctrine
    from gate.reports import check_format

    fmt = check_format("GateResult", fmt)
    refuse_overwrite(force, (output, "--output"), inputs=(oracle, candidate))
    o = read_trace(oracle, role="oracle")
    c = read_trace(candidate, role="candidate")
    # The doctrine an oracle trace carries in its header (a pin's does) travels with it: the
    # same verdict as `gate run`.
    doctrine = resolve_doctrine(
        header_doctrine(o.header.extra, str(oracle)),
        doctrine_overrides(near_tie_mnats, near_tie_ulps, no_evidence),
        strict=strict,
        source=f"the oracle trace's header ({oracle})",
    )
    from gate.core.verdict.routing import attribute_routing

    result = attribute_routing(compare(o, c, doctrine), o, c)
    emit(result, fmt, output, force=force, details=details)
    return result.exit_code


def register(app: typer.Typer) -> None:
    @app.command("compare", epilog=options.EXIT_CODES_COMPARE)
    def compare_cmd(
        oracle: Annotated[Path, typer.Argument(help="Oracle trace (JSON Lines, format v1).")],
        candidate: Annotated[Path, typer.Argument(help="Candidate trace (JSON Lines, format v1).")],
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
        code = compare_files(
            oracle=oracle,
            candidate=candidate,
            near_tie_mnats=near_tie_mnats,
            near_tie_ulps=near_tie_ulps,
            no_evidence=no_evidence,
            strict=strict,
            fmt=fmt.value,
            output=output,
            force=force,
            details=details,
        )
        raise typer.Exit(code)
