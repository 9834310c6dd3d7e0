"""`gate pin record`: run the vLLM oracle over a prompt suite and write the pin;
`gate pin show`: a pin's provenance and its exact top-2 ties;
`gate pin reference`: add the float32 reference's lists (and their floor) to a pin.

The recording is `gate.workflows.pins.record.record_pin`, the summary
`gate.workflows.pins.show.pin_summary`; this module parses options and prints.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gate.cli import options
from gate.cli.common import App

if TYPE_CHECKING:
    from gate.workflows.pins.record import PinRecordRequest


def record_pin(*, request: PinRecordRequest) -> int:
    from gate.cli.output import refuse_overwrite, say
    from gate.core.storage.atomic import PIN
    from gate.errors import PinError
    from gate.workflows.pins.record import record_pin as record

    # Everything that can be refused is refused before the oracle loads (minutes on a GPU).
    refuse_overwrite(
        request.force,
        (request.folder().pin_path, "", PIN),
        inputs=(request.prompts,),
        message="{path} exists; pass --force to re-record it "
        "(the old pin is kept as a backup, and what moved is shown)",
        error=PinError,
    )
    record(request, say=say)
    return 0


def show_pin(*, model: str | None, pins_dir: Path | None) -> int:
    import orjson

    from gate.cli.output import write_data
    from gate.workflows.pins.show import pin_summary

    out = pin_summary(model, pins_dir)
    write_data(orjson.dumps(out, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE), None)
    return 0


def add_reference(
    *,
    model: str,
    pins_dir: Path | None,
    model_path: Path | None,
    floor: Path | None,
    force: bool,
    floor_only: bool = False,
) -> int:
    from gate.cli.output import say
    from gate.core.storage.json_file import read_json
    from gate.core.verdict.floor import Floor
    from gate.workflows.pins.reference import add_reference as add

    fl = None
    if floor is not None:
        fl = Floor.from_dict(read_json(floor, what="floor file"), str(floor), key="reference_floor")
    add(model, pins_dir, model_path=model_path, floor=fl, floor_only=floor_only, force=force, say=say)
    return 0


def register(app: typer.Typer) -> None:
    pin_app = App(name="pin", help="Record and inspect oracle pins (oracle_pins/<org>/<model>/).", no_args_is_help=True)

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
        oracle: Annotated[
            str | None,
            typer.Option(
                "--oracle",
                help="Which implementation records the pin: vllm, or transformers (the reference implementation, "
                "for an architecture vLLM cannot run here; give --dtype) \\[default: oracle.json's engine].",
            ),
        ] = None,
        dtype: Annotated[
            str | None,
            typer.Option("--dtype", help="The oracle's dtype: bfloat16 or float32 \\[default: oracle.json's]."),
        ] = None,
    ) -> None:
        """Run the oracle (vLLM, or transformers with --oracle) over the prompt suite and write the pin
        with its provenance."""
        from gate.workflows.pins.record import PinRecordRequest

        request = PinRecordRequest(
            model=model,
            prompts=prompts,
            max_tokens=max_tokens,
            top_k=top_k,
            engine_opts=tuple(engine_opt or ()),
            model_path=model_path,
            pins_dir=pins_dir,
            force=force,
            measure_floor=floor,
            oracle=oracle,
            dtype=dtype,
        )
        raise typer.Exit(record_pin(request=request))

    @pin_app.command("show", epilog=options.EXIT_CODES_FILES)
    def show_cmd(
        model: options.Model = None,
        pins_dir: options.PinsDir = None,
    ) -> None:
        """Print a pin's provenance and its exact top-2 ties as JSON."""
        raise typer.Exit(show_pin(model=model, pins_dir=pins_dir))

    @pin_app.command("reference", epilog=options.EXIT_CODES_WRITE)
    def reference_cmd(
        model: Annotated[str, typer.Option("--model", "-m", help="Model id of the pin.")],
        model_path: options.ModelPath = None,
        pins_dir: options.PinsDir = None,
        floor: Annotated[
            Path | None,
            typer.Option(
                "--floor",
                help="A JSON file with the honest floor against the reference (kl_mean_mnats, kl_p99_mnats, "
                "same_top_rate, margin, measured_by): written to the doctrine as reference_floor.",
            ),
        ] = None,
        floor_only: Annotated[
            bool,
            typer.Option(
                "--floor-only",
                help="Write only the --floor into a pin that carries its reference: the float32 lists are not "
                "recorded again, the pin's records stay byte for byte.",
            ),
        ] = False,
        force: Annotated[
            bool,
            typer.Option(
                "--force",
                help="Record the reference again where the pin has one (with --floor-only: replace its floor).",
            ),
        ] = False,
    ) -> None:
        """Add the float32 reference (the same weights in float32, forced along the oracle's tokens) to a pin."""
        raise typer.Exit(
            add_reference(
                model=model, pins_dir=pins_dir, model_path=model_path, floor=floor, force=force, floor_only=floor_only
            )
        )

    app.add_typer(pin_app)
