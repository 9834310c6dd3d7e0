"""`gate export-prompts`: the pinned prompt token ids, for an engine that writes its own trace
(`gate.workflows.run.export_prompts`)."""

from __future__ import annotations

from pathlib import Path

import typer

from gate.cli import options
from gate.text import plural


def export_prompts(*, model: str | None, output: Path | None, pins_dir: Path | None, force: bool) -> int:
    from gate.cli.output import pin_inputs, refuse_overwrite, say, to_stdout, write_data
    from gate.core.storage.atomic import SUITE
    from gate.workflows.common.requests import default_model
    from gate.workflows.run.export_prompts import export_prompts as export

    # A list of prompts: never over the pin it reads, nor over any file of another kind.
    refuse_overwrite(force, (output, "--output", SUITE), inputs=pin_inputs(model or default_model(), pins_dir))
    exported = export(model, pins_dir)
    write_data(exported.lines, output, force=force)
    if not to_stdout(output):
        say(f"{plural(exported.prompts, 'prompt')} of {exported.pin_path} written to {output}")
    say(
        "run each prompt greedily from its prompt_token_ids for max_tokens tokens and write a candidate trace: "
        f"a header line such as {exported.header}, then one record per prompt with id, prompt_token_ids and "
        "token_ids (top_logprobs optional); gate it with: gate run --candidate-trace TRACE"
        + (f" --model {exported.model}" if model is not None else "")
    )
    return 0


def register(app: typer.Typer) -> None:
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
