"""Trace format v1 (../shared/spec/gate-spec.md): records, reader and atomic writer.

A trace is JSON Lines: a header, then one prompt record per line. The reader rejects every
malformed input the spec lists, naming file, line and field. Validation of the top-k lists
(the bulk of a trace) is vectorised with numpy; any list the fast path cannot vouch for is
re-checked position by position, which is also what produces the precise error message.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from operator import itemgetter
from typing import Any, Literal

import numpy as np
import orjson

from gate.core.atomic import atomic_write
from gate.errors import TraceError

TRACE_VERSION = 1
Role = Literal["oracle", "candidate"]
ROLES: tuple[str, ...] = ("oracle", "candidate")
FINISH_REASONS = ("length", "stop", None)
# One top-k list: (token_id, logprob) pairs, logprob descending then token id ascending.
# Stored as parsed (lists of [id, logprob]); treat as read-only.
TopList = Sequence[Sequence[Any]]

_HEADER_KEYS = ("gate_trace", "role", "model", "top_k", "engine")
_RECORD_KEYS = (
    "id",
    "prompt_token_ids",
    "token_ids",
    "top_logprobs",
    "finish_reason",
    "prompt",
    "tokens",
    "forced_token_ids",
)
# A line longer than this is refused before parsing: no honest trace line comes near it
# (1,000 positions x top-20 is about 600 kB), and a corrupt file must not exhaust memory.
MAX_LINE_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class TraceHeader:
    role: str
    model: str
    top_k: int
    engine: Mapping[str, Any]
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "gate_trace": TRACE_VERSION,
            "role": self.role,
            "model": self.model,
            "top_k": self.top_k,
            "engine": dict(self.engine),
        }
        out.update(self.extra)
        return out


@dataclass(frozen=True, slots=True)
class PromptRecord:
    id: str
    prompt_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    top_logprobs: Sequence[TopList] | None = None
    finish_reason: str | None = None
    prompt: str | None = None
    tokens: tuple[str, ...] | None = None
    forced_token_ids: tuple[int, ...] | None = None
    # Optional fields beyond v1's (documented in the README), kept verbatim.
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "prompt_token_ids": list(self.prompt_token_ids),
            "token_ids": list(self.token_ids),
        }
        if self.top_logprobs is not None:
            out["top_logprobs"] = [[[int(t), float(lp)] for t, lp in pos] for pos in self.top_logprobs]
        if self.finish_reason is not None:
            out["finish_reason"] = self.finish_reason
        if self.prompt is not None:
            out["prompt"] = self.prompt
        if self.tokens is not None:
            out["tokens"] = list(self.tokens)
        if self.forced_token_ids is not None:
            out["forced_token_ids"] = list(self.forced_token_ids)
        out.update(self.extra)
        return out


@dataclass(frozen=True, slots=True)
class Trace:
    header: TraceHeader
    records: tuple[PromptRecord, ...]
    path: str = "<memory>"

    @property
    def role(self) -> str:
        return self.header.role

    def by_id(self) -> dict[str, PromptRecord]:
        return {r.id: r for r in self.records}


# --------------------------------------------------------------------------- reading


def read_trace(path: str | os.PathLike[str], role: str | None = None) -> Trace:
    """Read and validate a trace file. `role`, when given, is the role the caller expects."""
    name = os.fspath(path)
    data = _read_bytes(name)
    header: TraceHeader | None = None
    records: list[PromptRecord] = []
    seen: dict[str, int] = {}
    for lineno, raw in _lines(name, data):
        if header is None:
            header = _parse_header(name, lineno, _loads(name, lineno, raw))
            if role is not None and header.role != role:
                raise TraceError(name, lineno, "role", f"expected an {role} trace, found {header.role!r}")
            continue
        rec = _parse_record(name, lineno, _loads(name, lineno, raw), header)
        if rec.id in seen:
            raise TraceError(name, lineno, "id", f"duplicate id {rec.id!r} (first on line {seen[rec.id]})")
        seen[rec.id] = lineno
        records.append(rec)
    if header is None:
        raise TraceError(name, None, None, "empty file: a trace needs a header line")
    return Trace(header=header, records=tuple(records), path=name)


def _read_bytes(name: str) -> bytes:
    try:
        with open(name, "rb") as fh:
            return fh.read()
    except IsADirectoryError:
        raise TraceError(name, None, None, "is a directory, not a trace file") from None
    except FileNotFoundError:
        raise TraceError(name, None, None, "no such file") from None
    except PermissionError:
        raise TraceError(name, None, None, "permission denied") from None
    except OSError as exc:
        raise TraceError(name, None, None, f"cannot read: {exc.strerror or exc}") from None


def _lines(name: str, data: bytes) -> Iterator[tuple[int, bytes]]:
    start = 0
    lineno = 0
    size = len(data)
    while start < size:
        lineno += 1
        end = data.find(b"\n", start)
        if end < 0:
            end = size
        if end - start > MAX_LINE_BYTES:
            raise TraceError(name, lineno, None, f"line is {end - start} bytes, over the {MAX_LINE_BYTES}-byte limit")
        line = data[start:end]
        start = end + 1
        if line.strip():
            yield lineno, line


def _loads(name: str, lineno: int, raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        msg = str(exc)
        if "utf-8" in msg.lower() or "utf8" in msg.lower():
            raise TraceError(name, lineno, None, "not valid UTF-8") from None
        raise TraceError(name, lineno, None, f"bad JSON: {msg}") from None


def _is_int(v: Any) -> bool:
    return type(v) is int


def _is_num(v: Any) -> bool:
    return type(v) is float or type(v) is int


def _parse_header(name: str, lineno: int, obj: Any) -> TraceHeader:
    if not isinstance(obj, dict):
        raise TraceError(name, lineno, None, "the header must be a JSON object")
    if "gate_trace" not in obj:
        raise TraceError(name, lineno, "gate_trace", "missing: line 1 must be a gate trace header")
    ver = obj["gate_trace"]
    if not _is_int(ver):
        raise TraceError(name, lineno, "gate_trace", f"must be the integer {TRACE_VERSION}, found {ver!r}")
    if ver != TRACE_VERSION:
        raise TraceError(name, lineno, "gate_trace", f"unsupported trace version {ver} (this gate reads version {TRACE_VERSION})")
    role = obj.get("role")
    if role not in ROLES:
        raise TraceError(name, lineno, "role", f"must be 'oracle' or 'candidate', found {role!r}")
    model = obj.get("model")
    if not isinstance(model, str) or not model:
        raise TraceError(name, lineno, "model", "missing or not a non-empty string")
    top_k = obj.get("top_k")
    if not _is_int(top_k) or top_k < (1 if role == "oracle" else 0):
        need = "an integer >= 1" if role == "oracle" else "an integer >= 0"
        raise TraceError(name, lineno, "top_k", f"must be {need}, found {top_k!r}")
    engine = obj.get("engine")
    if not isinstance(engine, dict):
        raise TraceError(name, lineno, "engine", "missing or not an object")
    for key in ("name", "version"):
        if not isinstance(engine.get(key), str):
            raise TraceError(name, lineno, f"engine.{key}", "missing or not a string")
    extra = {k: v for k, v in obj.items() if k not in _HEADER_KEYS}
    return TraceHeader(role=role, model=model, top_k=top_k, engine=engine, extra=extra)


def _int_list(name: str, lineno: int, fld: str, value: Any) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise TraceError(name, lineno, fld, f"must be a list of token ids, found {type(value).__name__}")
    for i, t in enumerate(value):
        if not _is_int(t):
            raise TraceError(name, lineno, f"{fld}[{i}]", f"token id must be an integer, found {t!r}")
        if t < 0:
            raise TraceError(name, lineno, f"{fld}[{i}]", f"negative token id {t}")
    return tuple(value)


def _parse_record(name: str, lineno: int, obj: Any, header: TraceHeader) -> PromptRecord:
    if not isinstance(obj, dict):
        raise TraceError(name, lineno, None, "a prompt record must be a JSON object")
    rid = obj.get("id")
    if "id" not in obj:
        raise TraceError(name, lineno, "id", "missing")
    if not isinstance(rid, str) or not rid:
        raise TraceError(name, lineno, "id", f"must be a non-empty string, found {rid!r}")
    for req in ("prompt_token_ids", "token_ids"):
        if req not in obj:
            raise TraceError(name, lineno, req, f"missing (prompt {rid!r})")
    prompt_ids = _int_list(name, lineno, "prompt_token_ids", obj["prompt_token_ids"])
    token_ids = _int_list(name, lineno, "token_ids", obj["token_ids"])
    oracle = header.role == "oracle"

    top = obj.get("top_logprobs")
    if top is None:
        if oracle:
            raise TraceError(name, lineno, "top_logprobs", f"missing: an oracle record needs top-k logprobs (prompt {rid!r})")
    else:
        check_top_logprobs(name, lineno, top, token_ids, oracle=oracle)

    finish = obj.get("finish_reason")
    if finish not in FINISH_REASONS:
        raise TraceError(name, lineno, "finish_reason", f"must be 'length', 'stop' or null, found {finish!r}")
    prompt = obj.get("prompt")
    if prompt is not None and not isinstance(prompt, str):
        raise TraceError(name, lineno, "prompt", "must be a string")
    tokens = obj.get("tokens")
    if tokens is not None:
        if not isinstance(tokens, list) or not all(isinstance(s, str) for s in tokens):
            raise TraceError(name, lineno, "tokens", "must be a list of strings")
        if len(tokens) != len(token_ids):
            raise TraceError(name, lineno, "tokens", f"has {len(tokens)} entries for {len(token_ids)} token ids")
    forced = obj.get("forced_token_ids")
    forced_ids: tuple[int, ...] | None = None
    if forced is not None:
        if oracle:
            raise TraceError(name, lineno, "forced_token_ids", "is for candidate traces only")
        forced_ids = _int_list(name, lineno, "forced_token_ids", forced)
    extra = {k: v for k, v in obj.items() if k not in _RECORD_KEYS}
    return PromptRecord(
        id=rid,
        prompt_token_ids=prompt_ids,
        token_ids=token_ids,
        top_logprobs=top,
        finish_reason=finish,
        prompt=prompt,
        tokens=tuple(tokens) if tokens is not None else None,
        forced_token_ids=forced_ids,
        extra=extra,
    )


_first = itemgetter(0)
_second = itemgetter(1)


def check_top_logprobs(
    name: str, lineno: int, top: Any, token_ids: Sequence[int], *, oracle: bool, fld: str = "top_logprobs"
) -> None:
    """Validate one record's top-k lists; raise TraceError naming the first bad element."""
    if not isinstance(top, list):
        raise TraceError(name, lineno, fld, "must be a list (one top-k list per generated position)")
    if len(top) != len(token_ids):
        raise TraceError(name, lineno, fld, f"has {len(top)} positions for {len(token_ids)} generated tokens")
    if not top or _fast_ok(top, token_ids, oracle):
        return
    for i, pos in enumerate(top):
        _check_position(name, lineno, f"{fld}[{i}]", pos, token_ids[i], oracle)


