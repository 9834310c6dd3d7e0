"""`gate run`: gate a candidate engine (or a trace it wrote) against the pinned oracle;
`gate export-prompts`: the pinned prompt token ids, for an engine that writes its own trace.

The work happens in `gate.workflows.run`; this module parses options, draws the progress
bar on stderr and prints the report.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gate.cli import options
from gate.text import plural

if TYPE_CHECKING:
    from gate.core.pins.pin import Pin
    from gate.core.verdict.doctrine import Doctrine
    from gate.workflows.run import RunOutcome, RunPlan, Timings


def run_gate(
    *,
    model: str | None,
    engine: str | None,
    engine_opts: list[str] | None,
    model_path: Path | None,
    near_tie_mnats: float | None,
    near_tie_ulps: float | None,
    strict: bool,
    fmt: str,
    output: Path | None,
    save_trace: Path | None,
    candidate_trace: Path | None,
    pins_dir: Path | None,
    force: bool,
    timings: bool,
    shard: str | None = None,
    resume: bool = False,
    progress_file: Path | None = None,
    timeout: float | None = None,
    repeat: int = 1,
    no_evidence: bool = False,
    details: bool = False,
) -> int:
    from gate.cli.common import default_model, doctrine_overrides, parse_engine_opts
    from gate.cli.output import emit, pin_inputs, refuse_overwrite, say
    from gate.core.pins.pin import doctrine_for, load_pin
    from gate.core.storage.atomic import TRACE
    from gate.core.traces.trace import read_trace, write_trace
    from gate.core.verdict.doctrine import apply_overrides
    from gate.errors import InputError
    from gate.reports import check_format
    from gate.workflows.run import Timings, gate_trace_against_pin

    fmt = check_format("GateResult", fmt)
    opts = parse_engine_opts(engine_opts)
    flags = doctrine_overrides(near_tie_mnats, near_tie_ulps, no_evidence)
    # A bad threshold fails before any work.
    apply_overrides({}, {k: v for k, v in flags.items() if v is not None})
    # Refuse to clobber before spending minutes on a model.
    refuse_overwrite(
        force,
        (save_trace, "--save-trace", TRACE),
        (output, "--output"),
        inputs=(candidate_trace, progress_file, *pin_inputs(model or default_model(), pins_dir)),
    )

    if candidate_trace is not None:
        given = [
            flag
            for flag, v in (
                ("--engine", engine),
                ("--engine-opt", opts),
                ("--model-path", model_path),
                ("--save-trace", save_trace),
                ("--shard", shard),
                ("--resume", resume),
                ("--progress-file", progress_file),
                ("--timeout", timeout),
                ("--repeat", repeat != 1),
            )
            if v
        ]
        if given:
            raise InputError(f"--candidate-trace adjudicates a trace as it is: {', '.join(given)} cannot go with it")
        cand = read_trace(candidate_trace, role="candidate")
        # The pin is the one asked for (--model, else the default model), never the one the
        # trace names: a trace for another model is refused (exit 2) by the provenance check.
        pin = load_pin(model or default_model(), pins_dir)
        outcome = gate_trace_against_pin(pin, cand, doctrine_for(pin, flags, strict=strict))
    else:
        pin = load_pin(model or default_model(), pins_dir)
        doctrine = doctrine_for(pin, flags, strict=strict)
        plan = _run_plan(pin, engine or "hf", opts, shard, resume, progress_file, save_trace, timeout, repeat)
        outcome = _run_engine(pin, engine or "hf", opts, model_path, doctrine, Timings(), plan, fmt)
        if save_trace is not None:
            write_trace(save_trace, outcome.candidate, overwrite=force)
            say(f"candidate trace written to {save_trace}")
    emit(outcome.result, fmt, output, force=force, engine_ran=candidate_trace is None, details=details)
    if candidate_trace is None:
        from gate.cli.diagnose import diagnose_hint

        hint = diagnose_hint(
            outcome.result,
            model=pin.model,
            engine=engine or "hf",
            engine_opts=engine_opts,
            model_path=model_path,
            pins_dir=pins_dir,
        )
        if hint:
            say(hint)
    if timings:
        say(outcome.timings.line())
    return outcome.result.exit_code


def _run_plan(
    pin: Pin,
    engine_name: str,
    opts: dict[str, str],
    shard: str | None,
    resume: bool,
    progress_file: Path | None,
    save_trace: Path | None,
    timeout: float | None,
    repeat: int,
) -> RunPlan:
    """The options of a long run, checked before the engine loads."""
    from gate.cli.output import say
    from gate.core.traces.shards import parse_shard
    from gate.errors import InputError
    from gate.workflows.progress import PROGRESS_SUFFIX, check_progress_target, default_progress_path
    from gate.workflows.run import RunPlan

    kn = parse_shard(shard) if shard is not None else None
    if timeout is not None and not timeout > 0:
        raise InputError(f"--timeout {timeout}: must be a positive number of seconds")
    if repeat < 1:
        raise InputError(f"--repeat {repeat}: must be at least 1")
    optional = progress_file is None and save_trace is None and not resume
    if progress_file is None:
        if save_trace is not None:
            progress_file = save_trace.with_name(save_trace.name + PROGRESS_SUFFIX)
        else:
            progress_file = default_progress_path(pin.model, engine_name, kn)
    if not resume and progress_file.exists():
        # Before the engine loads: only a progress file of this model's runs is ever replaced.
        check_progress_target(progress_file, pin.model)
        say(f"replacing the progress file of an earlier run, {progress_file} (--resume continues one)")
    return RunPlan(
        engine_options=opts,
        shard=kn,
        progress_path=progress_file,
        resume=resume,
        timeout=timeout,
        repeat=repeat,
        progress_optional=optional,
    )


def _run_engine(
    pin: Pin,
    engine_name: str,
    opts: dict[str, str],
    model_path: Path | None,
    doctrine: Doctrine,
    timings: Timings,
    plan: RunPlan | None = None,
    fmt: str = "rich",
) -> RunOutcome:
    from gate.cli.common import ProgressBar, load_engine_for, progress_bar
    from gate.cli.output import emit, say
    from gate.workflows.engine_calls import open_engine
    from gate.workflows.run import RunInterrupted, RunPlan, gate_run

    start = time.perf_counter()
    notes: list[str] = []
    try:
        with open_engine(load_engine_for(engine_name, pin, opts, model_path), engine_name) as engine:
            timings.load_s = time.perf_counter() - start
            with progress_bar() as bar:
                return gate_run(
                    engine, pin, doctrine, plan or RunPlan(), progress=ProgressBar(bar), timings=timings, notes=notes
                )
    except RunInterrupted as exc:
        # Ctrl-C: the report of the prompts done so far, then exit 130 (gate.cli.main).
        emit(exc.outcome.result, fmt, None, engine_ran=True)
        raise
    finally:
        say(*notes)


def export_prompts(*, model: str | None, output: Path | None, pins_dir: Path | None, force: bool) -> int:
    import orjson

    from gate.cli.common import default_model
    from gate.cli.output import pin_inputs, refuse_overwrite, say, to_stdout, write_data
    from gate.core.pins.pin import load_pin
    from gate.core.storage.atomic import SUITE
    from gate.workflows.run import prompt_inputs

    # A list of prompts: never over the pin it reads, nor over any file of another kind.
    refuse_overwrite(force, (output, "--output", SUITE), inputs=pin_inputs(model or default_model(), pins_dir))
    pin = load_pin(model or default_model(), pins_dir)
    lines = b"".join(
        orjson.dumps(
            {"id": p.id, "prompt_token_ids": list(p.prompt_token_ids), "max_tokens": p.max_tokens, "prompt": p.prompt},
            option=orjson.OPT_APPEND_NEWLINE,
        )
        for p in prompt_inputs(pin)
    )
    header = orjson.dumps(
        {
            "gate_trace": 1,
            "role": "candidate",
            "model": pin.model,
            "top_k": 0,
            "engine": {"name": "NAME", "version": "V"},
        }
    ).decode()
    write_data(lines, output, force=force)
    if not to_stdout(output):
        say(f"{plural(len(pin.trace.records), 'prompt')} of {pin.folder.pin_path} written to {output}")
    say(
        "run each prompt greedily from its prompt_token_ids for max_tokens tokens and write a candidate trace: "
        f"a header line such as {header}, then one record per prompt with id, prompt_token_ids and token_ids "
        "(top_logprobs optional); gate it with: gate run --candidate-trace TRACE"
        + (f" --model {pin.model}" if model is not None else "")
    )
    return 0


# `gate run`'s options in panels: the engine and the pin (typer's default panel), the
# doctrine (`options.DOCTRINE_PANEL`), the output, and how the run is carried out.
RUN_PANEL = "Running (shards, resume, timeouts, repeats)"


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
        candidate_trace: Annotated[
            Path | None,
            typer.Option(
                "--candidate-trace",
                help="Adjudicate this candidate trace (written by any engine) instead of running one.",
            ),
        ] = None,
        pins_dir: options.PinsDir = None,
        force: options.ForceOutputs = False,
        timings: Annotated[
            bool,
            typer.Option("--timings", help="Print the wall time of each stage on stderr.", rich_help_panel="Output"),
        ] = False,
        shard: Annotated[
            str | None,
            typer.Option(
                "--shard",
                help="Run only the K-th of N disjoint slices of the suite (K/N, by prompt id); combine the shard "
                "traces with `gate merge`.",
                rich_help_panel=RUN_PANEL,
            ),
        ] = None,
        resume: Annotated[
            bool,
            typer.Option(
                "--resume",
                help="Continue an interrupted run from its progress file (same model, engine, options).",
                rich_help_panel=RUN_PANEL,
            ),
        ] = False,
        progress_file: Annotated[
            Path | None,
            typer.Option(
                "--progress-file",
                help="Where finished prompts are appended as the run goes \\[default: SAVE_TRACE.partial.jsonl, "
                "else .gate/runs/MODEL/ENGINE.partial.jsonl].",
                rich_help_panel=RUN_PANEL,
            ),
        ] = None,
        timeout: Annotated[
            float | None,
            typer.Option(
                "--timeout",
                help="Seconds each engine call (one generate batch, one prompt unless the engine batches; "
                "or one forced decode) may take before the run fails with exit 3.",
                rich_help_panel=RUN_PANEL,
            ),
        ] = None,
        repeat: Annotated[
            int,
            typer.Option(
                "--repeat",
                help="Run the candidate N times; any token or logprob that changes between repeats is exit 3 "
                "(a nondeterministic engine cannot be gated token-exactly).",
                rich_help_panel=RUN_PANEL,
            ),
        ] = 1,
    ) -> None:
        """Gate a candidate engine against the pinned vLLM oracle."""
        code = run_gate(
            model=model,
            engine=engine,
            engine_opts=engine_opt,
            model_path=model_path,
            near_tie_mnats=near_tie_mnats,
            near_tie_ulps=near_tie_ulps,
            no_evidence=no_evidence,
            strict=strict,
            fmt=fmt.value,
            output=output,
            save_trace=save_trace,
            candidate_trace=candidate_trace,
            pins_dir=pins_dir,
            force=force,
            timings=timings,
            shard=shard,
            resume=resume,
            progress_file=progress_file,
            timeout=timeout,
            repeat=repeat,
            details=details,
        )
        raise typer.Exit(code)

    @app.command("export-prompts", epilog=options.EXIT_CODES_FILES)
    def export_prompts_cmd(
        model: options.Model = None,
        output: options.Output = None,
        pins_dir: options.PinsDir = None,
        force: options.Force = False,
    ) -> None:
        """Write the pinned prompts (id, prompt_token_ids, max_tokens) as JSON Lines, for an engine that
        writes its own trace; gate that trace with `gate run --candidate-trace`."""
        raise typer.Exit(export_prompts(model=model, output=output, pins_dir=pins_dir, force=force))
