"""Writes that never leave a half-written file behind.

Every file gate produces (pins, goldens, traces, reports) goes through `atomic_write`: the
bytes land in a temporary file in the target's own folder, are fsynced, and replace the
target with one `os.replace`, which POSIX makes atomic. A crash or SIGKILL at any instant
leaves either the old file or the new one, never a mix.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from pathlib import Path

from gate.errors import InputError


def atomic_write(
    path: str | os.PathLike[str],
    data: bytes,
    *,
    overwrite: bool = False,
    backup: bool = False,
) -> Path | None:
    """Write `data` to `path` atomically.

    Refuses to replace an existing file unless `overwrite`; with `backup`, the file it
    replaces is kept beside it as `NAME.bak-YYYYmmdd-HHMMSS` and that path is returned.
    """
    target = Path(path)
    if target.is_dir():
        raise InputError(f"{target}: is a directory")
    if target.exists() and not overwrite:
        raise InputError(f"{target}: already exists; pass --force to replace it")
    target.parent.mkdir(parents=True, exist_ok=True)
    kept: Path | None = None
    if backup and target.exists():
        kept = target.with_name(f"{target.name}.bak-{time.strftime('%Y%m%d-%H%M%S')}")
        shutil.copy2(target, kept)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(target.parent)
    return kept


def _fsync_dir(folder: Path) -> None:
    # The rename is durable only once the folder's entry is on disk.
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
