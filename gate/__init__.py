"""gate: a token-exact gate for LLM inference engines.

The Python API, for scripts and notebooks (docs/guides/python-api.md)::

    import gate

    result = gate.compare("oracle.jsonl", "candidate.jsonl")  # paths or gate.read_trace(...)
    result.verdict, result.exit_code
    pin = gate.load_pin("HuggingFaceTB/SmolLM2-135M-Instruct")
    gate.run("hf", pin.model).summary

Engine authors import `gate.engine` (the plugin contract). Every name here is loaded on
first use, so `import gate` (and `gate --help`) imports no torch and no engine.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from gate.version import DISTRIBUTION, __version__, install_line

if TYPE_CHECKING:
    from gate.api import compare, load_pin, run
    from gate.core.engine import Engine, PromptInput
    from gate.core.pins.pin import Pin
    from gate.core.traces.reader import read_trace
    from gate.core.traces.trace import PromptRecord, Trace, TraceHeader, write_trace
    from gate.core.verdict.doctrine import Doctrine, Evidence
    from gate.core.verdict.floor import Floor
    from gate.core.verdict.result import Divergence, GateResult, PromptResult
    from gate.engines.registry import load_engine
    from gate.errors import EngineError, GateError, InputError, Interrupted, PinError, TraceError
    from gate.reports import render

# Public name -> the module that defines it (imported on first use).
_LAZY: dict[str, str] = {
    "compare": "gate.api",
    "read_trace": "gate.core.traces.reader",
    "write_trace": "gate.core.traces.trace",
    "Trace": "gate.core.traces.trace",
    "TraceHeader": "gate.core.traces.trace",
    "PromptRecord": "gate.core.traces.trace",
    "load_pin": "gate.api",
    "run": "gate.api",
    "load_engine": "gate.engines.registry",
    "Pin": "gate.core.pins.pin",
    "Doctrine": "gate.core.verdict.doctrine",
    "Evidence": "gate.core.verdict.doctrine",
    "Floor": "gate.core.verdict.floor",
    "GateResult": "gate.core.verdict.result",
    "PromptResult": "gate.core.verdict.result",
    "Divergence": "gate.core.verdict.result",
    "Engine": "gate.core.engine",
    "PromptInput": "gate.core.engine",
    "render": "gate.reports",
    "GateError": "gate.errors",
    "InputError": "gate.errors",
    "TraceError": "gate.errors",
    "PinError": "gate.errors",
    "EngineError": "gate.errors",
    "Interrupted": "gate.errors",
}

__all__ = [
    "DISTRIBUTION",
    "Divergence",
    "Doctrine",
    "Engine",
    "EngineError",
    "Evidence",
    "Floor",
    "GateError",
    "GateResult",
    "InputError",
    "Interrupted",
    "Pin",
    "PinError",
    "PromptInput",
    "PromptRecord",
    "PromptResult",
    "Trace",
    "TraceError",
    "TraceHeader",
    "__version__",
    "compare",
    "install_line",
    "load_engine",
    "load_pin",
    "read_trace",
    "render",
    "run",
    "write_trace",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'gate' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
