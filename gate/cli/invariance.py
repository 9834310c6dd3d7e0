"""`gate invariance`: the candidate against itself under schedules (batch, order, threads,
chunked prefill, forced decode against its free run). The work happens in
`gate.workflows.invariance.request`; this module parses options, draws the progress bar on stderr
and prints the matrix. Exit 0 unless a cell varies (a defect flip, or drift beyond the
doctrine); with `--strict`, anything short of bit-identical is exit 1."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from gate.cli import options

if TYPE_CHECKING:
    from gate.workflows.invariance.request import InvarianceRequest


def invariance_command(*, request: InvarianceRequest, report: options.ReportTarget) -> int:
    from gate.cli.common import progress_display
    from gate.cli.output import emit, pin_inputs, refuse_overwrite
    from gate.reports import check_format
    from gate.workflows.invariance.request import invariance_request

    fmt = check_format("InvarianceResult", report.fmt)
    request.plan()
    refuse_overwrite(
        report.force, (report.output, "--output"), inputs=pin_inputs(request.pin_model(), request.pins_dir)
    )
    result = invariance_request(request, display=progress_display)
    emit(result, fmt, report.output, force=report.force, engine_ran=True)
    return result.exit_code


def register(app: typer.Typer) -> None:
    @app.command("invariance", epilog=options.EXIT_CODES_INVARIANCE)
    def invariance_cmd(
        model: options.Model = None,
        engine: options.Engine = None,
        engine_opt: options.EngineOpt = None,
        model_path: options.ModelPath = None,
        schedules: Annotated[
            list[str] | None,
            typer.Option(
                "--schedules",
                help="Cells to run, comma-separated or repeated: repeat, batch, concurrency, max_num_seqs, needle, "
                "shuffle, threads, chunked_prefill, forced_decode, prefill, prefix_cache "
                "\\[default: all the engine can run].",
            ),
        ] = None,
        batch: Annotated[int, typer.Option("--batch", help="N of the batch and needle cells.")] = 8,
        seed: Annotated[int, typer.Option("--seed", help="The shuffle cell's seed.")] = 0,
        threads: Annotated[int, typer.Option("--threads", help="The threads cell's count (the baseline runs 1).")] = 2,
        chunk: Annotated[int, typer.Option("--chunk", help="Tokens per prefill chunk (chunked_prefill cell).")] = 8,
        near_tie_mnats: options.NearTieMnats = None,
        near_tie_ulps: options.NearTieUlps = None,
        strict: Annotated[
            bool, typer.Option("--strict", help="Fail (exit 1) unless every cell is bit-identical to its reference.")
        ] = False,
        fmt: options.InvarianceFormatOpt = options.InvarianceFormat.rich,
        output: options.Output = None,
        pins_dir: options.PinsDir = None,
        force: options.Force = False,
    ) -> int:
        """Run the candidate against itself under schedules: batch, order, threads, chunked prefill, forced decode."""
        from gate.workflows.common.requests import DoctrineFlags, EngineRequest
        from gate.workflows.invariance.request import InvarianceRequest

        request = InvarianceRequest(
            model=model,
            engine=EngineRequest(engine, tuple(engine_opt or ()), model_path),
            schedules=tuple(schedules) if schedules is not None else None,
            batch=batch,
            seed=seed,
            threads=threads,
            chunk=chunk,
            doctrine=DoctrineFlags(near_tie_mnats, near_tie_ulps),
            strict=strict,
            pins_dir=pins_dir,
        )
        return invariance_command(request=request, report=options.ReportTarget(fmt.value, output, force))
