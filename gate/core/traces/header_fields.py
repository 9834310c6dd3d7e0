"""The types of the trace header fields gate reads beyond the five of trace v1.

A header is written by whatever made the trace (an engine's `info()`, a plugin, a hand):
any field gate reads later, in a verdict, a report or a provenance check, is checked here,
in the reader, so that a wrong type is one line naming the field (exit 2), never an
internal error far away (a list of lists in `engine.hardware.cpu_flags` once reached
`set()`). Fields gate does not read are left as they are. A field may be null where gate
reads it with a default (`info()` values an engine did not have).

The versions of the files beside a trace are checked where they are read: a golden's
`golden` (`gate.core.goldens.golden.check_golden_version`), a progress file's marker (here).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gate.errors import TraceError

# The progress file's marker (`gate.core.storage.atomic.PROGRESS_KEY`) and its version.
PROGRESS_VERSION = 1

Check = Callable[[Any], str | None]  # the problem with a value, or None when it is fine


def _of(*types: type, what: str) -> Check:
    def check(value: Any) -> str | None:
        return None if type(value) in types else f"must be {what}, found {type(value).__name__} {_short(value)}"

    return check


def _list_of_str(value: Any) -> str | None:
    if not isinstance(value, list):
        return f"must be a list of strings, found {type(value).__name__} {_short(value)}"
    for i, item in enumerate(value):
        if not isinstance(item, str):
            return f"item {i} must be a string, found {type(item).__name__} {_short(item)}"
    return None


def _map_of_str(value: Any) -> str | None:
    if not isinstance(value, dict):
        return f"must be an object, found {type(value).__name__} {_short(value)}"
    for key, item in value.items():
        if item is not None and not isinstance(item, (str, int, float)):
            return f"key {key!r} must be a string, found {type(item).__name__} {_short(item)}"
    return None


def _positive_int(value: Any) -> str | None:
    if type(value) is not int or value < 1:
        return f"must be a positive integer, found {_short(value)}"
    return None


_STR = _of(str, what="a string")
_OBJECT = _of(dict, what="an object")
_NUMBER_OR_STR = _of(str, int, float, what="a string or a number")

# `hardware` (gate.core.traces.machine): what `machine_key` and `describe` read.
HARDWARE: dict[str, Check] = {
    "device_type": _STR,
    "device_name": _STR,
    "cpu_model": _STR,
    "torch_cpu_capability": _STR,
    "cpu_flags": _list_of_str,
    "forced_isa": _map_of_str,
    "compute_capability": _NUMBER_OR_STR,
    "torch": _STR,
    "threads": _of(int, what="an integer"),
}
# Fields read from the header, or from its `engine` object (a pin's provenance looks in both).
PROVENANCE: dict[str, Check] = {
    "vocab_size": _positive_int,
    "created_at": _STR,
    "weights_sha256": _STR,
    "tokenizer_sha256": _STR,
    "suite_sha256": _STR,
    "pin_suite_sha256": _STR,
    "prompt_sha256": _OBJECT,
    "device": _STR,
    "dtype": _STR,
    "engine_options": _OBJECT,
    "doctrine": _OBJECT,
    "pin": _OBJECT,
    "answered_models": _list_of_str,
    "warnings": _list_of_str,
}


def check_header_fields(name: str, lineno: int, obj: Mapping[str, Any]) -> None:
    """Refuse (TraceError, exit 2) a header whose fields gate reads have the wrong type."""
    engine = obj.get("engine")
    for prefix, source in (("", obj), ("engine.", engine if isinstance(engine, dict) else {})):
        for key, check in PROVENANCE.items():
            _check(name, lineno, f"{prefix}{key}", source.get(key), check)
        hardware = source.get("hardware")
        if hardware is None:
            continue
        if not isinstance(hardware, dict):
            raise TraceError(name, lineno, f"{prefix}hardware", f"must be an object, found {_short(hardware)}")
        for key, check in HARDWARE.items():
            _check(name, lineno, f"{prefix}hardware.{key}", hardware.get(key), check)
    progress = obj.get("gate_progress")
    if progress is not None and (type(progress) is not int or progress != PROGRESS_VERSION):
        why = f"unsupported progress file version {_short(progress)} (this gate reads version {PROGRESS_VERSION})"
        raise TraceError(name, lineno, "gate_progress", why)


def _check(name: str, lineno: int, fld: str, value: Any, check: Check) -> None:
    if value is None:
        return
    problem = check(value)
    if problem is not None:
        raise TraceError(name, lineno, fld, problem)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