def _fast_ok(top: list[Any], token_ids: Sequence[int], oracle: bool) -> bool:
    """True when every list is well-formed; False means 'look closer', never 'invalid'."""
    try:
        arr = np.array(top, dtype=np.float64)
    except (ValueError, TypeError):
        return False
    if arr.ndim != 3 or arr.shape[2] != 2 or arr.shape[1] == 0:
        return False
    try:
        pairs = list(chain.from_iterable(top))
        id_types = set(map(type, map(_first, pairs)))
        lp_types = set(map(type, map(_second, pairs)))
    except (TypeError, KeyError, IndexError):
        return False
    if id_types != {int} or not lp_types <= {float, int}:
        return False
    ids = arr[:, :, 0]
    lps = arr[:, :, 1]
    if not (np.isfinite(lps).all() and (lps <= 0.0).all() and (ids >= 0).all()):
        return False
    a, b = lps[:, :-1], lps[:, 1:]
    ia, ib = ids[:, :-1], ids[:, 1:]
    if not ((a > b) | ((a == b) & (ia < ib))).all():
        return False
    srt = np.sort(ids, axis=1)
    if (srt[:, 1:] == srt[:, :-1]).any():
        return False
    if oracle and not (ids[:, 0] == np.asarray(token_ids, dtype=np.float64)).all():
        return False
    return True


