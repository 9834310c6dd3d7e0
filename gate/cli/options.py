"""Option declarations shared by the commands (typer `Annotated` types), declared once.

A command takes `model: options.Model = None` and hands the value to a plain function.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

Model = Annotated[
    str | None,
    typer.Option("--model", "-m", help="Model id whose pin to use \\[default: the embedded SmolLM2-135M-Instruct]."),
]
Engine = Annotated[
    str | None,
    typer.Option(
        "--engine",
        "-e",
        help="Engine: hf, vllm, openai, llamacpp, ortgenai, a plugin, or module:Class \\[default: hf].",
    ),
]
EngineOpt = Annotated[
    list[str] | None,
    typer.Option("--engine-opt", help="Engine option key=value (repeatable), e.g. dtype=bfloat16."),
]
ModelPath = Annotated[
    Path | None,
    typer.Option("--model-path", help="Load the weights from this folder (the pin is still found by --model)."),
]
PinsDir = Annotated[
    Path | None,
    typer.Option("--pins-dir", help="Folder of pins \\[default: $GATE_PINS_DIR, ./oracle_pins, gate's own]."),
]
NearTieMnats = Annotated[
    float | None,
    typer.Option("--near-tie-mnats", help="Near-tie threshold in millinats \\[default: the pin's doctrine, else 125]."),
]
NearTieUlps = Annotated[
    float | None,
    typer.Option(
        "--near-tie-ulps", help="Also ratify gaps within N steps of the dtype grid (needs the oracle's raw logits)."
    ),
]
Strict = Annotated[bool, typer.Option("--strict", help="Fail (exit 1) unless every prompt is strict.")]
Output = Annotated[Path | None, typer.Option("--output", "-o", help="Write the report to this file (- for stdout).")]
Force = Annotated[bool, typer.Option("--force", help="Replace the files the command writes if they exist.")]
SaveTrace = Annotated[Path | None, typer.Option("--save-trace", help="Save the candidate's trace (format v1) here.")]
