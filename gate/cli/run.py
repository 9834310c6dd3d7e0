"""`gate run`: gate a candidate engine (or a trace it wrote) against the pinned oracle.

The options are collected into one `gate.workflows.run.request.RunRequest`, carried out by
`gate.workflows.run.request.run_gate`; this module draws the progress bar on stderr and
prints the report.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from gate.cli import options

if TYPE_CHECKING:
    from gate.workflows.run.request import RunRequest


def run_gate(*, request: RunRequest, report: options.ReportTarget, timings: bool = False) -> int:
    from gate.cli.common import progress_display
    from gate.cli.output import emit, pin_inputs, refuse_overwrite, say
    from gate.core.storage.atomic import TRACE
    from gate.reports import check_format
    from gate.workflows.run.core import RunInterrupted
    from gate.workflows.run.request import run_gate as run

    fmt = check_format("GateResult", report.fmt)
    request.check()
    # Refuse to clobber before spending minutes on a model.
    refuse_overwrite(
        report.force,
        (request.save_trace, "--save-trace", TRACE),
        (report.output, "--output"),
        inputs=(request.candidate_trace, request.progress_file, *pin_inputs(request.pin_model(), request.pins_dir)),
    )
    engine_ran = request.candidate_trace is None
    try:
        outcome = run(request, say=say, display=progress_display)
    except RunInterrupted as exc:
        # Ctrl-C: the report of the prompts done so far, then exit 130 (gate.cli.main).
        emit(exc.outcome.result, fmt, None, engine_ran=True)
        raise
    emit(outcome.result, fmt, report.output, force=report.force, engine_ran=engine_ran, details=report.details)
    if engine_ran:
        from gate.cli.diagnose import diagnose_hint

        hint = diagnose_hint(
            outcome.result,
            model=outcome.candidate.header.model,
            engine=request.engine.name(),
            engine_opts=list(request.engine.engine_opts),
            model_path=request.engine.model_path,
            pins_dir=request.pins_dir,
        )
        if hint:
            say(hint)
    if timings:
        say(outcome.timings.line())
    return outcome.result.exit_code


def register(app: typer.Typer) -> None:
    @app.command("run", epilog=options.EXIT_CODES_GATE)
    def run_cmd(
        model: options.Model = None,
        engine: options.Engine = None,
        engine_opt: options.EngineOpt = None,
        model_path: options.ModelPath = None,
        near_tie_mnats: options.NearTieMnats = None,
        near_tie_ulps: options.NearTieUlps = None,
        no_evidence: options.NoEvidence = False,
        strict: options.Strict = False,
        fmt: options.GateFormatOpt = options.GateFormat.rich,
        output: options.Output = None,
        details: options.Details = False,
        save_trace: options.SaveTrace = None,
        candidate_trace: options.CandidateTrace = None,
        pins_dir: options.PinsDir = None,
        force: options.ForceOutputs = False,
        timings: options.Timings = False,
        shard: options.Shard = None,
        resume: options.Resume = False,
        progress_file: options.ProgressFile = None,
        timeout: options.Timeout = None,
        repeat: options.Repeat = 1,
    ) -> None:
        """Gate a candidate engine against the pinned vLLM oracle."""
        from gate.workflows.common.requests import DoctrineFlags, EngineRequest
        from gate.workflows.run.request import RunRequest

        request = RunRequest(
            model=model,
            engine=EngineRequest(engine, tuple(engine_opt or ()), model_path),
            doctrine=DoctrineFlags(near_tie_mnats, near_tie_ulps, no_evidence),
            strict=strict,
            candidate_trace=candidate_trace,
            save_trace=save_trace,
            pins_dir=pins_dir,
            force=force,
            shard=shard,
            resume=resume,
            progress_file=progress_file,
            timeout=timeout,
            repeat=repeat,
        )
        raise typer.Exit(
            run_gate(request=request, report=options.ReportTarget(fmt.value, output, force, details), timings=timings)
        )
