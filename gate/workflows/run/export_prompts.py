"""The pinned prompts as JSON Lines, for an engine that writes its own candidate trace
(`gate export-prompts`; gate its trace with `gate run --candidate-trace`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import orjson

from gate.core.pins.pin import load_pin
from gate.workflows.common.requests import default_model
from gate.workflows.run.core import prompt_inputs


@dataclass(frozen=True, slots=True)
class ExportedPrompts:
    """One JSON line per pinned prompt, and the header line a candidate trace starts with."""

    lines: bytes
    model: str
    prompts: int
    pin_path: Path
    header: str


def export_prompts(model: str | None, pins_dir: Path | None) -> ExportedPrompts:
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
    return ExportedPrompts(
        lines=lines, model=pin.model, prompts=len(pin.trace.records), pin_path=pin.folder.pin_path, header=header
    )
