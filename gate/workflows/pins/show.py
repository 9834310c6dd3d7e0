"""A pin's provenance and its exact top-2 ties, as one JSON-ready mapping (`gate pin show`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gate.core.pins.diff import exact_top2_ties
from gate.core.pins.pin import load_pin, oracle_label
from gate.core.traces.machine import machine_key, machine_of
from gate.workflows.common.requests import default_model


def pin_summary(model: str | None, pins_dir: Path | None) -> dict[str, Any]:
    pin = load_pin(model or default_model(), pins_dir)
    header = pin.trace.header
    ties = exact_top2_ties(pin.trace)
    return {
        "pin": str(pin.folder.pin_path),
        "model": header.model,
        "prompts": len(pin.trace.records),
        "positions": sum(len(r.token_ids) for r in pin.trace.records),
        "top_k": header.top_k,
        # Which oracle recorded the pin, as reports name it (`hf` is transformers).
        "recorded_by": oracle_label(str(header.engine.get("name", ""))),
        "engine": dict(header.engine),
        **{k: v for k, v in header.extra.items() if k != "prompt_sha256"},
        "machine_key": machine_key(machine_of(header.engine, header.extra)),
        "exact_top2_ties": [
            {"prompt_id": t.prompt_id, "position": t.position, "chosen": t.chosen, "other": t.other} for t in ties
        ],
    }
