"""Trace format v1 (docs/spec.md): records, reader and atomic writer.

A trace is JSON Lines: a header, then one prompt record per line. The reader rejects every
malformed input the spec lists, naming file, line and field. Validation of the top-k lists
(the bulk of a trace) is vectorised with numpy; any list the fast path cannot vouch for is
re-checked position by position, which is also what produces the precise error message.
"""

from __future__ import annotations

import gc
import io
import json
import math
import os
import re
import stat
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, overload

import numpy as np
import orjson

from gate.core.storage.atomic import atomic_write
from gate.core.storage.json_shape import MAX_JSON_DEPTH, keys_and_depth, parse_cost, shown
from gate.core.traces.header_fields import check_header_fields
from gate.core.traces.moe import (
    FORCED_ROUTED_EXPERTS,
    FORCED_ROUTER_TOP,
    ROUTED_EXPERTS,
    ROUTER_TOP,
    check_routing_fields,
    parse_moe_header,
)
from gate.errors import TraceError

TRACE_VERSION = 1
ROLES: tuple[str, ...] = ("oracle", "candidate")
FINISH_REASONS = ("length", "stop", None)
# `forced_mode`: the path that gave a candidate's forced data (a decode step per position,
# or one prefill over the oracle's tokens).
FORCED_MODES = ("decode", "prefill")
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
# The candidate record field with its top-k at each teacher-forced position (an addition to
# trace v1: candidate only, optional, beside `forced_token_ids`; validated as `top_logprobs`).
FORCED_TOP_KEY = "forced_top_logprobs"
# A line longer than this is refused before parsing: no honest trace line comes near it
# (1,000 positions x top-20 is about 600 kB), and a corrupt file must not exhaust memory.
MAX_LINE_BYTES = 256 * 1024 * 1024
# What parsing a line may cost in memory, estimated from its bytes before parsing: a list
# costs about 64 bytes, an object about 232, each further element (a comma) up to 32. An
# honest line (1,000 positions x top-20) costs a few MB; 99 MB of `[],` would take 3 GB.
MAX_LINE_COST = 1024 * 1024 * 1024
# Lines shorter than this cannot come near MAX_LINE_COST (at most ~32 bytes per byte).
_COST_CHECK_BYTES = 8 * 1024 * 1024
# What the records a file leaves in memory may cost together, estimated the same way (top-k
# lists kept as arrays count at their array size). Lines just under _COST_CHECK_BYTES each
# cost up to ~256 MB parsed; a file of them must be refused before it takes gigabytes. An
# honest trace keeps well under this: its bulk, the top-k lists, is kept as arrays.
MAX_TRACE_COST = 512 * 1024 * 1024
# The reader streams the file in chunks of this size (one read call each).
_READ_CHUNK = 4 * 1024 * 1024
# Exact type sets for the fast checks (bool is not int here).
_LIST = frozenset({list})
_STR = frozenset({str})
_INT = frozenset({int})
_NUM = frozenset({int, float})
_MAX_FLOAT_INT = int(1.7976931348623157e308)
# A JSON string in raw bytes (escapes included), for counting the colons outside strings.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
# Record fields that hold no JSON object when valid: objects inside them are refused by
# validation anyway, so the duplicate-key count need not look inside.
_FLAT_FIELDS = frozenset(_RECORD_KEYS) | {"token_logits", FORCED_TOP_KEY}
# `token_logits` (beyond v1: the chosen token's raw logit per position) fixes the size of a
# grid step for the ULP doctrine, so a tampered one could widen a step at will. No trained
# model's logits come near this magnitude (top logits sit at 10-60; GPT-2's most negative
# at about -150); a larger one is refused. The step itself is capped lower, in adjudicate.
MAX_ABS_LOGIT = 1024.0
# A top-k list is part of one softmax: its probabilities add up to at most 1 (float32
# rounding: the default pin's lists reach 1.00000003). The spec's own seed example
# (docs/examples/seed-oracle.jsonl) reaches 5.4, so the hard limit sits above it:
# it refuses lists that claim many near-certain tokens at once (twenty at -1e-4 add up to
# 20), which would make any choice among them a "tie".
MAX_TOP_MASS = 8.0


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


