"""A file's sha256, hashed once while the file is unchanged.

Hashing a model's weights costs a read of every byte (about 0.35 s for the default model's
270 MB here: two plain prefills of a diagnosis context). `known_sha256` keeps each digest in
gate's cache (`digests/`, one small JSON per file, named by the sha256 of the file's real
path) beside the file's identity when it was hashed: device, inode, size, and the
modification and status-change times in nanoseconds. A later call whose `os.stat` agrees on
all of them returns the kept digest; any difference (a rewrite, a replacement, a copy, a
touch) hashes again. The status-change time is the guard no tool sets back: every write and
every `touch` moves it. As in git's index, a file changed within the clock's granularity of
its hashing could keep its times, so a file modified less than `RACY_SECONDS` before it was
hashed is never kept. A kept digest that cannot be read or written is no digest: the file is
hashed.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from pathlib import Path
from typing import Any

import orjson

from gate.core.storage.files import file_sha256, gate_cache_dir

FORMAT = 1
RACY_SECONDS = 2.0
IDENTITY = ("dev", "ino", "size", "mtime_ns", "ctime_ns")


def digest_dir() -> Path:
    return gate_cache_dir() / "digests"


def identity(st: os.stat_result) -> dict[str, int]:
    return {
        "dev": st.st_dev,
        "ino": st.st_ino,
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "ctime_ns": st.st_ctime_ns,
    }


def known_sha256(path: str | os.PathLike[str]) -> str:
    """The sha256 of the file at `path` (symlinks followed), from gate's cache when the file
    is the one hashed before, else hashed now (and kept when it has settled)."""
    real = os.path.realpath(path)
    before = os.stat(real)
    entry = digest_dir() / (hashlib.sha256(real.encode("utf-8", "surrogateescape")).hexdigest()[:32] + ".json")
    kept = _read(entry)
    if kept is not None and kept.get("path") == real and {k: kept.get(k) for k in IDENTITY} == identity(before):
        sha = kept.get("sha256")
        if isinstance(sha, str) and len(sha) == 64:
            return sha
    started = time.time_ns()
    sha = file_sha256(real)
    after = os.stat(real)
    settled = started - max(after.st_mtime_ns, after.st_ctime_ns) >= RACY_SECONDS * 1e9
    if identity(after) == identity(before) and settled:
        _write(entry, {"gate_digest": FORMAT, "path": real, **identity(after), "sha256": sha})
    return sha


def _read(entry: Path) -> dict[str, Any] | None:
    try:
        data = orjson.loads(entry.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return data if isinstance(data, dict) and data.get("gate_digest") == FORMAT else None


def _write(entry: Path, data: dict[str, Any]) -> None:
    from gate.core.storage.atomic import atomic_write
    from gate.errors import InputError

    with contextlib.suppress(OSError, InputError):  # a cache that cannot be written is no cache
        atomic_write(entry, orjson.dumps(data), overwrite=True)
