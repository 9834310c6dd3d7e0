"""Writes that never leave a half-written file behind.

Every file gate produces (pins, goldens, traces, reports) goes through `atomic_write`: the
bytes land in a temporary file in the target's own folder, are fsynced, and replace the
target with one `os.replace`, which POSIX makes atomic. A crash or SIGKILL at any instant
leaves either the old file or the new one, never a mix.

Nothing is lost: `check_target` is the rule every writing command applies before any work
(never over an input, never over a file of another kind, --force only for the same kind),
and `atomic_write` refuses again, at the write, to replace a file of another kind.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import stat
import time
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

import orjson

from gate.errors import InputError

# The temporary files this module names: `.NAME.<12 hex digits>.tmp` (`_create_temp`, and
# `_keep_backup`'s copy). Only files of exactly this shape are ever cleaned up.
_TEMP_NAME = re.compile(r"\..+\.[0-9a-f]{12}\.tmp")


def same_file(path: str | os.PathLike[str], others: Iterable[str | os.PathLike[str] | None]) -> str | None:
    """The first of `others` that is the very file `path` names (by identity: st_dev and
    st_ino, so through symlinks and hard links too), else None. Paths that do not exist
    are no file."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    for other in others:
        if other is None:
            continue
        try:
            ot = os.stat(other)
        except OSError:
            continue
        if (ot.st_dev, ot.st_ino) == (st.st_dev, st.st_ino):
            return os.fspath(other)
    return None


# The kinds of file gate writes, told apart by their content (the first line's header, or
# the JSON object of a small file). A report carries no marker (Markdown, text, JSON, HTML,
# JUnit), so REPORT stands for "none of gate's data files": a user's own file too.
PIN = "pin (oracle trace)"
GOLDEN = "golden"
PROGRESS = "progress file"
TRACE = "candidate trace"
SUITE = "prompt list (a suite, or exported prompts)"
SETTINGS = "oracle settings (oracle.json)"
REPORT = "report"
# A file whose first line is a JSON object too long to read whole: of no kind gate can
# tell, so nothing replaces it (it is no report either).
UNTOLD = "file whose first line is too long to tell its kind"
# What is read to tell a kind: most header lines are far shorter; oracle.json a few kB.
_KIND_BYTES = 1024 * 1024
# A first line longer than _KIND_BYTES (a pin's header with the hashes of a large suite's
# prompts) is read on to its end, up to this: a trace reader's own limit on a line.
MAX_KIND_LINE_BYTES = 256 * 1024 * 1024
# The key only a progress file's header carries (gate.workflows.common.progress).
PROGRESS_KEY = "gate_progress"
_LEGACY_PROGRESS_SUFFIX = ".partial.jsonl"
# The keys oracle.json may hold (its reader refuses any other).
_SETTINGS_KEYS = frozenset(
    {"model", "engine", "dtype", "revision", "notes", "max_tokens", "top_k", "tensor_parallel_size"}
    | {"pipeline_parallel_size", "max_model_len", "engine_options", "doctrine"}
)


def kind_of(head: bytes, name: str = "") -> str:
    """The kind of a file that begins with `head` (its first `_KIND_BYTES`, or its whole
    first line when that is longer: `kind_head`), named `name`. The first line is the first
    non-blank one, as the trace reader takes it (it skips blank lines)."""
    line = head.lstrip().split(b"\n", 1)[0]
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        if len(line) >= _KIND_BYTES and line.lstrip().startswith(b"{"):
            return UNTOLD  # a first line cut short: a header gate cannot read, never a report
        try:
            obj = orjson.loads(head) if len(head) < _KIND_BYTES else None
        except orjson.JSONDecodeError:
            obj = None
        if (
            isinstance(obj, dict)
            and "verdict" not in obj
            and "engine" in obj
            and ("top_k" in obj or "max_tokens" in obj)
        ):
            return SETTINGS
        return REPORT
    if not isinstance(obj, dict):
        return REPORT
    if "gate_trace" in obj:
        if PROGRESS_KEY in obj:
            return PROGRESS
        if "golden" in obj:
            return GOLDEN
        if obj.get("role") == "oracle":
            return PIN
        if "engine_options" in obj and name.endswith(_LEGACY_PROGRESS_SUFFIX):
            return PROGRESS  # written before progress headers were marked
        return TRACE
    if "id" in obj and any(k in obj for k in ("text", "messages", "prompt_token_ids")):
        return SUITE
    return SETTINGS if _is_settings(obj) else REPORT  # oracle.json on one line, or a report


def _is_settings(obj: object) -> bool:
    """oracle.json: an object of only the settings its reader knows (gate.core.pins.oracle_settings)."""
    return isinstance(obj, dict) and bool(obj) and set(obj) <= _SETTINGS_KEYS