class TopLogprobs(Sequence[list[list[Any]]]):
    """One record's top-k lists as two read-only (positions, k) arrays.

    Reads like the parsed JSON: `top[i]` is a fresh list of `[token_id, logprob]` pairs,
    logprobs the very float64 values the file held. The reader keeps valid lists in this
    form: an eighth of the memory of the parsed lists, and the arrays (`ids`, `logprobs`)
    are there for code that wants numpy.
    """

    __slots__ = ("ids", "logprobs")
    __hash__ = None  # type: ignore[assignment]  # like the lists it stands for

    def __init__(self, ids: np.ndarray, logprobs: np.ndarray) -> None:
        if ids.shape != logprobs.shape or ids.ndim != 2:
            raise ValueError(f"ids {ids.shape} and logprobs {logprobs.shape} must be one (positions, k) shape")
        ids = ids.astype(np.int64, copy=False)
        logprobs = logprobs.astype(np.float64, copy=False)
        ids.flags.writeable = False
        logprobs.flags.writeable = False
        self.ids = ids
        self.logprobs = logprobs

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    @overload
    def __getitem__(self, i: int) -> list[list[Any]]: ...
    @overload
    def __getitem__(self, i: slice) -> list[list[list[Any]]]: ...
    def __getitem__(self, i: int | slice) -> list[list[Any]] | list[list[list[Any]]]:
        if isinstance(i, slice):
            return _pairs_2d(self.ids[i], self.logprobs[i])
        return list(map(list, zip(self.ids[i].tolist(), self.logprobs[i].tolist(), strict=True)))

    def __iter__(self) -> Iterator[list[list[Any]]]:
        return iter(self.tolist())

    def tolist(self) -> list[list[list[Any]]]:
        """The lists as the JSON holds them."""
        return _pairs_2d(self.ids, self.logprobs)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TopLogprobs):
            return bool(np.array_equal(self.ids, other.ids) and np.array_equal(self.logprobs, other.logprobs))
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return self.tolist() == [[list(pair) for pair in pos] for pos in other]
        return NotImplemented

    def __repr__(self) -> str:
        n, k = self.ids.shape
        return f"TopLogprobs({n} positions x top-{k})"


def _pairs_2d(ids: np.ndarray, logprobs: np.ndarray) -> list[list[list[Any]]]:
    return [
        list(map(list, zip(row_ids, row_lps, strict=True)))
        for row_ids, row_lps in zip(ids.tolist(), logprobs.tolist(), strict=True)
    ]


@dataclass(frozen=True, slots=True)
class PromptRecord:
    """One prompt's record: trace v1's fields, then the additions the verdict reads (each
    validated once, by the reader or at the engine boundary), then `extra`: any other
    field, kept verbatim and written back as read.

    A key of `extra` that names one of the additions (`EVIDENCE_KEYS`, e.g. `token_logits`)
    is moved into that field when the record is made, so a record built as
    `PromptRecord(..., extra={"token_logits": [...]})` reads the same as one built with
    `token_logits=[...]`; giving both is a `ValueError`."""

    id: str
    prompt_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    top_logprobs: Sequence[TopList] | None = None
    finish_reason: str | None = None
    prompt: str | None = None
    tokens: tuple[str, ...] | None = None
    forced_token_ids: tuple[int, ...] | None = None
    # Fields beyond v1's that no verdict reads (docs/reference/trace-format.md), kept verbatim.
    extra: Mapping[str, Any] = field(default_factory=dict)
    # The chosen token's raw logit per generated position: sizes the dtype's grid step.
    token_logits: Sequence[float] | None = None
    # MoE routing (gate.core.traces.moe): per input token, per MoE layer; as the trace holds it.
    routed_experts: Sequence[Any] | None = None
    router_top: Sequence[Any] | None = None
    # The teacher-forced decode beside `forced_token_ids` (candidate only): which path gave it
    # ("decode" or "prefill"), its routing, and its own top-k at each forced position.
    forced_mode: str | None = None
    forced_routed_experts: Sequence[Any] | None = None
    forced_router_top: Sequence[Any] | None = None
    forced_top_logprobs: Sequence[TopList] | None = None

    def __post_init__(self) -> None:
        if not self.extra.keys() & _EVIDENCE_SET:
            return
        rest = dict(self.extra)
        for key in EVIDENCE_KEYS:
            if key not in rest:
                continue
            value = rest.pop(key)
            if getattr(self, key) is not None:
                raise ValueError(f"record {self.id!r}: {key} given twice (as a field and in extra)")
            object.__setattr__(self, key, value)
        object.__setattr__(self, "extra", rest)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "prompt_token_ids": list(self.prompt_token_ids),
            "token_ids": list(self.token_ids),
        }
        if isinstance(self.top_logprobs, TopLogprobs):
            out["top_logprobs"] = self.top_logprobs.tolist()
        elif self.top_logprobs is not None:
            out["top_logprobs"] = [[[int(t), float(lp)] for t, lp in pos] for pos in self.top_logprobs]
        if self.finish_reason is not None:
            out["finish_reason"] = self.finish_reason
        if self.prompt is not None:
            out["prompt"] = self.prompt
        if self.tokens is not None:
            out["tokens"] = list(self.tokens)
        if self.forced_token_ids is not None:
            out["forced_token_ids"] = list(self.forced_token_ids)
        # The order every engine and workflow has always written: the free run's additions,
        # the other fields, then the forced decode's (added after the free run).
        _put(out, "token_logits", self.token_logits)
        _put(out, ROUTED_EXPERTS, self.routed_experts)
        _put(out, ROUTER_TOP, self.router_top)
        out.update(self.extra)
        _put(out, "forced_mode", self.forced_mode)
        _put(out, FORCED_ROUTED_EXPERTS, self.forced_routed_experts)
        _put(out, FORCED_ROUTER_TOP, self.forced_router_top)
        top = self.forced_top_logprobs
        _put(out, FORCED_TOP_KEY, top.tolist() if isinstance(top, TopLogprobs) else top)
        return out


