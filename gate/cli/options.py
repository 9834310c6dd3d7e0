"""Option declarations of the commands (typer `Annotated` types), declared once.

A command takes `model: options.Model = None`, collects its options into one frozen
request (`gate.workflows.run.request.RunRequest`, ...; the shared groups are
`gate.workflows.common.requests.EngineRequest` and `DoctrineFlags`, and `ReportTarget` below) and
hands that record to a plain function.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from gate.cli.common import BUILTIN_ENGINES

Model = Annotated[
    str | None,
    typer.Option("--model", "-m", help="Model id whose pin to use \\[default: the embedded SmolLM2-135M-Instruct]."),
]
# Every built-in engine, named by the registry itself when the help is shown (so the help
# cannot leave one out, and `gate --help` imports no registry).
Engine = Annotated[
    str | None,
    typer.Option(
        "--engine",
        "-e",
        help=f"Engine: {BUILTIN_ENGINES}, a plugin, or module:Class \\[default: hf].",
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
# The doctrine flags: each changes its own field of the pin's doctrine and keeps the rest
# (`gate.core.verdict.doctrine.resolve_doctrine`).
DOCTRINE_PANEL = "Doctrine (each flag changes its own field of the doctrine the pin or oracle trace carries)"
NearTieMnats = Annotated[
    float | None,
    typer.Option(
        "--near-tie-mnats",
        help="Near-tie threshold in millinats \\[default: the pin's or oracle trace's doctrine, else 125].",
        rich_help_panel=DOCTRINE_PANEL,
    ),
]
NearTieUlps = Annotated[
    float | None,
    typer.Option(
        "--near-tie-ulps",
        help="Also ratify gaps within N steps of the dtype grid (needs the oracle's raw logits) "
        "\\[default: the pin's or oracle trace's doctrine, else none].",
        rich_help_panel=DOCTRINE_PANEL,
    ),
]
NoEvidence = Annotated[
    bool,
    typer.Option(
        "--no-evidence",
        help="Judge without the evidence rule of the pin's or oracle trace's doctrine (its other fields stay).",
        rich_help_panel=DOCTRINE_PANEL,
    ),
]
Strict = Annotated[
    bool,
    typer.Option("--strict", help="Fail (exit 1) unless every prompt is strict.", rich_help_panel=DOCTRINE_PANEL),
]
Details = Annotated[
    bool,
    typer.Option(
        "--details",
        "-v",
        help="The terminal report with its details: provenance, the doctrine, every prompt, the full figures.",
        rich_help_panel="Output",
    ),
]
Output = Annotated[
    Path | None,
    typer.Option("--output", "-o", help="Write the report to this file (- for stdout).", rich_help_panel="Output"),
]
# `--force` says what it replaces, command by command (pin record, goldens record and merge
# declare their own: a pin re-recorded, a golden replaced, a merged trace with a backup).
Force = Annotated[
    bool,
    typer.Option("--force", help="Replace --output if it exists.", rich_help_panel="Output"),
]
ForceOutputs = Annotated[
    bool,
    typer.Option("--force", help="Replace --output and --save-trace if they exist.", rich_help_panel="Output"),
]
SaveTrace = Annotated[
    Path | None,
    typer.Option("--save-trace", help="Save the candidate's trace (format v1) here.", rich_help_panel="Output"),
]


@dataclass(frozen=True, slots=True)
class ReportTarget:
    """Where and how a command's report goes: `--format`, `--output`, `--force`, and
    `--details` where the command has it."""

    fmt: str = "rich"
    output: Path | None = None
    force: bool = False
    details: bool = False


# --------------------------------------------------------------------------- gate run

# `gate run`'s options in panels: the engine and the pin (typer's default panel), the
# doctrine (`DOCTRINE_PANEL`), the output, and how the run is carried out.
RUN_PANEL = "Running (shards, resume, timeouts, repeats)"
CandidateTrace = Annotated[
    Path | None,
    typer.Option(
        "--candidate-trace",
        help="Adjudicate this candidate trace (written by any engine) instead of running one.",
    ),
]
Timings = Annotated[
    bool,
    typer.Option("--timings", help="Print the wall time of each stage on stderr.", rich_help_panel="Output"),
]
Shard = Annotated[
    str | None,
    typer.Option(
        "--shard",
        help="Run only the K-th of N disjoint slices of the suite (K/N, by prompt id); combine the shard "
        "traces with `gate merge`.",
        rich_help_panel=RUN_PANEL,
    ),
]
Resume = Annotated[
    bool,
    typer.Option(
        "--resume",
        help="Continue an interrupted run from its progress file (same model, engine, options).",
        rich_help_panel=RUN_PANEL,
    ),
]
ProgressFile = Annotated[
    Path | None,
    typer.Option(
        "--progress-file",
        help="Where finished prompts are appended as the run goes \\[default: SAVE_TRACE.partial.jsonl, "
        "else .gate/runs/MODEL/ENGINE.partial.jsonl].",
        rich_help_panel=RUN_PANEL,
    ),
]
Timeout = Annotated[
    float | None,
    typer.Option(
        "--timeout",
        help="Seconds each engine call (one generate batch, one prompt unless the engine batches; "
        "or one forced decode) may take before the run fails with exit 3.",
        rich_help_panel=RUN_PANEL,
    ),
]
Repeat = Annotated[
    int,
    typer.Option(
        "--repeat",
        help="Run the candidate N times; any token or logprob that changes between repeats is exit 3 "
        "(a nondeterministic engine cannot be gated token-exactly).",
        rich_help_panel=RUN_PANEL,
    ),
]


# --------------------------------------------------------------------------- report formats


# One choice per command, with shell completion; `gate.reports.RENDERERS` renders each
# (tests/cli/test_cli_surface.py checks the two agree).
class GateFormat(StrEnum):
    rich = "rich"
    json = "json"
    markdown = "markdown"
    junit = "junit"
    html = "html"


class GoldensFormat(StrEnum):
    rich = "rich"
    json = "json"
    markdown = "markdown"


class RichOrJson(StrEnum):
    rich = "rich"
    json = "json"


class DiagnosisFormat(StrEnum):
    rich = "rich"
    json = "json"
    html = "html"


class InvarianceFormat(StrEnum):
    rich = "rich"
    json = "json"
    markdown = "markdown"
    html = "html"


OUTPUT_PANEL = "Output"
GateFormatOpt = Annotated[
    GateFormat, typer.Option("--format", help="Report format.", case_sensitive=False, rich_help_panel=OUTPUT_PANEL)
]
GoldensFormatOpt = Annotated[
    GoldensFormat, typer.Option("--format", help="Report format.", case_sensitive=False, rich_help_panel=OUTPUT_PANEL)
]
DiagnosisFormatOpt = Annotated[
    DiagnosisFormat, typer.Option("--format", help="Report format.", case_sensitive=False, rich_help_panel=OUTPUT_PANEL)
]
InvarianceFormatOpt = Annotated[
    InvarianceFormat,
    typer.Option("--format", help="Report format.", case_sensitive=False, rich_help_panel=OUTPUT_PANEL),
]
RichOrJsonOpt = Annotated[
    RichOrJson, typer.Option("--format", help="Report format.", case_sensitive=False, rich_help_panel=OUTPUT_PANEL)
]

# --------------------------------------------------------------------------- exit codes

# Every command's help ends with the exit codes it can give (the spec's table).
EXIT_CODES_GATE = (
    "Exit codes: 0 pass (strict, or ratified without --strict); 1 the gate failed; "
    "2 usage or input error; 3 engine or infrastructure failure; 4 internal error (a bug in gate)."
)
EXIT_CODES_WRITE = (
    "Exit codes: 0 done; 2 usage or input error; 3 engine or infrastructure failure; 4 internal error (a bug in gate)."
)
EXIT_CODES_COMPARE = (
    "Exit codes: 0 pass (strict, or ratified without --strict); 1 the gate failed; 2 usage or input error; "
    "4 internal error (a bug in gate)."
)
EXIT_CODES_SELFTEST = (
    "Exit codes: 0 every fault caught and classified as expected; 1 not; 2 usage or input error; "
    "3 engine or infrastructure failure; 4 internal error (a bug in gate)."
)
EXIT_CODES_GOLDENS = (
    "Exit codes: 0 no golden moved (or the moves accepted); 1 goldens moved; 2 usage or input error; "
    "3 engine or infrastructure failure; 4 internal error (a bug in gate)."
)
EXIT_CODES_FILES = "Exit codes: 0 done; 2 usage or input error; 4 internal error (a bug in gate)."
EXIT_CODES_DIAGNOSE = (
    "Exit codes: 0 nothing leaves the honest band; 1 a layer and part are located; 2 usage or input error; "
    "3 engine or infrastructure failure; 4 internal error (a bug in gate)."
)
EXIT_CODES_INVARIANCE = (
    "Exit codes: 0 no cell's flips are defects (with --strict: every cell bit-identical); 1 a cell varies; "
    "2 usage or input error; 3 engine or infrastructure failure; 4 internal error (a bug in gate)."
)
