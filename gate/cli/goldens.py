"""`gate goldens record` and `gate goldens check`: an engine's own greedy outputs, kept in
goldens/<org>/<model>/<engine>.jsonl, and the proof that a change to the engine is inert
(or the list of every golden it moves, each with its cause).

The work is `gate.workflows.goldens` (files and judging: `gate.core.goldens.golden`); the reports
are `gate.reports.goldens`. This module parses options and hands the report to the output sink.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gate.cli import options
from gate.text import plural


def _engine_line(info_engine: dict[str, object] | None, opts: dict[str, str]) -> str:
    given = ", ".join(f"{k}={v}" for k, v in opts.items()) or "default options"
    if not info_engine:
        return given
    return f"engine {info_engine.get('name')} {info_engine.get('version')}, {given}"


def record_goldens(
    *,
    model: str | None,
    engine: str | None,
    engine_opts: list[str] | None,
    model_path: Path | None,
    pins_dir: Path | None,
    goldens_dir: Path | None,
    golden: Path | None,
    force: bool,
) -> int:
    from gate.cli.common import ProgressBar, default_model, load_engine_for, parse_engine_opts, progress_bar
    from gate.cli.output import pin_inputs, refuse_overwrite, say
    from gate.core.goldens.golden import DEFAULT_ENGINE, check_golden_against_pin, encode_golden, path_for_writing
    from gate.core.goldens.moves import find_moves, goldens_summary
    from gate.core.pins.pin import doctrine_for, load_pin
    from gate.core.storage.atomic import GOLDEN, atomic_write
    from gate.core.traces.trace import read_trace
    from gate.errors import InputError
    from gate.workflows.engine_calls import open_engine
    from gate.workflows.goldens import record_golden

    opts = parse_engine_opts(engine_opts)
    engine_name = engine or DEFAULT_ENGINE
    pin = load_pin(model or default_model(), pins_dir)
    path = golden if golden is not None else path_for_writing(pin.model, engine_name, goldens_dir)
    # Refused before the model loads (minutes on a large one).
    if path.is_dir():
        raise InputError(f"{path}: is a directory")
    refuse_overwrite(
        force,
        (path, "", GOLDEN),
        inputs=pin_inputs(pin.model, pins_dir),
        message="{path}: a golden exists; pass --force (or --accept) to re-record it "
        "(the old one is kept as a backup, and what moved is shown)",
    )
    old = None
    if path.exists():
        try:
            old = read_trace(path, role="candidate")
        except InputError as exc:
            say(f"gate: the old golden cannot be read ({exc}); it is replaced all the same")

    say(f"recording the {engine_name} golden for {pin.model}: {plural(len(pin.trace.records), 'prompt')}")
    load = load_engine_for(engine_name, pin, opts, model_path)
    with open_engine(load, engine_name) as eng, progress_bar() as bar:
        trace = record_golden(eng, pin, options=opts, path=str(path), progress=ProgressBar(bar))

    if old is not None:
        try:
            check_golden_against_pin(old, pin)
            from gate.core.goldens.moves import GoldensResult

            # The moves are judged as `gate goldens check` judges them: by the pin's doctrine.
            moves = find_moves(old, trace, pin.trace, doctrine_for(pin))
            result = GoldensResult(
                model=pin.model,
                engine=engine_name,
                golden_path=str(path),
                prompts=len(trace.records),
                positions=sum(len(r.token_ids) for r in old.records),
                moves=moves,
                doctrine=doctrine_for(pin),
            )
            say(f"against the old golden: {goldens_summary(result)}")
            say(*(f"  {m.prompt_id} @ {m.position}: {m.label}: {m.reason}" for m in moves))
        except InputError as exc:
            say(f"the old golden was for other prompts ({exc})")

    kept = atomic_write(path, encode_golden(trace), overwrite=force, backup=path.exists())
    if kept is not None:
        say(f"kept the old golden as {kept}")
    positions = sum(len(r.token_ids) for r in trace.records)
    say(
        f"golden written to {path}: {plural(len(trace.records), 'prompt')}, {plural(positions, 'position')} "
        f"({_engine_line(dict(trace.header.engine), opts)})"
    )
    return 0


def check_goldens(
    *,
    model: str | None,
    engine: str | None,
    engine_opts: list[str] | None,
    model_path: Path | None,
    pins_dir: Path | None,
    goldens_dir: Path | None,
    golden: Path | None,
    fmt: str,
    accept: bool,
    near_tie_mnats: float | None,
    near_tie_ulps: float | None,
    output: Path | None = None,
    force: bool = False,
    no_evidence: bool = False,
) -> int:
    from dataclasses import replace

    from gate.cli.common import (
        ProgressBar,
        default_model,
        doctrine_overrides,
        load_engine_for,
        parse_engine_opts,
        progress_bar,
    )
    from gate.cli.output import emit, pin_inputs, refuse_overwrite
    from gate.core.goldens.golden import (
        DEFAULT_ENGINE,
        accepted_golden,
        check_golden_against_pin,
        encode_golden,
        find_golden,
    )
    from gate.core.pins.pin import doctrine_for, load_pin
    from gate.core.storage.atomic import atomic_write
    from gate.core.storage.files import display_path
    from gate.core.traces.trace import read_trace
    from gate.errors import GateError
    from gate.reports import check_format
    from gate.workflows.engine_calls import open_engine
    from gate.workflows.goldens import check_golden

    fmt = check_format("GoldensResult", fmt)
    refuse_overwrite(force, (output, "--output"), inputs=(golden, *pin_inputs(model or default_model(), pins_dir)))
    opts = parse_engine_opts(engine_opts)
    engine_name = engine or DEFAULT_ENGINE
    if golden is not None:
        path = golden
        old = read_trace(path, role="candidate")
        model = model or old.header.model
    else:
        model = model or default_model()
        path = find_golden(model, engine_name, goldens_dir, pins_dir=pins_dir)
        old = read_trace(path, role="candidate")
    old = replace(old, path=display_path(path))
    pin = load_pin(model, pins_dir)
    check_golden_against_pin(old, pin)  # before the model loads
    # The pin's own doctrine (it travels with the pin trace) unless flags override it.
    doctrine = doctrine_for(pin, doctrine_overrides(near_tie_mnats, near_tie_ulps, no_evidence))

    load = load_engine_for(engine_name, pin, opts, model_path)
    with open_engine(load, engine_name) as eng, progress_bar() as bar:
        result, fresh = check_golden(eng, pin, old, doctrine, options=opts, progress=ProgressBar(bar))

    if accept and result.moves:
        new = accepted_golden(old, fresh, result.moves)
        try:
            kept = atomic_write(path, encode_golden(new), overwrite=True, backup=True)
        except GateError:
            emit(result, fmt, output, force=force, engine_ran=True)
            raise
        result = replace(result, accepted=display_path(path), backup=display_path(kept) if kept else None)
    emit(result, fmt, output, force=force, engine_ran=True)
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
    goldens_app = typer.Typer(
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
        force = force or accept
        raise typer.Exit(
            record_goldens(
                model=model,
                engine=engine,
                engine_opts=engine_opt,
                model_path=model_path,
                pins_dir=pins_dir,
                goldens_dir=goldens_dir,
                golden=golden,
                force=force,
            )
        )

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
        force: Annotated[
            bool, typer.Option("--force", help="Replace --output if it exists.", rich_help_panel=options.OUTPUT_PANEL)
        ] = False,
    ) -> None:
        """Re-run the engine and list every golden that moved, with its cause.

        Each move's cause is judged against the oracle pin: "was recording a tie-break", "near-tie
        flip" or "real change"."""
        raise typer.Exit(
            check_goldens(
                model=model,
                engine=engine,
                engine_opts=engine_opt,
                model_path=model_path,
                pins_dir=pins_dir,
                goldens_dir=goldens_dir,
                golden=golden,
                fmt=fmt.value,
                accept=accept,
                near_tie_mnats=near_tie_mnats,
                near_tie_ulps=near_tie_ulps,
                no_evidence=no_evidence,
                output=output,
                force=force,
            )
        )

    app.add_typer(goldens_app)