# The record fields beyond v1's that decide verdicts: typed fields of PromptRecord, each at
# the trace key of its own name.
EVIDENCE_KEYS: tuple[str, ...] = (
    "token_logits",
    ROUTED_EXPERTS,
    ROUTER_TOP,
    "forced_mode",
    FORCED_ROUTED_EXPERTS,
    FORCED_ROUTER_TOP,
    FORCED_TOP_KEY,
)
_EVIDENCE_SET = frozenset(EVIDENCE_KEYS)
FORCED_MODES = ("decode", "prefill")


def _put(out: dict[str, Any], key: str, value: Any) -> None:
    if value is not None:
        out[key] = value


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
    # Parsing makes millions of small acyclic containers; the cyclic collector would walk
    # them again and again (4x the parse time on a 70 MB trace) and can free none of them.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _read_trace(os.fspath(path), role)
    finally:
        if was_enabled:
            gc.enable()


def _read_trace(name: str, role: str | None) -> Trace:
    header: TraceHeader | None = None
    records: list[PromptRecord] = []
    seen: dict[str, int] = {}
    cost = 0
    for lineno, raw in _lines(name):
        line_cost = _line_cost(raw) + len(raw)
        if cost + line_cost > MAX_TRACE_COST:
            why = (
                f"the records up to here would take about {(cost + line_cost) / 2**20:,.0f} MiB of memory "
                f"(mostly lists or objects); the file is refused (limit {MAX_TRACE_COST / 2**20:,.0f} MiB "
                "for a whole trace)"
            )
            raise TraceError(name, lineno, None, why)
        if header is None:
            try:
                obj = _loads(name, lineno, raw)
                _check_unique_keys(name, lineno, raw, obj, _walked_keys(name, lineno, obj))
                header = _parse_header(name, lineno, obj)
            except TraceError as exc:
                raise _report_instead(name, exc) from None
            if role is not None and header.role != role:
                raise TraceError(name, lineno, "role", f"expected {_article(role)} {role} trace, found {header.role!r}")
            continue
        obj = _loads(name, lineno, raw)
        if type(obj) is dict:
            _check_unique_keys(name, lineno, raw, obj, _walked_keys(name, lineno, obj, skip=_FLAT_FIELDS))
        rec = _parse_record(name, lineno, obj, header)
        if rec.id in seen:
            raise TraceError(name, lineno, "id", f"duplicate id {rec.id!r} (first on line {seen[rec.id]})")
        seen[rec.id] = lineno
        records.append(rec)
        # What stays: the line's estimate, less what the compact arrays saved.
        cost += max(len(raw), line_cost - _compacted(rec.top_logprobs) - _compacted(rec.forced_top_logprobs))
    if header is None:
        raise TraceError(name, None, None, "empty file: a trace needs a header line")
    return Trace(header=header, records=tuple(records), path=name)


# A gate JSON report opens with its `gate_report` key, written first (pretty or compact).
_REPORT_START = re.compile(rb'\A\s*\{\s*"gate_report"\s*:')
REPORT_NOT_TRACE = (
    "is a gate JSON report (`gate_report`), not a trace (JSON Lines whose first line is a `gate_trace` "
    "header): `gate run --candidate-trace` and `gate compare` read traces; `gate diff BASE NEW` compares two reports"
)


def _report_instead(name: str, exc: TraceError) -> TraceError:
    """The error for a file whose first line is no trace header: a JSON report given where
    a trace goes is named for what it is (a regular file only: a pipe is not read twice)."""
    try:
        if not stat.S_ISREG(os.stat(name).st_mode):
            return exc
        with open(name, "rb") as fh:
            head = fh.read(4096)
    except OSError:
        return exc
    return TraceError(name, None, None, REPORT_NOT_TRACE) if _REPORT_START.match(head) else exc


