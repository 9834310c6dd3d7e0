"""`gate merge`: combine the traces of `gate run --shard K/N` into one, for one adjudication."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gate.cli import options
from gate.text import plural


def merge_files(
    *,
    shards: list[Path],
    output: Path,
    pin_model: str | None,
    expect_ids_from: Path | None,
    pins_dir: Path | None,
    force: bool,
) -> int:
    from gate.cli.output import refuse_overwrite, say, to_stdout, write_data
    from gate.core.storage.atomic import GOLDEN, PIN, TRACE, file_kind
    from gate.core.traces.shards import merge_traces
    from gate.core.traces.trace import encode_trace, read_trace
    from gate.errors import InputError, PinError

    if pin_model is not None and expect_ids_from is not None:
        raise InputError("--model and --expect-ids-from both name the expected prompts: give one")
    # Refuse to clobber before reading what may be gigabytes of shards.
    # The merged file is of its shards' kind (an oracle's shards merge into an oracle trace).
    first = file_kind(shards[0]) if shards else None
    refuse_overwrite(
        force,
        (output, "--output", first if first in (PIN, GOLDEN) else TRACE),
        message="{flag}{path}: already exists; pass --force to replace it (a backup is kept)",
        inputs=(*shards, expect_ids_from),
    )
    traces = [read_trace(p) for p in shards]

    expected: tuple[str, ...] | None = None
    source = "the suite"
    model = traces[0].header.model
    if expect_ids_from is not None:
        oracle = read_trace(expect_ids_from, role="oracle")
        expected, source = tuple(r.id for r in oracle.records), f"the oracle trace {expect_ids_from}"
        if oracle.header.model != model:
            raise InputError(
                f"{expect_ids_from} is an oracle for {oracle.header.model!r}, the shards are for {model!r}"
            )
    elif pin_model is not None:
        from gate.core.pins.oracle_settings import read_settings
        from gate.core.pins.pin import find_folder, load_suite

        folder = find_folder(pin_model, pins_dir)
        suite = load_suite(folder, read_settings(folder.settings_path))
        expected, source = suite.ids, f"the pin's suite {folder.suite_path}"
        if model != pin_model:
            raise PinError(f"the shards are for model {model!r}, not {pin_model!r}")
        ran = traces[0].header.extra.get("pin_suite_sha256")
        if ran is not None and ran != suite.sha256:
            raise PinError(
                f"the shards ran the suite with hash {ran}, but {folder.suite_path} now hashes to {suite.sha256}: "
                "the suite changed since; rerun the shards"
            )

    merged = merge_traces(traces, expected, expected_from=source)
    kept = write_data(encode_trace(merged.header, merged.records), output, force=force, backup=force)
    where = "stdout" if to_stdout(output) else output
    say(f"merged {plural(len(traces), 'shard trace')}, {plural(len(merged.records), 'prompt')}, into {where}")
    if kept is not None:
        say(f"the file it replaced is kept as {kept}")
    return 0


def register(app: typer.Typer) -> None:
    @app.command("merge", epilog=options.EXIT_CODES_FILES)
    def merge_cmd(
        shards: Annotated[
            list[Path], typer.Argument(help="Shard traces written by `gate run --shard K/N` (all N of them).")
        ],
        output: Annotated[Path, typer.Option("--output", "-o", help="Where to write the merged trace (- for stdout).")],
        model: Annotated[
            str | None,
            typer.Option(
                "--model", "-m", help="Check the shards cover exactly this model's pinned suite, in its order."
            ),
        ] = None,
        pin_model: Annotated[str | None, typer.Option("--pin-model", hidden=True, help="Old name of --model.")] = None,
        expect_ids_from: Annotated[
            Path | None,
            typer.Option("--expect-ids-from", help="Check the shards cover exactly this oracle trace's prompts."),
        ] = None,
        pins_dir: options.PinsDir = None,
        force: Annotated[
            bool, typer.Option("--force", help="Replace --output if it exists, keeping a backup of it.")
        ] = False,
    ) -> None:
        """Merge shard traces into one trace: no overlaps, no gaps, one provenance."""
        if model is not None and pin_model is not None and model != pin_model:
            from gate.errors import InputError

            raise InputError(f"--model {model!r} and --pin-model {pin_model!r} (its old name) disagree: give one")
        code = merge_files(
            shards=shards,
            output=output,
            pin_model=model if model is not None else pin_model,
            expect_ids_from=expect_ids_from,
            pins_dir=pins_dir,
            force=force,
        )
        raise typer.Exit(code)
