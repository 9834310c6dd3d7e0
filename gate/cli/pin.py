"""`gate pin record`: run the vLLM oracle over a prompt suite and write the pin;
`gate pin show`: a pin's provenance and its exact top-2 ties.

The recording itself is `gate.workflows.pin_record.record_oracle`; the folder's files are written by
`gate.core.pins.pin.write_pin`. This module parses options and prints.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gate.cli import options
from gate.text import plural

if TYPE_CHECKING:
    from collections.abc import Callable

    from gate.core.pins.oracle_settings import OracleSettings
    from gate.core.pins.suite import Suite
    from gate.core.traces.trace import Trace
    from gate.workflows.floor import HonestRerun


def record_pin(
    *,
    model: str,
    prompts: Path | None,
    max_tokens: int | None,
    top_k: int | None,
    engine_opts: list[str] | None,
    model_path: Path | None,
    pins_dir: Path | None,
    force: bool,
    measure_floor: bool = True,
) -> int:
    from gate.cli.common import parse_engine_opts
    from gate.cli.output import refuse_overwrite, say
    from gate.core.pins.diff import diff_pins, exact_top2_ties, rerecord_lines
    from gate.core.pins.oracle_settings import read_settings
    from gate.core.pins.pin import SUITE_FILE, folder_for_writing, write_pin
    from gate.core.pins.suite import read_suite
    from gate.core.storage.atomic import PIN
    from gate.core.traces.trace import read_trace
    from gate.core.verdict.doctrine import header_doctrine, resolve_doctrine
    from gate.engines.registry import load_engine
    from gate.errors import InputError, PinError
    from gate.workflows.engine_calls import open_engine
    from gate.workflows.floor import oracle_rerun
    from gate.workflows.pin_record import record_oracle

    folder = folder_for_writing(model, pins_dir)
    # Everything that can be refused is refused before the oracle loads (minutes on a GPU).
    refuse_overwrite(
        force,
        (folder.pin_path, "", PIN),
        inputs=(prompts,),
        message="{path} exists; pass --force to re-record it "
        "(the old pin is kept as a backup, and what moved is shown)",
        error=PinError,
    )
    old = read_trace(folder.pin_path, role="oracle") if folder.pin_path.exists() else None
    settings = read_settings(folder.settings_path).with_overrides(
        max_tokens=max_tokens, top_k=top_k, engine_opts=parse_engine_opts(engine_opts)
    )
    if settings.model is not None and settings.model != model:
        raise InputError(f"{folder.settings_path}: field 'model': {settings.model!r}, but --model is {model!r}")
    if settings.model is None:
        from dataclasses import replace

        settings = replace(settings, model=model)
    source = prompts if prompts is not None else folder.suite_path
    if prompts is None and not source.exists():
        raise InputError(f"no prompt suite: {folder.path} has no {SUITE_FILE}; pass --prompts FILE")
    # --max-tokens overrides every prompt; else a prompt's own, else oracle.json's.
    suite = read_suite(source).resolved(settings.max_tokens, override=max_tokens)

    source_model = str(model_path) if model_path is not None else model
    say(
        f"recording the {settings.engine} oracle for {model}: {plural(len(suite), 'prompt')}, "
        f"top-{settings.top_k} logprobs"
    )
    load = lambda: load_engine(settings.engine, source_model, settings.engine_kwargs())  # noqa: E731
    with open_engine(load, settings.engine) as engine:
        trace = record_oracle(
            engine,
            model=model,
            suite=suite,
            settings=settings,
            pin_path=str(folder.pin_path),
            model_source=source_model,
        )
        measuring = measure_floor and settings.doctrine.get("floor") is None
        reruns = [oracle_rerun(engine, trace, suite)] if measuring else []
    if measuring:
        trace, settings = _with_measured_floor(trace, settings, suite, reruns, source_model, say)
    elif settings.doctrine.get("floor") is not None:
        say("honest floor: kept the one oracle.json's doctrine carries (doctrine.floor)")
    else:
        say("honest floor: not measured (--no-floor); the pin is judged without the distribution verdict")
    if old is not None:
        say(*diff_pins(old, trace).lines())
        own = header_doctrine(old.header.extra, str(folder.pin_path)) or dict(settings.doctrine)
        say(*rerecord_lines(old, trace, resolve_doctrine(own)))
    done = write_pin(folder, suite, settings, trace, force=force)
    for kept in done.backups:
        say(f"kept the old {kept.name.split('.bak-')[0]} as {kept}")
    ties = exact_top2_ties(trace)
    positions = sum(len(r.token_ids) for r in trace.records)
    say(
        f"pin written to {folder.pin_path}: {plural(len(trace.records), 'prompt')}, {plural(positions, 'position')}; "
        f"{plural(len(ties), 'position')} where the oracle's top two logprobs are exactly equal"
    )
    return 0


def _with_measured_floor(
    trace: Trace,
    settings: OracleSettings,
    suite: Suite,
    reruns: list[HonestRerun],
    model: str,
    say: Callable[..., None],
) -> tuple[Trace, OracleSettings]:
    """The pin trace and settings with the floor the honest re-runs measure (the oracle one
    prompt at a time, already run; the HF engine on the same device, where it loads)."""
    from dataclasses import replace

    from gate.core.traces.machine import machine_key, machine_of
    from gate.engines.registry import load_engine
    from gate.errors import GateError
    from gate.workflows.floor import engine_rerun, floor_from, with_floor

    device = str(trace.header.extra.get("device") or "cpu")
    if settings.engine == "vllm":  # the HF engine: another implementation of vLLM's model
        name = f"hf on {device} vs {settings.engine}"
        say(f"measuring the honest floor: {name}")
        try:
            load = lambda: load_engine("hf", model, {"device": device, "dtype": settings.dtype})  # noqa: E731
            reruns.append(engine_rerun(load, trace, suite, name=name))
        except GateError as exc:
            say(f"honest floor: the HF engine could not run this model here ({exc}); measured without it")
    where = machine_key(machine_of(trace.header.engine, trace.header.extra))
    floor = floor_from(reruns, where=where)
    for r in reruns:
        say(f"  {r.line()}")
    if floor is None:
        say("honest floor: none measured (too few positions, or the re-runs equal the pin bit for bit)")
        return trace, settings
    trace, own = with_floor(trace, settings.doctrine, floor)
    say(
        f"honest floor: mean KL {floor.kl_mean_mnats:.3f} mnats, p99 KL {floor.kl_p99_mnats:.3f} mnats, same top "
        f"{100 * floor.same_top_rate:.2f}%, margin {floor.margin:g}: written to the pin's doctrine (doctrine.floor)"
    )
    return trace, replace(settings, doctrine=own)


def show_pin(*, model: str | None, pins_dir: Path | None) -> int:
    import orjson

    from gate.cli.common import default_model
    from gate.cli.output import write_data
    from gate.core.pins.diff import exact_top2_ties
    from gate.core.pins.pin import load_pin
    from gate.core.traces.machine import machine_key, machine_of

    pin = load_pin(model or default_model(), pins_dir)
    header = pin.trace.header
    ties = exact_top2_ties(pin.trace)
    out = {
        "pin": str(pin.folder.pin_path),
        "model": header.model,
        "prompts": len(pin.trace.records),
        "positions": sum(len(r.token_ids) for r in pin.trace.records),
        "top_k": header.top_k,
        "engine": dict(header.engine),
        **{k: v for k, v in header.extra.items() if k != "prompt_sha256"},
        "machine_key": machine_key(machine_of(header.engine, header.extra)),
        "exact_top2_ties": [
            {"prompt_id": t.prompt_id, "position": t.position, "chosen": t.chosen, "other": t.other} for t in ties
        ],
    }
    write_data(orjson.dumps(out, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE), None)
    return 0


def register(app: typer.Typer) -> None:
    pin_app = typer.Typer(
        name="pin", help="Record and inspect oracle pins (oracle_pins/<org>/<model>/).", no_args_is_help=True
    )

    @pin_app.command("record", epilog=options.EXIT_CODES_WRITE)
    def record_cmd(
        model: Annotated[str, typer.Option("--model", "-m", help="Model id, e.g. Qwen/Qwen3.6-35B-A3B.")],
        prompts: Annotated[
            Path | None,
            typer.Option("--prompts", help="Prompt suite (JSON Lines) \\[default: the pin folder's suite.jsonl]."),
        ] = None,
        max_tokens: Annotated[
            int | None,
            typer.Option("--max-tokens", min=1, help="Tokens per prompt, for every prompt \\[default: the suite's]."),
        ] = None,
        top_k: Annotated[
            int | None, typer.Option("--top-k", min=1, help="Top logprobs per position \\[default: oracle.json's, 20].")
        ] = None,
        engine_opt: options.EngineOpt = None,
        model_path: options.ModelPath = None,
        pins_dir: options.PinsDir = None,
        force: Annotated[
            bool,
            typer.Option(
                "--force", help="Re-record an existing pin: pin.jsonl is replaced, a backup kept, what moved shown."
            ),
        ] = False,
        floor: Annotated[
            bool,
            typer.Option(
                "--floor/--no-floor",
                help="Measure an honest floor for the distribution verdict from honest re-runs (the oracle one "
                "prompt at a time, the HF engine on the same device) when oracle.json's doctrine has none.",
            ),
        ] = True,
    ) -> None:
        """Run the vLLM oracle over the prompt suite and write the pin with its provenance."""
        raise typer.Exit(
            record_pin(
                model=model,
                prompts=prompts,
                max_tokens=max_tokens,
                top_k=top_k,
                engine_opts=engine_opt,
                model_path=model_path,
                pins_dir=pins_dir,
                force=force,
                measure_floor=floor,
            )
        )

    @pin_app.command("show", epilog=options.EXIT_CODES_FILES)
    def show_cmd(
        model: options.Model = None,
        pins_dir: options.PinsDir = None,
    ) -> None:
        """Print a pin's provenance and its exact top-2 ties as JSON."""
        raise typer.Exit(show_pin(model=model, pins_dir=pins_dir))

    app.add_typer(pin_app)
