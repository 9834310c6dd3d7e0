"""A JSON document read from a file, bounded before it is parsed; every failure an
InputError naming the file.

What a file holds is checked before orjson sees it, as the trace reader does
(`gate.core.traces.trace`): no more than `max_bytes` is ever read, whatever the file is
(a device such as /dev/zero, a pipe, a sparse or growing file); its first byte must open
the kind of document asked for; what parsing it would cost in memory is estimated from its
bytes and refused past `MAX_JSON_COST`; and what was parsed nests no deeper than
`MAX_JSON_DEPTH`, so no later walk or message can run out of recursion.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import orjson

from gate.core.storage.json_shape import MAX_JSON_DEPTH, keys_and_depth, parse_cost
from gate.errors import InputError

# A gate report is a few MB at most; anything far larger is not one.
MAX_JSON_BYTES = 256 * 1024 * 1024
# What parsing may cost in memory, estimated before parsing (`parse_cost`): an honest report
# costs about twice its bytes; 100 MB of `[],` would take 3 GB.
MAX_JSON_COST = 1024 * 1024 * 1024
READ_CHUNK = 1024 * 1024
_JSON_SPACE = b" \t\r\n"


def read_json(
    path: str | os.PathLike[str],
    *,
    what: str = "JSON file",
    max_bytes: int | None = None,
    opens: bytes | None = None,
) -> Any:
    """The JSON document in `path`. `opens`, when given, holds the bytes the document may
    start with (`b"{"` for an object): anything else is refused after one read."""
    p = Path(path)
    limit = MAX_JSON_BYTES if max_bytes is None else max_bytes
    data = _read_bounded(p, what, limit, opens)
    cost = parse_cost(data)
    if cost > MAX_JSON_COST:
        raise InputError(
            f"{p}: parsing it would take about {cost / 2**20:,.0f} MiB of memory ({len(data):,} bytes of mostly "
            f"lists or objects); refused unparsed (limit {MAX_JSON_COST / 2**20:,.0f} MiB): not a {what}"
        )
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise InputError(f"{p}: not JSON ({exc}); expected a {what}") from None
    _, depth = keys_and_depth(value)
    if depth > MAX_JSON_DEPTH:
        raise InputError(f"{p}: nested {depth} levels deep, more than {MAX_JSON_DEPTH}: not a {what}")
    return value


def _read_bounded(p: Path, what: str, limit: int, opens: bytes | None) -> bytes:
    try:
        # Not blocking on the open: a FIFO nobody writes to is then read as empty.
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise InputError(f"{p}: cannot read the {what}: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise InputError(f"{p}: is a directory, not a {what}")
        if stat.S_ISREG(info.st_mode) and info.st_size > limit:
            raise InputError(f"{p}: {info.st_size} bytes: too large for a {what} (at most {limit})")
        os.set_blocking(fd, True)
        chunks: list[bytes] = []
        size = 0
        opened = opens is None
        while chunk := _read(fd, p, what, min(READ_CHUNK, limit + 1 - size)):
            if not opened and chunk.strip(_JSON_SPACE):
                _check_opening(p, what, chunk, opens or b"")
                opened = True
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise InputError(f"{p}: more than {limit} bytes: too large for a {what}; refused unread past that")
        data = b"".join(chunks)
    finally:
        os.close(fd)
    if opens is not None and not data.strip(_JSON_SPACE):
        raise InputError(f"{p}: empty: not a {what}")
    return data


def _read(fd: int, p: Path, what: str, n: int) -> bytes:
    try:
        return os.read(fd, n)
    except OSError as exc:
        raise InputError(f"{p}: cannot read the {what}: {exc.strerror or exc}") from None


def _check_opening(p: Path, what: str, chunk: bytes, opens: bytes) -> None:
    """The first byte that is not JSON whitespace (in the first chunk that has one) must be
    one of `opens`."""
    head = chunk.lstrip(_JSON_SPACE)
    if head and head[0] not in opens:
        if head.startswith((b"\xff\xfe", b"\xfe\xff")):
            found = "the file looks like UTF-16; save it as UTF-8"
        elif head.startswith(b"\xef\xbb\xbf"):
            found = "it starts with a byte order mark (BOM); save it as UTF-8 without one"
        else:
            found = f"it starts with byte 0x{head[0]:02x}, not {' or '.join(repr(chr(b)) for b in opens)}"
        raise InputError(f"{p}: not a {what}: {found}")
