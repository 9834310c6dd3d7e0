"""`gate calibrate` and `gate selftest`: the doctrine from data, and the gate tested by mutation.

`gate calibrate ORACLE CANDIDATE` measures drift from two trace files (no model, no torch);
without files it runs the candidate engine over the model's pin first. `gate selftest`
runs the HF engine with injected faults over the pin and reports what the gate made of
each (exit 0 when every fault was caught and classified as expected, 1 otherwise).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gate.cli import options

if TYPE_CHECKING:
    from gate.core.pins.pin import Pin
    from gate.core.traces.trace import Trace


def _load_pin(model: str | None, pins_dir: Path | None) -> Pin:
    from gate.core.pins.pin import load_pin
    from gate.models.default import DEFAULT_MODEL

    return load_pin(model or DEFAULT_MODEL, pins_dir)


# --------------------------------------------------------------------------- calibrate


def run_candidate_for_calibration(pin: Pin, engine_name: str, opts: dict[str, str], model_path: Path | None) -> Trace:
    """The candidate's trace over the pin: free run with top-k logprobs, forced where it diverged."""
    from gate.cli.common import ProgressBar, load_engine_for, progress_bar
    from gate.workflows.calibrate import candidate_trace

    with progress_bar() as bar:
        return candidate_trace(
            pin, load_engine_for(engine_name, pin, opts, model_path), engine_name, progress=ProgressBar(bar)
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
    from gate.cli.common import default_model, parse_engine_opts
    from gate.cli.output import emit, pin_inputs, refuse_overwrite, say
    from gate.core.calibration.calibrate import calibrate
    from gate.core.pins.pin import pin_own_doctrine
    from gate.core.storage.atomic import TRACE
    from gate.core.traces.trace import read_trace, write_trace
    from gate.core.verdict.doctrine import header_doctrine, resolve_doctrine
    from gate.errors import InputError
    from gate.reports import check_format

    fmt = check_format("Calibration", fmt)
    opts = parse_engine_opts(engine_opts)
    pinned = pin_inputs(model or default_model(), pins_dir) if oracle is None else ()
    refuse_overwrite(
        force, (output, "--output"), (save_trace, "--save-trace", TRACE), inputs=(oracle, candidate, *pinned)
    )
    if (oracle is None) != (candidate is None):
        raise InputError("gate calibrate takes two trace files (ORACLE CANDIDATE) or none (run the engine on the pin)")
    if oracle is not None and candidate is not None:
        given = [
            f
            for f, v in (
                ("--engine", engine),
                ("--engine-opt", opts),
                ("--model-path", model_path),
                ("--save-trace", save_trace),
                ("--model", model),
            )
            if v
        ]
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
            say(f"candidate trace written to {save_trace}")
    if oracle is not None:
        where = str(oracle)
        own = header_doctrine(o.header.extra, where)
    else:
        own, where = pin_own_doctrine(pin)
    pin_doctrine = resolve_doctrine(own, source=f"the pin's ({where})") if own is not None else None
    cal = calibrate(o, c, dtype=dtype, pin_doctrine=pin_doctrine)
    emit(cal, fmt, output, force=force, engine_ran=oracle is None)
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
    no_evidence: bool = False,
) -> int:
    from gate.cli.common import ProgressBar, default_model, doctrine_overrides, parse_engine_opts, progress_bar
    from gate.cli.output import emit, pin_inputs, refuse_overwrite, say
    from gate.core.calibration.selftest import SELFTEST_NEAR_TIE_ULPS
    from gate.core.pins.pin import doctrine_for
    from gate.reports import check_format
    from gate.workflows.mutants import baseline_loader, mutations
    from gate.workflows.selftest import run_selftest

    fmt = check_format("SelfTestResult", fmt)
    refuse_overwrite(force, (output, "--output"), inputs=pin_inputs(model or default_model(), pins_dir))
    opts = parse_engine_opts(engine_opts)
    pin = _load_pin(model, pins_dir)
    # The pin's own doctrine, as `gate run` applies it, with the flags' fields changed: the
    # self-test checks that verdict. A pin without one is judged with one grid step besides
    # the default mnats (`SELFTEST_NEAR_TIE_ULPS`: the one-step fault must come out ratified).
    doctrine = doctrine_for(
        pin,
        doctrine_overrides(near_tie_mnats, near_tie_ulps, no_evidence),
        defaults={"near_tie_ulps": SELFTEST_NEAR_TIE_ULPS},
    )
    weights = str(model_path) if model_path is not None else pin.model
    chosen = mutations(weights, opts, only=only)
    with progress_bar() as bar:
        result = run_selftest(
            pin,
            baseline_loader(weights, opts),
            chosen,
            doctrine,
            progress=ProgressBar(bar),
            on_mutant=lambda name: say(f"selftest: running {name}"),
        )
    emit(result, fmt, output, force=force, engine_ran=True)
    return result.exit_code


# --------------------------------------------------------------------------- registration


def register(app: typer.Typer) -> None:
    @app.command("calibrate", epilog=options.EXIT_CODES_WRITE)
    def calibrate_cmd(
        oracle: Annotated[Path | None, typer.Argument(help="Oracle trace (omit both files to run the engine).")] = None,
        candidate: Annotated[Path | None, typer.Argument(help="Candidate trace with top_logprobs.")] = None,
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
                fmt=fmt.value,
                output=output,
                save_trace=save_trace,
                force=force,
            )
        )

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
        raise typer.Exit(
            selftest_command(
                model=model,
                model_path=model_path,
                pins_dir=pins_dir,
                engine_opts=engine_opt,
                only=only,
                near_tie_mnats=near_tie_mnats,
                near_tie_ulps=near_tie_ulps,
                no_evidence=no_evidence,
                fmt=fmt.value,
                output=output,
                force=force,
            )
        )