def file_kind(path: str | os.PathLike[str]) -> str | None:
    """The kind of the file at `path`; None when there is none, it is empty (nothing to
    lose), or it is no regular file (never opened here: a FIFO would block; `atomic_write`
    refuses to replace one)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        with open(path, "rb") as fh:
            head = _read_head(fh)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    except OSError:
        return REPORT  # unreadable: no kind gate can vouch for
    if not head.strip():
        return None
    return kind_of(head, Path(path).name)


def _read_head(fh: BinaryIO) -> bytes:
    """What `kind_of` reads of a file: its first `_KIND_BYTES`, and on, when its first
    non-blank line runs past them, to that line's end (up to `MAX_KIND_LINE_BYTES` in all)."""
    parts: list[bytes] = []
    size = 0
    started = False  # the first non-blank line has begun
    while size < MAX_KIND_LINE_BYTES:
        chunk = fh.read(min(_KIND_BYTES, MAX_KIND_LINE_BYTES - size))
        if not chunk:
            break
        parts.append(chunk)
        size += len(chunk)
        if not started:
            rest = chunk.lstrip()
            started = bool(rest)
            if b"\n" in rest:
                break
        elif b"\n" in chunk:
            break
    return b"".join(parts)


def kind_head(data: bytes) -> bytes:
    """What `kind_of` reads of bytes about to be written: their first `_KIND_BYTES`, or on to
    the end of their first non-blank line when it is longer (up to `MAX_KIND_LINE_BYTES`)."""
    begin = len(data) - len(data.lstrip())
    end = data.find(b"\n", begin, MAX_KIND_LINE_BYTES)
    return data[: max(end + 1, _KIND_BYTES)] if end >= 0 else data[:MAX_KIND_LINE_BYTES]


def other_kind(name: str, kind: str, writes: str) -> str:
    """The one line that refuses to write a `writes` over a file of `kind`."""
    held = "file with no gate header (a report, or a file of your own)" if kind == REPORT else kind
    return (
        f"{name}: is a {held}; this writes a {writes} there, and gate never replaces a file of another "
        "kind, --force or not (name another file)"
    )


def append_problem(target: str | os.PathLike[str]) -> str | None:
    """Why a report may not be appended to `target` (the job summary), or None: only to a
    regular file, or none yet, that is no gate data file (`file_kind`)."""
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot be read: {exc.strerror or exc}"
    if not stat.S_ISREG(mode):
        return "is not a regular file (a directory, FIFO or device); the job summary must be one"
    kind = file_kind(target)
    if kind is not None and kind != REPORT:
        return f"is a {kind}; the job summary gets a report appended, and gate never writes into a file of another kind"
    return None


def append_regular(target: str | os.PathLike[str], text: str) -> None:
    """Append `text` to `target`, a regular file (made when missing): opened without
    blocking, so a FIFO put there since `append_problem` is refused (OSError), never waited on."""
    fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o644)
    with os.fdopen(fd, "a", encoding="utf-8") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise OSError(f"{target}: not a regular file")
        fh.write(text)


def check_target(
    path: str | os.PathLike[str],
    writes: str,
    *,
    force: bool,
    inputs: Iterable[str | os.PathLike[str] | None] = (),
    flag: str = "",
    message: str = "{flag}{path}: already exists; pass --force to replace it",
    error: type[InputError] = InputError,
) -> None:
    """The one rule for every file a command writes, checked before any work (exit 2):
    never one of the command's `inputs` (by identity: a symlink or hard link to an input is
    that input), never a file of another kind than `writes` (a trace over a pin, a golden
    over a progress file, a report over a golden), --force or not; an existing file of the
    same kind only with --force. `message` may name `{flag}` and `{path}`."""
    name = f"{flag} {path}" if flag else str(path)
    hit = same_file(path, inputs)
    if hit is not None:
        raise InputError(f"{name}: is the input {hit} (the same file); an input is never its own output")
    if not os.path.exists(path):
        return
    kind = file_kind(path)
    if kind is not None and kind != writes:
        raise InputError(other_kind(name, kind, writes))
    if not force:
        raise error(message.format(flag=f"{flag} " if flag else "", path=path))


