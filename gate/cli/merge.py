"""`gate merge`: combine the traces of `gate run --shard K/N` into one, for one adjudication
(`gate.workflows.run.merge`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gate.cli import options
from gate.text import plural

if TYPE_CHECKING:
    from gate.workflows.run.merge import MergeRequest


def merge_files(*, request: MergeRequest, output: Path, force: bool) -> int:
    from gate.cli.output import refuse_overwrite, say, to_stdout, write_data
    from gate.core.storage.atomic import GOLDEN, PIN, TRACE, file_kind
    from gate.core.traces.trace import encode_trace
    from gate.workflows.run.merge import merge_shards

    request.check()
    # Refuse to clobber before reading what may be gigabytes of shards.
    # The merged file is of its shards' kind (an oracle's shards merge into an oracle trace).
    first = file_kind(request.shards[0]) if request.shards else None
    refuse_overwrite(
        force,
        (output, "--output", first if first in (PIN, GOLDEN) else TRACE),
        message="{flag}{path}: already exists; pass --force to replace it (a backup is kept)",
        inputs=(*request.shards, request.expect_ids_from),
    )
    merged = merge_shards(request)
    kept = write_data(encode_trace(merged.trace.header, merged.trace.records), output, force=force, backup=force)
    where = "stdout" if to_stdout(output) else output
    say(f"merged {plural(merged.shards, 'shard trace')}, {plural(len(merged.trace.records), 'prompt')}, into {where}")
    if kept is not None:
        say(f"the file it replaced is kept as {kept}")
    return 0


def register(app: typer.Typer) -> None:
    @app.command("merge", epilog=options.EXIT_CODES_FILES)
    def merge_cmd(
        shards: Annotated[
            list[Path],
            typer.Argument(metavar="SHARDS...", help="Shard traces written by `gate run --shard K/N` (all N of them)."),
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
        from gate.errors import InputError
        from gate.workflows.run.merge import MergeRequest

        if model is not None and pin_model is not None and model != pin_model:
            raise InputError(f"--model {model!r} and --pin-model {pin_model!r} (its old name) disagree: give one")
        request = MergeRequest(
            shards=tuple(shards),
            pin_model=model if model is not None else pin_model,
            expect_ids_from=expect_ids_from,
            pins_dir=pins_dir,
        )
        raise typer.Exit(merge_files(request=request, output=output, force=force))
