"""Reading a trace file (trace v1, docs/spec.md): bounded in memory before parsing, every
malformed input the spec lists refused naming file, line and field."""

from __future__ import annotations

import gc
import io
import json
import os
import re
import stat
from collections.abc import Iterator
from typing import Any

import orjson

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
from gate.core.traces.trace import (
    EVIDENCE_SET,
    FINISH_REASONS,
    FORCED_TOP_KEY,
    ROLES,
    TRACE_VERSION,
    PromptRecord,
    TopLogprobs,
    Trace,
    TraceHeader,
)
from gate.core.traces.validate import (
    INT_ONLY,
    STR_ONLY,
    check_forced_mode,
    check_forced_top,
    check_token_logits,
    check_top_logprobs,
    is_int,
)
from gate.errors import TraceError

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
# A JSON string in raw bytes (escapes included), for counting the colons outside strings.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
# Record fields that hold no JSON object when valid: objects inside them are refused by
# validation anyway, so the duplicate-key count need not look inside.
_FLAT_FIELDS = frozenset(_RECORD_KEYS) | {"token_logits", FORCED_TOP_KEY}


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


def _parse_header(name: str, lineno: int, obj: Any) -> TraceHeader:
    if not isinstance(obj, dict):
        raise TraceError(name, lineno, None, "the header must be a JSON object")
    if "gate_trace" not in obj:
        raise TraceError(name, lineno, "gate_trace", "missing: line 1 must be a gate trace header")
    ver = obj["gate_trace"]
    if not is_int(ver):
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
    if not value or (set(map(type, value)) <= INT_ONLY and min(value) >= 0):
        return tuple(value)
    for i, t in enumerate(value):
        if not is_int(t):
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
        if not isinstance(tokens, list) or not set(map(type, tokens)) <= STR_ONLY:
            raise TraceError(name, lineno, "tokens", "must be a list of strings")
        if len(tokens) != len(token_ids):
            raise TraceError(name, lineno, "tokens", f"has {len(tokens)} entries for {len(token_ids)} token ids")
    logits = obj.get("token_logits")
    if "token_logits" in obj:
        check_token_logits(name, lineno, logits, token_ids)
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
    check_forced_mode(name, lineno, mode, forced_ids)
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
        extra={k: v for k, v in obj.items() if k not in _RECORD_KEYS and k not in EVIDENCE_SET},
        token_logits=logits,
        routed_experts=obj.get(ROUTED_EXPERTS),
        router_top=obj.get(ROUTER_TOP),
        forced_mode=mode,
        forced_routed_experts=obj.get(FORCED_ROUTED_EXPERTS),
        forced_router_top=obj.get(FORCED_ROUTER_TOP),
        forced_top_logprobs=forced_top,
    )
