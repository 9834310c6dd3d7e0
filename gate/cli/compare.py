"""`gate compare ORACLE CANDIDATE`: adjudicate two trace files; no model, torch or engine."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def compare_files(
    *,
    oracle: Path,
    candidate: Path,
    near_tie_mnats: float | None,
    near_tie_ulps: float | None,
    strict: bool,
    fmt: str,
    output: Path | None,
    force: bool,
) -> int:
    from gate.cli.common import check_format, emit_report
    from gate.core.adjudicate import compare
    from gate.core.doctrine import DEFAULT_NEAR_TIE_MNATS, Doctrine
    from gate.core.trace import read_trace

    check_format(fmt)
    doctrine = Doctrine(
        near_tie_mnats=DEFAULT_NEAR_TIE_MNATS if near_tie_mnats is None else near_tie_mnats,
        strict=strict,
        near_tie_ulps=near_tie_ulps,
    )
    o = read_trace(oracle, role="oracle")
    c = read_trace(candidate, role="candidate")
    result = compare(o, c, doctrine)
    emit_report(result, fmt, output, force=force)
    return result.exit_code


def register(app: typer.Typer) -> None:
    @app.command("compare")
    def compare_cmd(
        oracle: Annotated[Path, typer.Argument(help="Oracle trace (JSON Lines, format v1).")],
        candidate: Annotated[Path, typer.Argument(help="Candidate trace (JSON Lines, format v1).")],
        near_tie_mnats: Annotated[
            float | None, typer.Option("--near-tie-mnats", help="Near-tie threshold in millinats (default: 125).")
        ] = None,
        near_tie_ulps: Annotated[
            float | None,
            typer.Option("--near-tie-ulps", help="Also ratify gaps within N dtype grid steps (needs raw logits)."),
        ] = None,
        strict: Annotated[bool, typer.Option("--strict", help="Fail (exit 1) unless every prompt is strict.")] = False,
        fmt: Annotated[str, typer.Option("--format", help="rich, json, markdown, junit or html.")] = "rich",
        output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the report to this file.")] = None,
        force: Annotated[bool, typer.Option("--force", help="Replace --output if it exists.")] = False,
    ) -> None:
        """Adjudicate two trace files without loading any model, torch or engine."""
        code = compare_files(
            oracle=oracle,
            candidate=candidate,
            near_tie_mnats=near_tie_mnats,
            near_tie_ulps=near_tie_ulps,
            strict=strict,
            fmt=fmt,
            output=output,
            force=force,
        )
        raise typer.Exit(code)
