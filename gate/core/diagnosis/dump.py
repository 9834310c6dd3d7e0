"""Activations from any engine: the context gate names, the safetensors dump an engine writes
back, and the check that turns either a dump or a plugin's `capture_activations` into a
`Capture` (pure; numpy only; the format is docs/reference/activation-dump.md).

A dump holds one tensor per module gate compares, named as `gate diagnose` prints it
(`model.layers.9.self_attn`; the residual stream after a layer under the layer's own name),
each the module's output at every position of the context, `[positions, width]` (a leading
batch of 1 accepted), float32 or bfloat16, and the context in the file's `__metadata__`
(`context_sha256`, or `token_ids` as a JSON list), so a dump of another context is refused.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gate.core.diagnosis.capture import PATHS, Capture, Tensor
from gate.errors import GateError, InputError

CONTEXT_SCHEMA = 1
# Where the context is named in a dump's metadata (either one).
META_SHA = "context_sha256"
META_IDS = "token_ids"
META_PATH = "path"
F32, BF16 = "F32", "BF16"
ITEMSIZE = {F32: 4, BF16: 2}
# A safetensors header larger than this is not one a dump needs (the format's own limit).
MAX_HEADER = 100 << 20


def context_sha256(token_ids: Sequence[int]) -> str:
    """The context's hash: sha256 of its token ids written in decimal, joined by commas."""
    return hashlib.sha256(",".join(str(int(t)) for t in token_ids).encode("ascii")).hexdigest()


@dataclass(frozen=True, slots=True)
class ModuleShape:
    """One module gate compares: its name, its point and the dump's shape for it."""

    name: str
    layer: int
    part: str
    positions: int
    width: int

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "layer": self.layer, "part": self.part, "shape": [self.positions, self.width]}


@dataclass(frozen=True, slots=True)
class ActivationContext:
    """What `gate diagnose --emit-context` writes: the token ids to run and the modules wanted."""

    model: str
    pin: Mapping[str, Any]
    prompt_id: str
    position: int
    path: str
    prompt_token_ids: tuple[int, ...]
    context_token_ids: tuple[int, ...]
    modules: tuple[ModuleShape, ...]

    @property
    def sha256(self) -> str:
        return context_sha256(self.context_token_ids)

    def to_dict(self) -> dict[str, Any]:
        return {
            "gate_activation_context": CONTEXT_SCHEMA,
            "model": self.model,
            "pin": dict(self.pin),
            "prompt_id": self.prompt_id,
            "position": self.position,
            "path": self.path,
            "prompt_token_ids": list(self.prompt_token_ids),
            "context_token_ids": list(self.context_token_ids),
            "context_length": len(self.context_token_ids),
            "context_sha256": self.sha256,
            "metadata": {META_SHA: self.sha256, "prompt_id": self.prompt_id, "position": str(self.position)},
            "modules": [m.to_dict() for m in self.modules],
        }


def module_shapes(reference: Capture) -> tuple[ModuleShape, ...]:
    """The modules of a reference capture, every one at every position of its context."""
    return tuple(
        ModuleShape(t.point.module, t.point.layer, t.point.part, reference.context_length, int(t.values.shape[1]))
        for t in reference.tensors
    )


# --------------------------------------------------------------------------- safetensors


