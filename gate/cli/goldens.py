"""`gate goldens record` and `gate goldens check`: an engine's own greedy outputs, kept in
goldens/<org>/<model>/<engine>.jsonl, and the proof that a change to the engine is inert
(or the list of every golden it moves, each with its cause).

The options are collected into one `gate.workflows.goldens.request.GoldensRequest`; the work is
`gate.workflows.goldens.request` (files and judging: `gate.core.goldens.golden`); the reports
are `gate.reports.goldens`. This module parses options and hands the report to the output sink.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gate.cli import options
from gate.cli.common import App

if TYPE_CHECKING:
    from gate.workflows.goldens.request import GoldensRequest


def record_goldens(*, request: GoldensRequest) -> int:
    from gate.cli.common import progress_display
    from gate.cli.output import pin_inputs, refuse_overwrite, say
    from gate.core.storage.atomic import GOLDEN
    from gate.workflows.goldens.request import golden_target
    from gate.workflows.goldens.request import record_goldens as record

    target = golden_target(request)
    # Refused before the model loads (minutes on a large one).
    refuse_overwrite(
        request.force,
        (target.path, "", GOLDEN),
        inputs=pin_inputs(target.pin.model, request.pins_dir),
        message="{path}: a golden exists; pass --force (or --accept) to re-record it "
        "(the old one is kept as a backup, and what moved is shown)",
    )
    record(request, target, say=say, display=progress_display)
    return 0


def check_goldens(*, request: GoldensRequest, report: options.ReportTarget) -> int:
    from gate.cli.common import progress_display
    from gate.cli.output import emit, pin_inputs, refuse_overwrite
    from gate.errors import GateError
    from gate.reports import check_format
    from gate.workflows.goldens.request import accept_moves
    from gate.workflows.goldens.request import check_goldens as check

    fmt = check_format("GoldensResult", report.fmt)
    refuse_overwrite(
        report.force,
        (report.output, "--output"),
        inputs=(request.golden, *pin_inputs(request.pin_model(), request.pins_dir)),
    )
    checked = check(request, display=progress_display)
    result = checked.result
    if request.accept and result.moves:
        try:
            result = accept_moves(checked)
        except GateError:
            emit(result, fmt, report.output, force=report.force, engine_ran=True)
            raise
    emit(result, fmt, report.output, force=report.force, engine_ran=True)
    return result.exit_code


# --------------------------------------------------------------------------- commands

_GoldensDir = Annotated[
    Path | None,
    typer.Option("--goldens-dir", help="Folder of goldens \\[default: $GATE_GOLDENS_DIR, ./goldens, gate's own]."),
]
_Golden = Annotated[
    Path | None,
    typer.Option("--golden", help="This golden file instead of <goldens-dir>/<org>/<model>/<engine>.jsonl."),
]


def register(app: typer.Typer) -> None:
    goldens_app = App(
        name="goldens",
        help="An engine's own greedy outputs (goldens/<org>/<model>/<engine>.jsonl): record them, and check "
        "that a change to the engine moves none, or which it moves and why.",
        no_args_is_help=True,
    )

    @goldens_app.command("record", epilog=options.EXIT_CODES_WRITE)
    def record_cmd(
        model: options.Model = None,
        engine: options.Engine = None,
        engine_opt: options.EngineOpt = None,
        model_path: options.ModelPath = None,
        pins_dir: options.PinsDir = None,
        goldens_dir: _GoldensDir = None,
        golden: _Golden = None,
        force: Annotated[
            bool,
            typer.Option("--force", help="Replace an existing golden (a backup is kept; moves are shown)."),
        ] = False,
        accept: Annotated[bool, typer.Option("--accept", hidden=True, help="Old name of --force.")] = False,
    ) -> None:
        """Run the engine greedily over the pinned prompts and write its golden atomically."""
        from gate.workflows.common.requests import EngineRequest
        from gate.workflows.goldens.request import GoldensRequest

        request = GoldensRequest(
            model=model,
            engine=EngineRequest(engine, tuple(engine_opt or ()), model_path),
            pins_dir=pins_dir,
            goldens_dir=goldens_dir,
            golden=golden,
            force=force or accept,
        )
        raise typer.Exit(record_goldens(request=request))

    @goldens_app.command("check", epilog=options.EXIT_CODES_GOLDENS)
    def check_cmd(
        model: options.Model = None,
        engine: options.Engine = None,
        engine_opt: options.EngineOpt = None,
        model_path: options.ModelPath = None,
        pins_dir: options.PinsDir = None,
        goldens_dir: _GoldensDir = None,
        golden: _Golden = None,
        fmt: options.GoldensFormatOpt = options.GoldensFormat.rich,
        accept: Annotated[
            bool,
            typer.Option("--accept", help="Rewrite the moved goldens with the new tokens (backup kept); exit 0."),
        ] = False,
        near_tie_mnats: options.NearTieMnats = None,
        near_tie_ulps: options.NearTieUlps = None,
        no_evidence: options.NoEvidence = False,
        output: options.Output = None,
        force: options.Force = False,
    ) -> None:
        """Re-run the engine and list every golden that moved, with its cause.

        Each move's cause is judged against the oracle pin: "was recording a tie-break", "near-tie
        flip" or "real change"."""
        from gate.workflows.common.requests import DoctrineFlags, EngineRequest
        from gate.workflows.goldens.request import GoldensRequest

        request = GoldensRequest(
            model=model,
            engine=EngineRequest(engine, tuple(engine_opt or ()), model_path),
            pins_dir=pins_dir,
            goldens_dir=goldens_dir,
            golden=golden,
            accept=accept,
            doctrine=DoctrineFlags(near_tie_mnats, near_tie_ulps, no_evidence),
        )
        raise typer.Exit(check_goldens(request=request, report=options.ReportTarget(fmt.value, output, force)))

    app.add_typer(goldens_app)