def _article(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"


def _open(name: str) -> io.FileIO:
    try:
        return open(name, "rb", buffering=0)
    except IsADirectoryError:
        raise TraceError(name, None, None, "is a directory, not a trace file") from None
    except FileNotFoundError:
        raise TraceError(name, None, None, "no such file") from None
    except PermissionError:
        raise TraceError(name, None, None, "permission denied") from None
    except OSError as exc:
        raise TraceError(name, None, None, f"cannot read: {exc.strerror or exc}") from None


def _read_chunk(name: str, fh: io.FileIO) -> bytes:
    try:
        return fh.read(_READ_CHUNK) or b""
    except OSError as exc:
        raise TraceError(name, None, None, f"cannot read: {exc.strerror or exc}") from None


def _too_long(name: str, lineno: int) -> TraceError:
    return TraceError(name, lineno, None, f"line is longer than the {MAX_LINE_BYTES}-byte limit; refused unread")


def _lines(name: str) -> Iterator[tuple[int, bytes]]:
    """Yield (line number, line) for each non-blank line, streaming the file in chunks.

    Memory stays within MAX_LINE_BYTES plus one chunk whatever the file holds: a line
    that passes the limit (a corrupt file, a sparse file, /dev/zero) is refused there,
    before the rest of it is read.
    """
    with _open(name) as fh:
        lineno = 0
        head: list[bytes] = []  # the start of a line that runs past the chunk it began in
        head_len = 0
        while chunk := _read_chunk(name, fh):
            start = 0
            end = chunk.find(b"\n")
            while end >= 0:
                lineno += 1
                line = chunk[start:end]
                if head:
                    if head_len + len(line) > MAX_LINE_BYTES:
                        raise _too_long(name, lineno)
                    head.append(line)
                    line = b"".join(head)
                    head, head_len = [], 0
                if line.strip():
                    yield lineno, line
                start = end + 1
                end = chunk.find(b"\n", start)
            if start < len(chunk):
                head_len += len(chunk) - start
                if head_len > MAX_LINE_BYTES:
                    raise _too_long(name, lineno + 1)
                head.append(chunk[start:])
        if head:
            line = b"".join(head)
            if line.strip():
                _check_not_cut(name, lineno + 1, line)
                yield lineno + 1, line


def _check_not_cut(name: str, lineno: int, line: bytes) -> None:
    # Writers end every line with a newline; a last line without one that stops mid-JSON
    # is a truncated file (a killed writer, a partial copy), not merely bad JSON.
    if len(line) >= _COST_CHECK_BYTES and _line_cost(line) > MAX_LINE_COST:
        return  # refused unparsed by _loads
    try:
        orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        cut = "end of data" in exc.msg
        if not cut and "utf-8" in exc.msg.lower():
            try:  # cut inside a multi-byte character?
                line.decode("utf-8")
            except UnicodeDecodeError as err:
                cut = err.reason == "unexpected end of data"
        if cut:
            raise TraceError(name, lineno, None, f"the file ends mid-line (truncated?): {exc.msg}") from None


def _compacted(top: Any) -> int:
    """What parsing `top` was estimated to cost (see _line_cost), when it is now kept as arrays."""
    if not isinstance(top, TopLogprobs):
        return 0
    n, k = top.ids.shape
    return 64 * (1 + n + n * k) + 32 * (2 * n * k) - 16 * n * k


def _line_cost(raw: bytes) -> int:
    return parse_cost(raw)


def _loads(name: str, lineno: int, raw: bytes) -> Any:
    if len(raw) >= _COST_CHECK_BYTES and (cost := _line_cost(raw)) > MAX_LINE_COST:
        why = (
            f"parsing this line would take about {cost / 2**30:.1f} GiB of memory ({len(raw):,} bytes of "
            f"mostly lists or objects); refused unparsed (limit {MAX_LINE_COST / 2**30:.0f} GiB)"
        )
        raise TraceError(name, lineno, None, why)
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        msg = str(exc)
        if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
            raise TraceError(name, lineno, None, "not UTF-8: the file looks like UTF-16; save it as UTF-8") from None
        if raw.startswith(b"\xef\xbb\xbf"):
            why = "starts with a byte order mark (BOM); save it as UTF-8 without one"
            raise TraceError(name, lineno, None, why) from None
        if "utf-8" in msg.lower() or "utf8" in msg.lower():
            raise TraceError(name, lineno, None, f"not valid UTF-8 ({exc.msg}, at character {exc.pos})") from None
        near = raw[max(exc.pos - 1, 0) : exc.pos + 9].decode("utf-8", "replace")
        if "NaN" in near or "Infinity" in near:  # what Python's json.dumps writes for them
            why = f"bad JSON: NaN and Infinity are not JSON numbers, and logprobs must be finite ({msg})"
            raise TraceError(name, lineno, None, why) from None
        raise TraceError(name, lineno, None, f"bad JSON: {msg}") from None


def _walked_keys(name: str, lineno: int, obj: Any, skip: frozenset[str] = frozenset()) -> int:
    """How many keys the objects of one line hold, all levels down, and a field nested
    deeper than MAX_JSON_DEPTH refused (gate walks, compares and writes what it keeps).

    The fields in `skip` are not walked: their own checks refuse any object or nesting in
    them element by element (and show a bad value cut, `shown`), and they are the bulk of
    a trace. A line that is no object holds no keys here; its parse refuses it."""
    if type(obj) is not dict:
        return 0
    total = len(obj)
    for key, value in obj.items():
        if key in skip:
            continue
        keys, depth = keys_and_depth(value)
        if depth + 1 > MAX_JSON_DEPTH:
            why = (
                f"nested {depth + 1} levels deep in its line, more than {MAX_JSON_DEPTH} levels: no trace "
                "field comes near it; refused"
            )
            raise TraceError(name, lineno, key, why)
        total += keys
    return total


class _DuplicateKey(Exception):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _check_unique_keys(name: str, lineno: int, raw: bytes, obj: Any, keys: int) -> None:
    """Refuse a line whose objects repeat a key: orjson keeps the last value, other readers
    the first, so the file means different things to different tools.

    Fast: every key is followed by one colon outside strings, so when the line holds no
    more colons than the parsed objects hold keys, no key was repeated (one `count` in C;
    colons inside strings, e.g. a prompt's text, cost one more pass that skips strings).
    Only a line that fails both is parsed again, slowly, to name the key.
    """
    colons = raw.count(b":")
    if colons == keys:
        return
    if colons > keys and _JSON_STRING.sub(b"", raw).count(b":") == keys:
        return
    try:
        json.loads(raw, object_pairs_hook=_no_duplicates)
    except _DuplicateKey as dup:
        key = str(dup.args[0])
        why = (
            "appears twice in one JSON object; refused, because readers disagree on which value "
            "counts (orjson takes the last, others the first)"
        )
        raise TraceError(name, lineno, key, why) from None
    except (ValueError, RecursionError):
        pass  # not for this check to judge: an object where none belongs is refused later


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
        why = f"unsupported trace version {ver} (this gate reads version {TRACE_VERSION})"
        raise TraceError(name, lineno, "gate_trace", why)
    role = obj.get("role")
    if role not in ROLES:
        raise TraceError(name, lineno, "role", f"must be 'oracle' or 'candidate', found {role!r}")
    model = obj.get("model")
    if not isinstance(model, str) or not model:
        raise TraceError(name, lineno, "model", "missing or not a non-empty string")
    top_k = obj.get("top_k")
    if type(top_k) is not int or top_k < (1 if role == "oracle" else 0):
        need = "an integer >= 1" if role == "oracle" else "an integer >= 0"
        raise TraceError(name, lineno, "top_k", f"must be {need}, found {top_k!r}")
    engine = obj.get("engine")
    if not isinstance(engine, dict):
        raise TraceError(name, lineno, "engine", "missing or not an object")
    for key in ("name", "version"):
        if not isinstance(engine.get(key), str):
            raise TraceError(name, lineno, f"engine.{key}", "missing or not a string")
    check_header_fields(name, lineno, obj)
    extra = {k: v for k, v in obj.items() if k not in _HEADER_KEYS}
    if "moe" in extra:  # MoE routing (docs/guides/moe-routing.md): absent for dense models
        parse_moe_header(name, lineno, extra["moe"])
    return TraceHeader(role=role, model=model, top_k=top_k, engine=engine, extra=extra)


def _int_list(name: str, lineno: int, fld: str, value: Any) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise TraceError(name, lineno, fld, f"must be a list of token ids, found {type(value).__name__}")
    if not value or (set(map(type, value)) <= _INT and min(value) >= 0):
        return tuple(value)
    for i, t in enumerate(value):
        if not _is_int(t):
            raise TraceError(name, lineno, f"{fld}[{i}]", f"token id must be an integer, found {shown(t)}")
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
        raise TraceError(name, lineno, "id", f"must be a non-empty string, found {shown(rid)}")
    for req in ("prompt_token_ids", "token_ids"):
        if req not in obj:
            raise TraceError(name, lineno, req, f"missing (prompt {rid!r})")
    prompt_ids = _int_list(name, lineno, "prompt_token_ids", obj["prompt_token_ids"])
    token_ids = _int_list(name, lineno, "token_ids", obj["token_ids"])
    oracle = header.role == "oracle"

    top = obj.get("top_logprobs")
    if top is None:
        if oracle:
            why = f"missing: an oracle record needs top-k logprobs (prompt {rid!r})"
            raise TraceError(name, lineno, "top_logprobs", why)
    else:
        if header.top_k == 0:
            why = "the header's top_k is 0 (no logprobs), but this record carries top-k lists"
            raise TraceError(name, lineno, "top_logprobs", why)
        top = check_top_logprobs(name, lineno, top, token_ids, oracle=oracle, top_k=header.top_k)

    finish = obj.get("finish_reason")
    if finish not in FINISH_REASONS:
        raise TraceError(name, lineno, "finish_reason", f"must be 'length', 'stop' or null, found {shown(finish)}")
    prompt = obj.get("prompt")
    if prompt is not None and not isinstance(prompt, str):
        raise TraceError(name, lineno, "prompt", "must be a string")
    tokens = obj.get("tokens")
    if tokens is not None:
        if not isinstance(tokens, list) or not set(map(type, tokens)) <= _STR:
            raise TraceError(name, lineno, "tokens", "must be a list of strings")
        if len(tokens) != len(token_ids):
            raise TraceError(name, lineno, "tokens", f"has {len(tokens)} entries for {len(token_ids)} token ids")
    logits = obj.get("token_logits")
    if "token_logits" in obj:
        _check_token_logits(name, lineno, logits, token_ids)
    forced = obj.get("forced_token_ids")
    forced_ids: tuple[int, ...] | None = None
    if forced is not None:
        if oracle:
            raise TraceError(name, lineno, "forced_token_ids", "is for candidate traces only")
        forced_ids = _int_list(name, lineno, "forced_token_ids", forced)
    forced_top = obj.get(FORCED_TOP_KEY)
    if forced_top is not None:
        forced_top = check_forced_top(name, lineno, forced_top, forced_ids, header, oracle)
    mode = obj.get("forced_mode")
    _check_forced_mode(name, lineno, mode, forced_ids)
    check_routing_fields(
        name,
        lineno,
        obj,
        header.extra.get("moe"),
        prompt_len=len(prompt_ids),
        generated=len(token_ids),
        forced=len(forced_ids) if forced_ids is not None else None,
        oracle=oracle,
    )
    return PromptRecord(
        id=rid,
        prompt_token_ids=prompt_ids,
        token_ids=token_ids,
        top_logprobs=top,
        finish_reason=finish,
        prompt=prompt,
        tokens=tuple(tokens) if tokens is not None else None,
        forced_token_ids=forced_ids,
        extra={k: v for k, v in obj.items() if k not in _RECORD_KEYS and k not in _EVIDENCE_SET},
        token_logits=logits,
        routed_experts=obj.get(ROUTED_EXPERTS),
        router_top=obj.get(ROUTER_TOP),
        forced_mode=mode,
        forced_routed_experts=obj.get(FORCED_ROUTED_EXPERTS),
        forced_router_top=obj.get(FORCED_ROUTER_TOP),
        forced_top_logprobs=forced_top,
    )


def check_forced_top(
    name: str,
    lineno: int | None,
    value: Any,
    forced_ids: Sequence[int] | None,
    header: TraceHeader,
    oracle: bool,
    *,
    where: str = "",
) -> Sequence[TopList]:
    """`forced_top_logprobs`: the candidate's own top-k at each teacher-forced position,
    checked exactly as `top_logprobs` is (logprob <= 0 and finite, sorted, no repeated id,
    integer ids, within the header's top_k plus the chosen token), and only beside the
    `forced_token_ids` it describes. Once per record, in linear time."""
    fld = where + FORCED_TOP_KEY
    if oracle:
        raise TraceError(name, lineno, fld, "is for candidate traces only")
    if forced_ids is None:
        why = "needs forced_token_ids in the same record (forced lists without a forced decode to describe)"
        raise TraceError(name, lineno, fld, why)
    if header.top_k == 0:
        why = "the header's top_k is 0 (no logprobs), but this record carries forced top-k lists"
        raise TraceError(name, lineno, fld, why)
    compact = isinstance(value, TopLogprobs) and len(value) == len(forced_ids)
    if compact and value.ids.shape[1] <= header.top_k + 1:
        return value  # the reader's own arrays: validated when made
    return check_top_logprobs(name, lineno, value, forced_ids, oracle=False, fld=fld, top_k=header.top_k)


def _check_forced_mode(name: str, lineno: int, value: Any, forced_ids: Sequence[int] | None) -> None:
    """`forced_mode`: which path gave the forced data, `"decode"` or `"prefill"` (null: none),
    and only beside the `forced_token_ids` it describes."""
    if value is None:
        return
    if value not in FORCED_MODES or type(value) is not str:
        why = f"must be 'decode' or 'prefill' (the path that gave the forced data), found {shown(value)}"
        raise TraceError(name, lineno, "forced_mode", why)
    if forced_ids is None:
        why = "needs forced_token_ids in the same record (a forced mode without a forced decode to describe)"
        raise TraceError(name, lineno, "forced_mode", why)


def _check_token_logits(name: str, lineno: int, value: Any, token_ids: Sequence[int]) -> None:
    """`token_logits`: one finite, plausible number per generated token.

    With the position's logprob lp it implies the log-normaliser Z = logit - lp, which is
    >= the logit because lp <= 0 (checked with the lists); what remains to check is the
    logit itself: a number, finite, and |logit| <= MAX_ABS_LOGIT.
    """
    fld = "token_logits"
    if not isinstance(value, list):
        found = type(value).__name__
        raise TraceError(name, lineno, fld, f"must be a list of numbers (one logit per token), found {found}")
    if len(value) != len(token_ids):
        raise TraceError(name, lineno, fld, f"has {len(value)} logits for {len(token_ids)} generated tokens")
    if not value:
        return
    if set(map(type, value)) <= _NUM:
        try:
            if max(map(abs, value)) <= MAX_ABS_LOGIT:
                return
        except OverflowError:  # an integer past float's range
            pass
    for i, v in enumerate(value):
        where = f"{fld}[{i}]"
        if not _is_num(v):
            raise TraceError(name, lineno, where, f"a logit must be a number, found {shown(v)}")
        if type(v) is int and abs(v) > _MAX_FLOAT_INT:
            raise TraceError(name, lineno, where, f"logit {v} is out of range")
        if not math.isfinite(v) or abs(v) > MAX_ABS_LOGIT:
            raise TraceError(
                name,
                lineno,
                where,
                f"logit {v!r} is not plausible: |logit| must be at most {MAX_ABS_LOGIT:g} (it sizes the "
                "dtype's grid step for --near-tie-ulps; a tampered one would ratify any gap)",
            )


def check_top_logprobs(
    name: str,
    lineno: int | None,
    top: Any,
    token_ids: Sequence[int],
    *,
    oracle: bool,
    fld: str = "top_logprobs",
    top_k: int | None = None,
) -> Sequence[TopList]:
    """Validate one record's top-k lists (TraceError naming the first bad element) and return
    them, as a compact `TopLogprobs` when every position has the same k (the rule for an
    oracle), else as given.

    With `top_k` (the header's), a list may hold at most that many pairs; a candidate's one
    more, the chosen token when it falls outside its top-k (vLLM lists it so)."""
    if not isinstance(top, list):
        raise TraceError(name, lineno, fld, "must be a list (one top-k list per generated position)")
    if len(top) != len(token_ids):
        raise TraceError(name, lineno, fld, f"has {len(top)} positions for {len(token_ids)} generated tokens")
    if not top:
        return top
    if top_k is not None:
        _check_list_lengths(name, lineno, fld, top, top_k, oracle)
    compact = _fast_top(top, token_ids, oracle)
    if compact is not None:
        return compact
    for i, pos in enumerate(top):
        _check_position(name, lineno, f"{fld}[{i}]", pos, token_ids[i], oracle)
    return top


def _check_list_lengths(name: str, lineno: int | None, fld: str, top: list[Any], top_k: int, oracle: bool) -> None:
    most = top_k if oracle else top_k + 1
    if set(map(type, top)) <= _LIST and max(map(len, top)) <= most:
        return
    for i, pos in enumerate(top):
        if isinstance(pos, list) and len(pos) > most:
            beyond = "" if oracle else " (a candidate's top-k plus its chosen token)"
            why = f"holds {len(pos)} pairs, but the header's top_k is {top_k}: at most {most}{beyond}"
            raise TraceError(name, lineno, f"{fld}[{i}]", why)


def _too_much_mass(name: str, lineno: int | None, fld: str, mass: float) -> TraceError:
    why = (
        f"the list's probabilities add up to {mass:.6g}, more than 1 (allowed: {MAX_TOP_MASS:g} for "
        "rounding): not one softmax's top-k"
    )
    return TraceError(name, lineno, fld, why)


def _fast_top(top: list[Any], token_ids: Sequence[int], oracle: bool) -> TopLogprobs | None:
    """The lists as arrays when every rule holds; None means 'look closer', never 'invalid'.

    A trace is mostly top-k lists, so this is the reader's hot loop: every Python object is
    touched once, by C code (zip, array), and the rules run on the arrays.
    """
    if set(map(type, top)) != _LIST:
        return None
    lengths = set(map(len, top))
    if len(lengths) != 1:
        return None
    k = lengths.pop()
    if k == 0:
        return None
    try:
        # strict: every pair has the same length, and unpacking makes it exactly 2.
        ids_t, lps_t = zip(*chain.from_iterable(top), strict=True)
        # array('q') takes only integers (no floats, strings, lists, None); array('d') only
        # numbers. Both also take bools, checked below.
        ids = np.frombuffer(array("q", ids_t), dtype=np.int64).reshape(len(top), k)
        lps = np.frombuffer(array("d", lps_t), dtype=np.float64).reshape(len(top), k)
    except (TypeError, ValueError, OverflowError):
        return None
    hi, lo = lps.max(), lps.min()
    if not (hi <= 0.0 and lo > -np.inf) or ids.min() < 0:  # also false for NaN
        return None
    # A JSON true/false would read as id 1/0 or logprob 0.0 (true as 1.0 fails above): only
    # where such values occur are the types checked one by one.
    if ids.min() <= 1 and not set(map(type, ids_t)) <= _INT:
        return None
    if hi == 0.0 and not set(map(type, lps_t)) <= _NUM:
        return None
    a, b = lps[:, :-1], lps[:, 1:]
    if not (a >= b).all():
        return None
    ties = a == b
    if ties.any() and not (ids[:, :-1][ties] < ids[:, 1:][ties]).all():
        return None
    if k > 1:
        srt = np.sort(ids, axis=1)
        if (srt[:, 1:] == srt[:, :-1]).any():
            return None
        if np.exp(lps).sum(axis=1).max() > MAX_TOP_MASS:
            return None
    # The greedy choice heads its list (ties go to the lowest id, as with torch.argmax).
    if oracle:
        try:
            chosen = np.fromiter(token_ids, dtype=np.int64, count=len(token_ids))
        except OverflowError:  # an id past int64: JSON (and orjson) go up to 2**64 - 1
            return None
        if not np.array_equal(ids[:, 0], chosen):
            return None
    return TopLogprobs(ids, lps)


def _check_position(name: str, lineno: int | None, fld: str, pos: Any, chosen: int, oracle: bool) -> None:
    if not isinstance(pos, list):
        raise TraceError(name, lineno, fld, "must be a list of [token_id, logprob] pairs")
    if oracle and not pos:
        raise TraceError(name, lineno, fld, "is empty: an oracle position must list its chosen token")
    seen: set[int] = set()
    prev: tuple[float, int] | None = None
    for j, pair in enumerate(pos):
        where = f"{fld}[{j}]"
        if not isinstance(pair, list) or len(pair) != 2:
            raise TraceError(name, lineno, where, f"must be a [token_id, logprob] pair, found {shown(pair)}")
        tid, lp = pair
        if not _is_int(tid):
            raise TraceError(name, lineno, where, f"token id must be an integer, found {shown(tid)}")
        if tid < 0:
            raise TraceError(name, lineno, where, f"negative token id {tid}")
        if not _is_num(lp):
            raise TraceError(name, lineno, where, f"logprob must be a number, found {shown(lp)}")
        if type(lp) is int and abs(lp) > _MAX_FLOAT_INT:
            raise TraceError(name, lineno, where, f"logprob {lp} is out of range")
        if math.isnan(lp) or math.isinf(lp):
            raise TraceError(name, lineno, where, f"logprob is {lp}: NaN and infinite logprobs are not allowed")
        if lp > 0:
            raise TraceError(name, lineno, where, f"logprob {lp!r} is above 0")
        if tid in seen:
            raise TraceError(name, lineno, where, f"token id {tid} appears twice in one top-k list")
        seen.add(tid)
        if prev is not None and not (lp < prev[0] or (lp == prev[0] and tid > prev[1])):
            raise TraceError(
                name,
                lineno,
                where,
                f"out of order: [{tid}, {lp!r}] after [{prev[1]}, {prev[0]!r}] "
                "(lists are sorted by logprob descending, then token id ascending)",
            )
        prev = (float(lp), tid)
    mass = math.fsum(math.exp(lp) for _, lp in pos)
    if mass > MAX_TOP_MASS:
        raise _too_much_mass(name, lineno, fld, mass)
    if not oracle:
        return
    if chosen not in seen:
        raise TraceError(name, lineno, fld, f"does not contain the chosen token {chosen}")
    best_id, best_lp = pos[0]
    if best_id != chosen:
        chosen_lp = next(lp for t, lp in pos if t == chosen)
        if chosen_lp == best_lp:
            why = (
                f"the oracle chose {chosen} at an exact tie with {best_id}; torch.argmax (vLLM's greedy "
                "sampler) takes the lowest id among equal maxima, so this record is inconsistent"
            )
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
