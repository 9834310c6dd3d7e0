"""`gate invariance`: the candidate against itself under schedules (batch, order, threads,
chunked prefill, forced decode against its free run). The work happens in
`gate.workflows.invariance`; this module parses options, draws the progress bar on stderr
and prints the matrix. Exit 0 unless a cell varies (a defect flip, or drift beyond the
doctrine); with `--strict`, anything short of bit-identical is exit 1."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gate.cli import options

if TYPE_CHECKING:
    from gate.core.engine import Engine


def invariance_command(
    *,
    model: str | None,
    engine: str | None,
    engine_opts: list[str] | None,
    model_path: Path | None,
    schedules: list[str] | None,
    batch: int,
    seed: int,
    threads: int,
    chunk: int,
    near_tie_mnats: float | None,
    near_tie_ulps: float | None,
    strict: bool,
    fmt: str,
    output: Path | None,
    pins_dir: Path | None,
    force: bool,
) -> int:
    from gate.cli.common import ProgressBar, default_model, doctrine_overrides, parse_engine_opts, progress_bar
    from gate.cli.output import emit, pin_inputs, refuse_overwrite
    from gate.core.pins.pin import doctrine_for, load_pin
    from gate.core.verdict.doctrine import apply_overrides
    from gate.engines.registry import load_engine, resolve
    from gate.reports import check_format
    from gate.workflows.invariance import InvariancePlan, parse_cells, run_invariance

    fmt = check_format("InvarianceResult", fmt)
    opts = parse_engine_opts(engine_opts)
    flags = doctrine_overrides(near_tie_mnats, near_tie_ulps)
    # A bad threshold fails before any work.
    apply_overrides({}, flags)
    plan = InvariancePlan(
        cells=parse_cells(schedules), batch=batch, seed=seed, threads=threads, chunk=chunk, strict=strict
    )
    refuse_overwrite(force, (output, "--output"), inputs=pin_inputs(model or default_model(), pins_dir))
    pin = load_pin(model or default_model(), pins_dir)
    doctrine = doctrine_for(pin, flags, strict=strict)
    name = engine or "hf"
    engine_class = resolve(name)
    target = str(model_path) if model_path is not None else pin.model

    def load(options_now: Mapping[str, str]) -> Engine:
        return load_engine(name, target, options_now)

    with progress_bar() as bar:
        result = run_invariance(
            load,
            engine_class,
            pin,
            doctrine,
            plan,
            engine_name=name,
            options=opts,
            progress=ProgressBar(bar),
        )
    emit(result, fmt, output, force=force, engine_ran=True)
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
                "shuffle, threads, chunked_prefill, forced_decode, prefill \\[default: all the engine can run].",
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
        return invariance_command(
            model=model,
            engine=engine,
            engine_opts=engine_opt,
            model_path=model_path,
            schedules=schedules,
            batch=batch,
            seed=seed,
            threads=threads,
            chunk=chunk,
            near_tie_mnats=near_tie_mnats,
            near_tie_ulps=near_tie_ulps,
            strict=strict,
            fmt=fmt.value,
            output=output,
            pins_dir=pins_dir,
            force=force,
        )
