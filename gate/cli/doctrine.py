"""`gate calibrate` and `gate selftest`: the doctrine from data, and the gate tested by mutation.

`gate calibrate ORACLE CANDIDATE` measures drift from two trace files (no model, no torch);
without files it runs the candidate engine over the model's pin first. `gate selftest`
runs the HF engine with injected faults over the pin and reports what the gate made of
each (exit 0 when every fault was caught and classified as expected, 1 otherwise).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from rich.console import RenderableType

    from gate.core.pins import Pin
    from gate.core.trace import Trace

CALIBRATE_FORMATS = ("rich", "json")


def _check_format(fmt: str) -> str:
    from gate.errors import InputError

    if fmt not in CALIBRATE_FORMATS:
        raise InputError(f"--format {fmt!r}: expected one of {', '.join(CALIBRATE_FORMATS)}")
    return fmt


def _emit(text_json: str, renderable: RenderableType, plain: str, fmt: str, output: Path | None, force: bool) -> None:
    """JSON or rich to stdout, or the JSON / plain text to `output`; data only on stdout."""
    from rich.console import Console

    from gate.core.atomic import atomic_write

    if output is not None:
        atomic_write(output, (text_json if fmt == "json" else plain).encode("utf-8"), overwrite=force)
        print(f"report written to {output}", file=sys.stderr)
    elif fmt == "json":
        sys.stdout.write(text_json)
        sys.stdout.flush()
    else:
        Console(highlight=False, soft_wrap=False).print(renderable)


def _refuse_clobber(output: Path | None, force: bool, *more: tuple[Path | None, str]) -> None:
    from gate.errors import InputError

    for path, flag in ((output, "--output"), *more):
        if path is not None and path.exists() and not force:
            raise InputError(f"{flag} {path}: already exists; pass --force to replace it")


def _load_pin(model: str | None, pins_dir: Path | None) -> Pin:
    from gate.core.pins import load_pin
    from gate.models.default import DEFAULT_MODEL

    return load_pin(model or DEFAULT_MODEL, pins_dir)


# --------------------------------------------------------------------------- calibrate


def run_candidate_for_calibration(
    pin: Pin, engine_name: str, opts: dict[str, str], model_path: Path | None
) -> Trace:
    """The candidate's trace over the pin: free run with top-k logprobs, forced where it diverged."""
    from gate.cli.run import ProgressBar, _progress_bar
    from gate.engines.registry import load_engine
    from gate.workflows.calibrate import candidate_trace

    weights = str(model_path) if model_path is not None else pin.model
    with _progress_bar() as bar:
        return candidate_trace(
            pin, lambda: load_engine(engine_name, weights, opts), engine_name, progress=ProgressBar(bar)
        )


def calibrate_command(
    *,
    oracle: Path | None,
    candidate: Path | None,
    model: str | None,
    engine: str | None,
    engine_opts: list[str] | None,
    model_path: Path | None,
    pins_dir: Path | None,
    dtype: str | None,
    fmt: str,
    output: Path | None,
    save_trace: Path | None,
    force: bool,
) -> int:
    from gate.cli.common import parse_engine_opts
    from gate.core.calibrate import calibrate
    from gate.core.trace import read_trace, write_trace
    from gate.errors import InputError
    from gate.reports.calibrate import calibration_renderable, render_calibration_json, render_calibration_text

    fmt = _check_format(fmt)
    opts = parse_engine_opts(engine_opts)
    _refuse_clobber(output, force, (save_trace, "--save-trace"))
    if (oracle is None) != (candidate is None):
        raise InputError("gate calibrate takes two trace files (ORACLE CANDIDATE) or none (run the engine on the pin)")
    if oracle is not None and candidate is not None:
        given = [f for f, v in (("--engine", engine), ("--engine-opt", opts), ("--model-path", model_path),
                                ("--save-trace", save_trace), ("--model", model)) if v]
        if given:
            raise InputError(f"two trace files are calibrated as they are: {', '.join(given)} cannot go with them")
        o = read_trace(oracle, role="oracle")
        c = read_trace(candidate, role="candidate")
    else:
        pin = _load_pin(model, pins_dir)
        o = pin.trace
        c = run_candidate_for_calibration(pin, engine or "hf", opts, model_path)
        if save_trace is not None:
            write_trace(save_trace, c, overwrite=force)
            print(f"candidate trace written to {save_trace}", file=sys.stderr)
    cal = calibrate(o, c, dtype=dtype)
    _emit(render_calibration_json(cal), calibration_renderable(cal), render_calibration_text(cal), fmt, output, force)
    if fmt == "json" or output is not None:
        print(f"recommended doctrine: {cal.recommendation.flags}", file=sys.stderr)
    return 0


# --------------------------------------------------------------------------- selftest


