"""`gate selftest`: the gate tested by mutation (`gate.workflows.calibration.selftest`). It runs the HF
engine with injected faults over the pin and reports what the gate made of each (exit 0
when every fault was caught and classified as expected, 1 otherwise)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from gate.cli import options

if TYPE_CHECKING:
    from gate.workflows.calibration.selftest import SelftestRequest


def selftest_command(*, request: SelftestRequest, report: options.ReportTarget) -> int:
    from gate.cli.common import progress_display
    from gate.cli.output import emit, pin_inputs, refuse_overwrite, say
    from gate.reports import check_format
    from gate.workflows.calibration.selftest import selftest_request

    fmt = check_format("SelfTestResult", report.fmt)
    refuse_overwrite(
        report.force, (report.output, "--output"), inputs=pin_inputs(request.pin_model(), request.pins_dir)
    )
    result = selftest_request(request, say=say, display=progress_display)
    emit(result, fmt, report.output, force=report.force, engine_ran=True)
    return result.exit_code


def register(app: typer.Typer) -> None:
    @app.command("selftest", epilog=options.EXIT_CODES_SELFTEST)
    def selftest_cmd(
        model: options.Model = None,
        model_path: options.ModelPath = None,
        pins_dir: options.PinsDir = None,
        engine_opt: options.EngineOpt = None,
        only: Annotated[list[str] | None, typer.Option("--only", help="Run only this mutant (repeatable).")] = None,
        near_tie_mnats: options.NearTieMnats = None,
        near_tie_ulps: Annotated[
            float | None,
            typer.Option(
                "--near-tie-ulps",
                help="Near-tie allowance in grid steps \\[default: the pin's doctrine, else 1].",
                rich_help_panel=options.DOCTRINE_PANEL,
            ),
        ] = None,
        no_evidence: options.NoEvidence = False,
        fmt: options.RichOrJsonOpt = options.RichOrJson.rich,
        output: options.Output = None,
        force: options.Force = False,
    ) -> None:
        """Inject faults into the HF engine and check the gate catches each."""
        from gate.workflows.calibration.selftest import SelftestRequest
        from gate.workflows.common.requests import DoctrineFlags

        request = SelftestRequest(
            model=model,
            model_path=model_path,
            pins_dir=pins_dir,
            engine_opts=tuple(engine_opt or ()),
            only=tuple(only) if only is not None else None,
            doctrine=DoctrineFlags(near_tie_mnats, near_tie_ulps, no_evidence),
        )
        raise typer.Exit(selftest_command(request=request, report=options.ReportTarget(fmt.value, output, force)))
