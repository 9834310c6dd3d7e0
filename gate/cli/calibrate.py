"""`gate calibrate`: the doctrine from data (`gate.workflows.calibration.calibrate`).

`gate calibrate ORACLE CANDIDATE` measures drift from two trace files (no model, no torch);
without files it runs the candidate engine over the model's pin first.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gate.cli import options

if TYPE_CHECKING:
    from gate.workflows.calibration.calibrate import CalibrateRequest


def calibrate_command(*, request: CalibrateRequest, report: options.ReportTarget) -> int:
    from gate.cli.common import progress_display
    from gate.cli.output import emit, pin_inputs, refuse_overwrite, say
    from gate.core.storage.atomic import TRACE
    from gate.reports import check_format
    from gate.workflows.calibration.calibrate import calibrate_request

    fmt = check_format("Calibration", report.fmt)
    request.engine.options()
    pinned = pin_inputs(request.pin_model(), request.pins_dir) if request.oracle is None else ()
    refuse_overwrite(
        report.force,
        (report.output, "--output"),
        (request.save_trace, "--save-trace", TRACE),
        inputs=(request.oracle, request.candidate, *pinned),
    )
    cal = calibrate_request(request, say=say, display=progress_display)
    emit(cal, fmt, report.output, force=report.force, engine_ran=request.oracle is None)
    return 0


def register(app: typer.Typer) -> None:
    @app.command("calibrate", epilog=options.EXIT_CODES_WRITE)
    def calibrate_cmd(
        oracle: Annotated[
            Path | None, typer.Argument(metavar="ORACLE", help="Oracle trace (omit both files to run the engine).")
        ] = None,
        candidate: Annotated[
            Path | None, typer.Argument(metavar="CANDIDATE", help="Candidate trace with top_logprobs.")
        ] = None,
        model: options.Model = None,
        engine: options.Engine = None,
        engine_opt: options.EngineOpt = None,
        model_path: options.ModelPath = None,
        pins_dir: options.PinsDir = None,
        dtype: Annotated[
            str | None,
            typer.Option("--dtype", help="Grid of the figures in steps (default: the oracle's dtype, else bfloat16)."),
        ] = None,
        fmt: options.RichOrJsonOpt = options.RichOrJson.rich,
        output: options.Output = None,
        save_trace: options.SaveTrace = None,
        force: options.ForceOutputs = False,
    ) -> None:
        """Measure the drift between a candidate and the oracle and recommend a near-tie doctrine."""
        from gate.workflows.calibration.calibrate import CalibrateRequest
        from gate.workflows.common.requests import EngineRequest

        request = CalibrateRequest(
            oracle=oracle,
            candidate=candidate,
            model=model,
            engine=EngineRequest(engine, tuple(engine_opt or ()), model_path),
            pins_dir=pins_dir,
            dtype=dtype,
            save_trace=save_trace,
            force=force,
        )
        raise typer.Exit(calibrate_command(request=request, report=options.ReportTarget(fmt.value, output, force)))