def atomic_write(
    path: str | os.PathLike[str],
    data: bytes,
    *,
    overwrite: bool = False,
    backup: bool = False,
) -> Path | None:
    """Write `data` to `path` atomically.

    Refuses to replace an existing file unless `overwrite`; with `backup`, the file it
    replaces is kept beside it as `NAME.bak-YYYYmmdd-HHMMSS` (`-N` added when that name
    is taken: an earlier backup is never overwritten) and that path is returned. Without
    `overwrite`, a file that appears at `path` while this writes is not replaced either.
    Temporary files (`.NAME.<12 hex>.tmp`) that killed writers left in the folder are
    removed first.
    """
    target = Path(path)
    _check_replaceable(target)
    if target.exists() and not overwrite:
        raise InputError(f"{target}: already exists; pass --force to replace it")
    if overwrite:
        # The last line of defence of the rule `check_target` states: whatever a caller
        # checked before, a file of another kind than these bytes is never replaced.
        have, writes = file_kind(target), kind_of(kind_head(data), target.name)
        if have is not None and have != writes:
            raise InputError(other_kind(str(target), have, writes))
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        clean_stale_temps(target)
        fd, tmp = _create_temp(target)
    except PermissionError:
        # A place one cannot write to is a bad argument (exit 2), not an infrastructure fault.
        raise InputError(f"{target}: cannot write there: permission denied") from None
    except (NotADirectoryError, FileExistsError):
        raise InputError(f"{target}: cannot write there: a part of {target.parent} is a file, not a folder") from None
    kept: Path | None = None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
            if backup and target.exists():
                kept = _keep_backup(target)
            if overwrite:
                os.replace(tmp, target)
            else:
                _publish_new(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if kept is not None and target.exists() and os.path.samefile(kept, target):
            # Not replaced after all: drop the link, or an in-place edit of the target
            # (an append) would change the "backup" too.
            with contextlib.suppress(OSError):
                os.unlink(kept)
        raise
    _fsync_dir(target.parent)
    return kept


def _check_replaceable(target: Path) -> None:
    """Only regular files are ever replaced: a rename onto a symlink would replace the link
    (not what it points to), and onto a device, FIFO or socket (as root, `/dev/null`) would
    turn it into a plain file."""
    try:
        st = os.lstat(target)
    except (FileNotFoundError, NotADirectoryError):
        return  # a missing folder is made below; a file in the way is reported there
    except OSError as exc:
        raise InputError(f"{target}: cannot write there: {exc.strerror or exc}") from None
    if stat.S_ISLNK(st.st_mode):
        raise InputError(f"{target}: is a symbolic link; gate never replaces one (name the file it points to)")
    if stat.S_ISDIR(st.st_mode):
        raise InputError(f"{target}: is a directory")
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{target}: is not a regular file (a device, FIFO or socket); gate writes only regular files")


def clean_stale_temps(target: str | os.PathLike[str]) -> list[Path]:
    """Remove the temporary files killed writers left in `target`'s folder; return them.

    Any target's, not only `target`'s: a killed write of a report whose name is never
    written again would otherwise keep its full-size temporary file for good. Only names
    of this module's own shape (`.NAME.<12 hex>.tmp`) are considered.

    A live writer holds an exclusive lock on its temporary file until the rename, and the
    kernel drops the lock when a process dies (SIGKILL included), so a temporary file
    nobody holds locked is a leftover. (A file created an instant before its writer locks
    it could be taken for one: that writer then fails cleanly at the rename; the target
    is never touched.)
    """
    try:
        import fcntl
    except ImportError:  # not POSIX: leftovers stay, and are harmless
        return []
    target = Path(target)
    removed: list[Path] = []
    for tmp in target.parent.glob(".*.tmp"):
        if not _TEMP_NAME.fullmatch(tmp.name):
            continue
        try:
            fd = os.open(tmp, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # a live writer holds it
        else:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
                removed.append(tmp)
        finally:
            os.close(fd)
    return removed


def _create_temp(target: Path) -> tuple[int, str]:
    """A new temporary file beside `target`, locked for as long as this process lives.

    Unlike mkstemp's 0600, the file gets the target's permissions (or the umask's, for a
    new file), so replacing a readable pin never makes it unreadable to others.
    """
    mode = stat.S_IMODE(target.stat().st_mode) if target.exists() else 0o666
    for _ in range(100):
        tmp = str(target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp"))
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), mode)
        except FileExistsError:
            continue
        with contextlib.suppress(ImportError, OSError):
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_EX)
        if target.exists():
            with contextlib.suppress(OSError):
                os.chmod(fd, mode)  # os.open's mode passed through the umask
        return fd, tmp
    raise FileExistsError(f"{target}: cannot create a temporary file beside it")


def _keep_backup(target: Path) -> Path:
    """Keep the file about to be replaced as `NAME.bak-YYYYmmdd-HHMMSS[-N]`; never clobber one.

    A hard link keeps it whole at no cost and in one step (a SIGKILL never leaves half a
    backup); where links are not supported, a copy to a temporary name, then a rename.
    """
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(1000):
        kept = target.with_name(f"{target.name}.bak-{stamp}" + (f"-{n}" if n else ""))
        try:
            os.link(target, kept)
            return kept
        except FileExistsError:
            continue
        except OSError:
            if kept.exists():
                continue
            tmp = target.with_name(f".{kept.name}.{secrets.token_hex(6)}.tmp")
            shutil.copy2(target, tmp)
            os.replace(tmp, kept)
            return kept
    raise InputError(f"{target}: too many backups named {target.name}.bak-{stamp}-N")


def _publish_new(tmp: str, target: Path) -> None:
    """Rename `tmp` to `target` only if `target` still does not exist (no clobbering race)."""
    try:
        os.link(tmp, target)
    except FileExistsError:
        raise InputError(f"{target}: already exists; pass --force to replace it") from None
    except OSError:  # no hard links here: the check at the top is what we have
        os.replace(tmp, target)
        return
    os.unlink(tmp)


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