def selftest_command(
    *,
    model: str | None,
    model_path: Path | None,
    pins_dir: Path | None,
    engine_opts: list[str] | None,
    only: list[str] | None,
    near_tie_mnats: float | None,
    near_tie_ulps: float | None,
    fmt: str,
    output: Path | None,
    force: bool,
) -> int:
    from gate.cli.common import parse_engine_opts, stderr_console
    from gate.cli.run import ProgressBar, _progress_bar
    from gate.core.doctrine import DEFAULT_NEAR_TIE_MNATS, Doctrine
    from gate.core.selftest import SELFTEST_NEAR_TIE_ULPS
    from gate.engines.mutants import baseline_loader, mutations
    from gate.reports.selftest import render_selftest_json, render_selftest_text, selftest_renderable
    from gate.workflows.selftest import run_selftest

    fmt = _check_format(fmt)
    _refuse_clobber(output, force)
    opts = parse_engine_opts(engine_opts)
    doctrine = Doctrine(
        near_tie_mnats=DEFAULT_NEAR_TIE_MNATS if near_tie_mnats is None else near_tie_mnats,
        near_tie_ulps=SELFTEST_NEAR_TIE_ULPS if near_tie_ulps is None else near_tie_ulps,
    )
    pin = _load_pin(model, pins_dir)
    weights = str(model_path) if model_path is not None else pin.model
    chosen = mutations(weights, opts, only=only)
    err = stderr_console()
    with _progress_bar() as bar:
        result = run_selftest(
            pin,
            baseline_loader(weights, opts),
            chosen,
            doctrine,
            progress=ProgressBar(bar),
            on_mutant=lambda name: err.print(f"selftest: running {name}"),
        )
    _emit(render_selftest_json(result), selftest_renderable(result), render_selftest_text(result), fmt, output, force)
    if fmt == "json" or output is not None:
        print(result.summary, file=sys.stderr)
    return result.exit_code


# --------------------------------------------------------------------------- registration


def register(app: typer.Typer) -> None:
    @app.command("calibrate")
    def calibrate_cmd(
        oracle: Annotated[Path | None, typer.Argument(help="Oracle trace (omit both files to run the engine).")] = None,
        candidate: Annotated[Path | None, typer.Argument(help="Candidate trace with top_logprobs.")] = None,
        model: Annotated[
            str | None,
            typer.Option("--model", "-m", help="Model whose pin to run against (default: the embedded default)."),
        ] = None,
        engine: Annotated[str | None, typer.Option("--engine", "-e", help="Candidate engine (default: hf).")] = None,
        engine_opt: Annotated[
            list[str] | None, typer.Option("--engine-opt", help="Engine option key=value (repeatable).")
        ] = None,
        model_path: Annotated[
            Path | None, typer.Option("--model-path", help="Load the candidate's weights from this folder.")
        ] = None,
        pins_dir: Annotated[Path | None, typer.Option("--pins-dir", help="Folder of pins.")] = None,
        dtype: Annotated[
            str | None,
            typer.Option("--dtype", help="Grid of the figures in steps (default: the oracle's dtype, else bfloat16)."),
        ] = None,
        fmt: Annotated[str, typer.Option("--format", help="rich or json.")] = "rich",
        output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the report to this file.")] = None,
        save_trace: Annotated[
            Path | None, typer.Option("--save-trace", help="Save the candidate's trace (engine mode).")
        ] = None,
        force: Annotated[bool, typer.Option("--force", help="Replace --output and --save-trace.")] = False,
    ) -> None:
        """Measure the drift between a candidate and the oracle and recommend a near-tie doctrine."""
        raise typer.Exit(
            calibrate_command(
                oracle=oracle,
                candidate=candidate,
                model=model,
                engine=engine,
                engine_opts=engine_opt,
                model_path=model_path,
                pins_dir=pins_dir,
                dtype=dtype,
                fmt=fmt,
                output=output,
                save_trace=save_trace,
                force=force,
            )
        )

    @app.command("selftest")
    def selftest_cmd(
        model: Annotated[
            str | None,
            typer.Option("--model", "-m", help="Model whose pin to test on (default: the embedded default)."),
        ] = None,
        model_path: Annotated[
            Path | None, typer.Option("--model-path", help="Load the weights from this folder.")
        ] = None,
        pins_dir: Annotated[Path | None, typer.Option("--pins-dir", help="Folder of pins.")] = None,
        engine_opt: Annotated[
            list[str] | None, typer.Option("--engine-opt", help="HF engine option key=value (repeatable).")
        ] = None,
        only: Annotated[
            list[str] | None, typer.Option("--only", help="Run only this mutant (repeatable).")
        ] = None,
        near_tie_mnats: Annotated[
            float | None, typer.Option("--near-tie-mnats", help="Near-tie threshold in millinats (default: 125).")
        ] = None,
        near_tie_ulps: Annotated[
            float | None, typer.Option("--near-tie-ulps", help="Near-tie allowance in grid steps (default: 1).")
        ] = None,
        fmt: Annotated[str, typer.Option("--format", help="rich or json.")] = "rich",
        output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the report to this file.")] = None,
        force: Annotated[bool, typer.Option("--force", help="Replace --output if it exists.")] = False,
    ) -> None:
        """Inject faults into the HF engine and check the gate catches each (exit 0 all caught, 1 not)."""
        raise typer.Exit(
            selftest_command(
                model=model,
                model_path=model_path,
                pins_dir=pins_dir,
                engine_opts=engine_opt,
                only=only,
                near_tie_mnats=near_tie_mnats,
                near_tie_ulps=near_tie_ulps,
                fmt=fmt,
                output=output,
                force=force,
            )
        )
