"""The plugin contract: what an engine author imports, and nothing else of gate.

An engine is a class built as `EngineClass(model, **options)` (`options`: the strings of
`--engine-opt key=value`, converted with `parse_options`) that implements `Engine`; each
optional capability is a protocol it may also implement, found with `isinstance`, so a
plugin is treated exactly as a built-in engine that does the same. Register it under the
`gate.engines` entry-point group (docs/guides/plugins.md). These names stay where they are
when gate's internal modules move.
"""

from gate.core.engine import (
    SCHEDULE_KNOBS,
    BatchesPrompts,
    CapturesActivations,
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
    "SCHEDULE_KNOBS",
    "BatchesPrompts",
    "CapturesActivations",
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
    "parse_options",
]
