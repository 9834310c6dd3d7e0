"""Adding the float32 reference to an existing pin (`gate pin reference`).

The same weights in float32 (transformers, `HFEngine(dtype="float32")`), teacher-forced
along each pinned prompt and the oracle's tokens, give a top-k list at every generated
position (`gate.core.verdict.reference`). They are written into the pin trace as each
record's `reference_top_logprobs`, with the header's `reference` saying how they were made.
Everything the oracle recorded stays as it was: its ids, tokens, lists and logits are
written back value for value (the reader keeps them; `encode_trace` writes them), so the
pin's digest (`trace_sha256`) does not move. The honest floor against the reference is the
doctrine's `reference_floor`, measured by the separation study and written to oracle.json and
the header by hand (`--floor FILE`: a JSON object of `Floor`'s keys). `--floor-only` writes a
new floor into a pin that carries its lists without recording them again (`set_floor`): the
header's doctrine and oracle.json's change, every record line stays byte for byte.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from gate.core.pins.pin import PinFolder, folder_for_writing
from gate.core.storage.atomic import atomic_write
from gate.core.traces.reader import read_trace
from gate.core.traces.trace import PromptRecord, Trace, encode_header, encode_trace
from gate.core.verdict.floor import Floor
from gate.core.verdict.reference import REFERENCE_HEADER_KEY, REFERENCE_KEY, has_reference, reference_of
from gate.errors import EngineError, InputError, PinError
from gate.text import plural
from gate.workflows.common.requests import Say, silent

REFERENCE_DTYPE = "float32"


def reference_records(engine: Any, pin: Trace) -> list[PromptRecord]:
    """Each pinned record with the engine's top-k at every position of the oracle's tokens."""
    top_k = pin.header.top_k
    out = []
    for rec in pin.records:
        fd = engine.force(rec.prompt_token_ids, rec.token_ids, top_k)
        tops = [[[int(t), float(lp)] for t, lp in pos] for pos in fd.top_logprobs or ()]
        if len(tops) != len(rec.token_ids):
            raise EngineError(
                f"the float32 reference gave {len(tops)} lists for prompt {rec.id!r}'s {len(rec.token_ids)} tokens"
            )
        out.append(replace(rec, extra={**rec.extra, REFERENCE_KEY: tops}))
    return out


def reference_header(info: Mapping[str, Any]) -> dict[str, Any]:
    """The header's `reference`: how the lists were made (`info`: the engine's)."""
    return {
        "dtype": REFERENCE_DTYPE,
        "engine": {k: str(info[k]) for k in ("name", "version") if k in info},
        "how": "the same weights in float32, teacher-forced along each pinned prompt and the oracle's tokens",
    }


def with_reference(
    pin: Trace, records: Sequence[PromptRecord], header: Mapping[str, Any], floor: Floor | None
) -> tuple[Trace, dict[str, Any] | None]:
    """The pin trace with the reference's records and `header` (`reference_header`), and (with
    `floor`) the doctrine carrying it as `reference_floor` (for oracle.json too)."""
    extra: dict[str, Any] = {**pin.header.extra, REFERENCE_HEADER_KEY: dict(header)}
    doctrine = None
    if floor is not None:
        doctrine = {**dict(pin.header.extra.get("doctrine") or {}), "reference_floor": floor.to_dict()}
        extra["doctrine"] = doctrine
    return replace(pin, header=replace(pin.header, extra=extra), records=tuple(records)), doctrine


def record_reference(pin: Trace, source_model: str) -> Trace:
    """`pin` with the float32 reference's lists and header (the doctrine as it was)."""
    from gate.engines.registry import load_reference

    engine = load_reference(source_model, dtype=REFERENCE_DTYPE)
    try:
        records = reference_records(engine, pin)
        info = engine.info()
    finally:
        engine.close()
    trace, _ = with_reference(pin, records, reference_header(info), None)
    reference_of(trace)  # the lists as the verdict will read them
    return trace


def add_reference(
    model: str,
    pins_dir: Path | None,
    *,
    model_path: Path | None = None,
    floor: Floor | None = None,
    floor_only: bool = False,
    force: bool = False,
    say: Say = silent,
) -> Path:
    """Record the float32 reference into the pin of `model` (and `floor` into its doctrine);
    with `floor_only`, write `floor` alone (`set_floor`)."""
    if floor_only:
        if floor is None:
            raise InputError("--floor-only writes the floor given by --floor; give --floor FILE")
        return set_floor(model, pins_dir, floor, force=force, say=say)
    folder: PinFolder = folder_for_writing(model, pins_dir)
    pin = read_trace(folder.pin_path, role="oracle")
    if has_reference(pin) and not force:
        raise PinError(f"{folder.pin_path} carries a float32 reference already; pass --force to record it again")
    say(f"recording the float32 reference for {model}: {plural(len(pin.records), 'prompt')}, top-{pin.header.top_k}")
    with_lists = record_reference(pin, str(model_path) if model_path is not None else model)
    trace, doctrine = with_reference(pin, with_lists.records, with_lists.header.extra[REFERENCE_HEADER_KEY], floor)
    data = encode_trace(trace.header, trace.records)
    if doctrine is not None:
        _write_doctrine(folder, doctrine)
    atomic_write(folder.pin_path, data, overwrite=True)
    say(f"reference written to {folder.pin_path}" + (" and its floor to oracle.json" if doctrine else ""))
    return folder.pin_path


def set_floor(model: str, pins_dir: Path | None, floor: Floor, *, force: bool = False, say: Say = silent) -> Path:
    """Write `floor` as the doctrine's `reference_floor` of a pin that carries its float32 lists,
    without recording them again: the pin's header and oracle.json change, each record line is
    written back as it was read. Replacing a different `reference_floor` needs `force`."""
    folder: PinFolder = folder_for_writing(model, pins_dir)
    pin = read_trace(folder.pin_path, role="oracle")
    if not has_reference(pin):
        raise PinError(
            f"{folder.pin_path} carries no float32 reference: its floor would judge nothing; record the "
            "reference with `gate pin reference` (without --floor-only) first"
        )
    old = (pin.header.extra.get("doctrine") or {}).get("reference_floor")
    if old is not None and old != floor.to_dict() and not force:
        raise PinError(f"{folder.pin_path} has a reference_floor already; pass --force to replace it")
    trace, doctrine = with_reference(pin, pin.records, pin.header.extra[REFERENCE_HEADER_KEY], floor)
    lines = folder.pin_path.read_bytes().splitlines(keepends=True)
    _write_doctrine(folder, doctrine)
    atomic_write(folder.pin_path, b"".join([encode_header(trace.header), *lines[1:]]), overwrite=True)
    say(f"reference_floor written to {folder.pin_path} and oracle.json; the float32 lists kept as they were")
    return folder.pin_path


def _write_doctrine(folder: PinFolder, doctrine: Mapping[str, Any] | None) -> None:
    """oracle.json with `doctrine` in place of its own (every other key as it was)."""
    import orjson

    raw = orjson.loads(folder.settings_path.read_bytes())
    raw["doctrine"] = doctrine
    atomic_write(folder.settings_path, orjson.dumps(raw, option=orjson.OPT_INDENT_2) + b"\n", overwrite=True)
