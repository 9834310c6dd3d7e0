"""Diagnosing an engine gate does not drive, from its own activations.

`emit_context` names the context to run (the prompt's ids and the oracle's tokens before the
position) and the modules gate compares, with their shapes, read from the reference's own
capture of that context; `load_dump` reads the safetensors file the engine wrote back and
checks that it is of that context; `dump_candidate` hands its arrays to the diagnosis as
named activations, the path a plugin's `capture_activations` takes too.
(docs/reference/activation-dump.md.)
"""

from __future__ import annotations

import hashlib
import mmap
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gate.core.diagnosis.capture import PREFILL
from gate.core.diagnosis.dump import (
    ActivationContext,
    check_context,
    check_rows,
    dump_path,
    header_length,
    module_shapes,
    parse_header,
    tensors_of,
)
from gate.errors import InputError
from gate.workflows.diagnose.core import NamedActivations, Target, target_given

if TYPE_CHECKING:
    from gate.core.pins.pin import Pin

# A dump larger than this is refused before it is read (the default model's full dump at a
# 70-token context is about 40 MB in float32).
MAX_DUMP_BYTES = 16 << 30


def pin_identity(pin: Pin) -> dict[str, Any]:
    """The pin the context was drawn from: its model, its suite's hash and its trace file's."""
    trace = Path(pin.folder.pin_path)
    return {
        "model": pin.model,
        "suite_sha256": pin.suite.sha256,
        "pin_sha256": hashlib.sha256(trace.read_bytes()).hexdigest() if trace.is_file() else None,
    }


def emit_context(pin: Pin, target: Target, model_path: str) -> ActivationContext:
    """The context for `target` and the modules gate compares there, from the reference
    (transformers float32 on `model_path`)'s capture of it."""
    from gate.engines.registry import load_reference

    ref = load_reference(model_path, tokenizer=False, dtype="float32")
    try:
        capture = ref.capture_path(target.prompt_ids, target.context_ids, PREFILL)
    finally:
        ref.close()
    return ActivationContext(
        model=pin.model,
        pin=pin_identity(pin),
        prompt_id=target.prompt_id,
        position=target.position,
        path=target.path,
        prompt_token_ids=target.prompt_ids,
        context_token_ids=target.context_ids,
        modules=module_shapes(capture),
    )


def load_dump(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """(arrays by name, metadata) of a dump file, or InputError naming the file. The header is
    read and checked against the file's size first (bounded: `MAX_HEADER`); the body is then
    mapped, never read whole, and each tensor widened to float32 from it."""
    where = str(path)
    if not path.is_file():
        raise InputError(f"--candidate-activations {where}: no such file")
    with path.open("rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > MAX_DUMP_BYTES:
            raise InputError(
                f"--candidate-activations {where}: {size} bytes, more than a dump may hold ({MAX_DUMP_BYTES})"
            )
        prefix = fh.read(8)
        length = header_length(prefix, size, where)
        header = parse_header(prefix + fh.read(length), size, where)
        if header.body == 0:
            return tensors_of(header, b""), header.meta
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            body = memoryview(mapped)[8 + header.length :]
            try:
                return tensors_of(header, body), header.meta
            finally:
                body.release()


def dump_target(
    pin: Pin,
    meta: Mapping[str, str],
    where: str,
    *,
    prompt: str | None,
    position: int | None,
    path: str | None,
) -> Target:
    """The position a dump is of: --prompt/--position, else the dump's own `prompt_id` and
    `position` metadata; its path: --path, else the dump's `path`, else decode. The dump's
    context (hash or ids) must be that target's."""
    if prompt is None:
        prompt = meta.get("prompt_id")
    if position is None and "position" in meta:
        try:
            position = int(meta["position"])
        except ValueError:
            raise InputError(f"{where}: __metadata__ position {meta['position']!r} is not an integer") from None
    if prompt is None or position is None:
        raise InputError(f"{where}: name the position: --prompt and --position (the dump's metadata has neither)")
    target = target_given(pin, prompt, position, path or dump_path(meta, where) or "decode")
    check_context(meta, target.context_ids, where)
    return target


def check_dump(arrays: Mapping[str, np.ndarray], target: Target, where: str) -> None:
    """The dump's shapes against the context's length, before the reference loads."""
    check_rows(arrays, len(target.context_ids), where)


def dump_candidate(arrays: Mapping[str, np.ndarray], where: str) -> NamedActivations:
    """A dump's arrays as the candidate: the same check as a plugin's capture_activations."""

    def fetch(context_ids: Sequence[int], names: Sequence[str]) -> Mapping[str, np.ndarray]:
        return arrays

    return NamedActivations(fetch, where, InputError)