def _check_position(name: str, lineno: int, fld: str, pos: Any, chosen: int, oracle: bool) -> None:
    if not isinstance(pos, list):
        raise TraceError(name, lineno, fld, "must be a list of [token_id, logprob] pairs")
    if oracle and not pos:
        raise TraceError(name, lineno, fld, "is empty: an oracle position must list its chosen token")
    seen: set[int] = set()
    prev: tuple[float, int] | None = None
    for j, pair in enumerate(pos):
        where = f"{fld}[{j}]"
        if not isinstance(pair, list) or len(pair) != 2:
            raise TraceError(name, lineno, where, f"must be a [token_id, logprob] pair, found {pair!r}")
        tid, lp = pair
        if not _is_int(tid):
            raise TraceError(name, lineno, where, f"token id must be an integer, found {tid!r}")
        if tid < 0:
            raise TraceError(name, lineno, where, f"negative token id {tid}")
        if not _is_num(lp):
            raise TraceError(name, lineno, where, f"logprob must be a number, found {lp!r}")
        if math.isnan(lp) or math.isinf(lp):
            raise TraceError(name, lineno, where, f"logprob is {lp}: NaN and infinite logprobs are not allowed")
        if lp > 0:
            raise TraceError(name, lineno, where, f"logprob {lp!r} is above 0")
        if tid in seen:
            raise TraceError(name, lineno, where, f"token id {tid} appears twice in one top-k list")
        seen.add(tid)
        if prev is not None and not (lp < prev[0] or (lp == prev[0] and tid > prev[1])):
            raise TraceError(
                name, lineno, where,
                f"out of order: [{tid}, {lp!r}] after [{prev[1]}, {prev[0]!r}] "
                "(lists are sorted by logprob descending, then token id ascending)",
            )
        prev = (float(lp), tid)
    if not oracle:
        return
    if chosen not in seen:
        raise TraceError(name, lineno, fld, f"does not contain the chosen token {chosen}")
    best_id, best_lp = pos[0]
    if best_id != chosen:
        chosen_lp = next(lp for t, lp in pos if t == chosen)
        if chosen_lp == best_lp:
            why = (f"the oracle chose {chosen} at an exact tie with {best_id}; torch.argmax (vLLM's greedy "
                   "sampler) takes the lowest id among equal maxima, so this record is inconsistent")
        else:
            why = f"the chosen token {chosen} is not the greedy choice: {best_id} has a higher logprob"
        raise TraceError(name, lineno, fld, why)


# --------------------------------------------------------------------------- writing


def encode_header(header: TraceHeader) -> bytes:
    return orjson.dumps(header.to_dict(), option=orjson.OPT_APPEND_NEWLINE)


def encode_record(record: PromptRecord) -> bytes:
    return orjson.dumps(record.to_dict(), option=orjson.OPT_APPEND_NEWLINE)


def encode_trace(header: TraceHeader, records: Iterable[PromptRecord]) -> bytes:
    return encode_header(header) + b"".join(encode_record(r) for r in records)


def write_trace(path: str | os.PathLike[str], trace: Trace, *, overwrite: bool = False) -> None:
    """Write atomically: a temporary file in the same folder, fsync, then rename."""
    atomic_write(path, encode_trace(trace.header, trace.records), overwrite=overwrite)