@dataclass(frozen=True, slots=True)
class Entry:
    """One tensor of a safetensors header, checked: its dtype, shape and byte range in the body."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclass(frozen=True, slots=True)
class Header:
    """A safetensors file's header, checked against the file's size before its body is read:
    `length` bytes of JSON after the 8-byte length, then a body of `body` bytes that the
    entries tile end to end."""

    length: int
    entries: tuple[Entry, ...]
    meta: dict[str, str]
    body: int


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Twice(key)
        out[key] = value
    return out


class _Twice(ValueError):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def header_length(prefix: bytes, size: int, where: str) -> int:
    """The header's length from a file's first 8 bytes (`size`: the whole file's), bounded."""
    if len(prefix) < 8 or size < 8:
        raise InputError(f"{where}: not a safetensors file (shorter than its 8-byte header length)")
    length = int.from_bytes(prefix[:8], "little")
    if length > min(MAX_HEADER, size - 8):
        raise InputError(f"{where}: not a safetensors file (a header of {length} bytes in a file of {size})")
    return length


def parse_header(raw: bytes, size: int, where: str) -> Header:
    """The header of a safetensors file of `size` bytes, from its first 8 + length bytes `raw`,
    refused as the safetensors library refuses it: not a JSON object, a name given twice,
    a shape whose byte count is not its range's (in exact integers: a product that would wrap
    in 64 bits is not zero), tensors that overlap or leave a gap, or body bytes after the last."""
    length = header_length(raw, size, where)
    try:
        header = json.loads(raw[8 : 8 + length].decode("utf-8"), object_pairs_hook=_unique)
    except _Twice as twice:
        raise InputError(f"{where}: not a safetensors file (its header names {twice.name!r} twice)") from None
    except RecursionError:
        raise InputError(f"{where}: not a safetensors file (its header nests deeper than any header does)") from None
    except (UnicodeDecodeError, ValueError):
        raise InputError(f"{where}: not a safetensors file (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise InputError(f"{where}: not a safetensors file (its header is not a JSON object)")
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise InputError(f"{where}: __metadata__ must map names to strings")
    body = size - 8 - length
    entries = sorted((_entry(str(name), e, body, where) for name, e in header.items()), key=lambda e: (e.begin, e.end))
    at = 0
    for e in entries:
        if e.begin != at:
            how = "overlap the previous tensor's" if e.begin < at else f"leave a gap after byte {at}"
            raise InputError(
                f"{where}: tensor {e.name!r}: data_offsets [{e.begin}, {e.end}] {how} (safetensors lays "
                "tensors end to end)"
            )
        at = e.end
    if at != body:
        raise InputError(f"{where}: {body - at} bytes after the last tensor (its data ends at byte {at} of the body)")
    return Header(length, tuple(entries), {str(k): v for k, v in meta.items()}, body)


def read_safetensors(data: bytes, where: str) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """(float32 arrays by name, string metadata) of a safetensors file's bytes. Only F32 and
    BF16 tensors; anything else is an InputError naming the tensor or the field."""
    header = parse_header(data[: 8 + MAX_HEADER], len(data), where)
    return tensors_of(header, memoryview(data)[8 + header.length :]), header.meta


def tensors_of(header: Header, body: Any) -> dict[str, np.ndarray]:
    """The float32 arrays of a checked header's entries, read from its body (bytes-like)."""
    return {e.name: _values(body[e.begin : e.end], e) for e in header.entries}


def _entry(name: str, entry: Any, body: int, where: str) -> Entry:
    if not isinstance(entry, dict):
        raise InputError(f"{where}: tensor {name!r}: its header entry is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in ITEMSIZE:
        raise InputError(f"{where}: tensor {name!r} is {dtype}: expected F32 or BF16")
    if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
        raise InputError(f"{where}: tensor {name!r}: shape {shape!r} is not a list of sizes")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)):
        raise InputError(f"{where}: tensor {name!r}: data_offsets {offsets!r} are not [begin, end]")
    begin, end = offsets
    count = math.prod(shape)  # Python's integers: no product wraps
    if not 0 <= begin <= end <= body or end - begin != count * ITEMSIZE[dtype]:
        raise InputError(f"{where}: tensor {name!r}: data_offsets {offsets} do not hold {dtype} {shape}")
    return Entry(name, dtype, tuple(shape), begin, end)


def _values(raw: Any, e: Entry) -> np.ndarray:
    if e.dtype == F32:
        values = np.frombuffer(raw, dtype="<f4").astype(np.float32)
    else:  # bfloat16 is the upper half of a float32: widen the bits, exactly
        values = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    return values.reshape(e.shape)


def write_safetensors(tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str], *, dtype: str = F32) -> bytes:
    """A safetensors file's bytes: float arrays stored as F32, or BF16 (rounded to nearest even)."""
    header: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    chunks: list[bytes] = []
    offset = 0
    for name, array in tensors.items():
        f32 = np.ascontiguousarray(array, dtype="<f4")
        if dtype == BF16:
            bits = f32.view(np.uint32)
            raw = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2").tobytes()
        else:
            raw = f32.tobytes()
        header[name] = {"dtype": dtype, "shape": list(f32.shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    head = json.dumps(header, separators=(",", ":")).encode("utf-8")
    head += b" " * (-len(head) % 8)
    return len(head).to_bytes(8, "little") + head + b"".join(chunks)


# --------------------------------------------------------------------------- the one check


def check_context(meta: Mapping[str, str], context_ids: Sequence[int], where: str) -> None:
    """The dump's metadata names this context (by hash or by its ids), or InputError naming the field."""
    want = context_sha256(context_ids)
    if META_SHA in meta:
        if meta[META_SHA].strip().lower() != want:
            raise InputError(
                f"{where}: __metadata__ {META_SHA} {meta[META_SHA][:16]}... is not the emitted context's "
                f"({want[:16]}...)"
            )
        return
    if META_IDS in meta:
        try:
            ids = json.loads(meta[META_IDS])
        except ValueError:
            raise InputError(f"{where}: __metadata__ {META_IDS} is not a JSON list of token ids") from None
        if not isinstance(ids, list) or [int(i) if isinstance(i, int) else None for i in ids] != list(context_ids):
            raise InputError(f"{where}: __metadata__ {META_IDS} are not the emitted context's token ids")
        return
    raise InputError(f"{where}: __metadata__ names no context: give {META_SHA} (or {META_IDS})")


def named_capture(
    arrays: Mapping[str, Any],
    reference: Capture,
    where: str,
    *,
    error: type[GateError] = InputError,
) -> Capture:
    """A dump's (or a plugin's) arrays, named as the reference's modules, as a Capture on the
    reference's path. Names the reference lacks, a wrong shape or a non-float32 array are
    `error`s naming the tensor; a module the arrays lack is left out (the comparison lists it
    in `missing_modules`); an empty intersection is an error (nothing could be judged)."""
    if not isinstance(arrays, Mapping):
        raise error(f"{where}: expected a mapping of module names to arrays, got {type(arrays).__name__}")
    points = {t.point.module: (t.point, int(t.values.shape[1])) for t in reference.tensors}
    n = reference.context_length
    unknown = [name for name in arrays if name not in points]
    if unknown:
        some = ", ".join(list(points)[:3])
        raise error(f"{where}: tensor {unknown[0]!r} is not a module gate compares (names like {some})")
    tensors: list[Tensor] = []
    for t in reference.tensors:
        name = t.point.module
        if name not in arrays:
            continue
        values = arrays[name]
        if not isinstance(values, np.ndarray) or values.dtype != np.float32:
            got = getattr(values, "dtype", type(values).__name__)
            raise error(f"{where}: tensor {name!r} is {got}: expected float32 (or BF16 in a dump)")
        width = points[name][1]
        shape = values.shape[1:] if values.ndim == 3 and values.shape[0] == 1 else values.shape
        if tuple(shape) != (n, width):
            raise error(f"{where}: tensor {name!r} has shape {list(values.shape)}: expected [{n}, {width}]")
        tensors.append(Tensor(points[name][0], tuple(range(n)), values.reshape(n, width)))
    if not tensors:
        raise error(f"{where}: no tensor is named as a module gate compares (names like {', '.join(list(points)[:3])})")
    return Capture(path=reference.path, context_length=n, tensors=tuple(tensors), meta={"source": where})


def check_rows(arrays: Mapping[str, np.ndarray], context_length: int, where: str) -> None:
    """Before anything loads: every array is [positions, width] (or [1, positions, width])
    with a row per context position."""
    for name, values in arrays.items():
        shape = list(values.shape)
        rows = shape[1:] if len(shape) == 3 and shape[0] == 1 else shape
        if len(rows) != 2 or rows[0] != context_length:
            raise InputError(
                f"{where}: tensor {name!r} has shape {shape}: expected [{context_length}, width] "
                "(a row per context position)"
            )


def dump_path(meta: Mapping[str, str], where: str) -> str | None:
    """The path the dump says it ran (prefill or decode), if it says."""
    path = meta.get(META_PATH)
    if path is not None and path not in PATHS:
        raise InputError(f"{where}: __metadata__ {META_PATH} {path!r}: expected prefill or decode")
    return path
