"""Nothing lost: a SIGKILL at any instant of `atomic_write` leaves the old file or the new one.

The kill tests fork a child that writes slowly (its file writes cut into small, paced
pieces, and hooks that pause at each step), SIGKILL it, and look at what is on disk.
"""

from __future__ import annotations

import os
import random
import select
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gate.core.storage import atomic
from gate.core.storage.atomic import atomic_write, clean_stale_temps
from gate.errors import InputError

OLD = b"old pin\n" * 1000
NEW = bytes(range(256)) * 8192  # 2 MiB, unlike OLD at every length


def leftovers(target: Path) -> list[Path]:
    return sorted(target.parent.glob(f".{target.name}.*.tmp"))


def backups(target: Path) -> list[Path]:
    return sorted(target.parent.glob(f"{target.name}.bak-*"))


# --------------------------------------------------------------------------- plain behaviour


def test_writes_a_new_file_with_the_umask_mode(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "er" / "pin.jsonl"
    old_umask = os.umask(0o022)
    try:
        assert atomic_write(target, b"x") is None
    finally:
        os.umask(old_umask)
    assert target.read_bytes() == b"x"
    # mkstemp's 0600 would make a committed pin unreadable to everyone else.
    assert target.stat().st_mode & 0o777 == 0o644
    assert leftovers(target) == []


def test_replacing_keeps_the_mode(tmp_path: Path) -> None:
    target = tmp_path / "pin.jsonl"
    target.write_bytes(OLD)
    target.chmod(0o640)
    atomic_write(target, NEW, overwrite=True)
    assert target.read_bytes() == NEW
    assert target.stat().st_mode & 0o777 == 0o640


def test_refuses_to_replace_without_overwrite(tmp_path: Path) -> None:
    target = tmp_path / "pin.jsonl"
    target.write_bytes(OLD)
    with pytest.raises(InputError, match="already exists; pass --force"):
        atomic_write(target, NEW)
    assert target.read_bytes() == OLD
    assert leftovers(target) == []


def test_refuses_a_directory(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="is a directory"):
        atomic_write(tmp_path, b"x", overwrite=True)


def test_a_place_that_cannot_hold_files_is_an_input_error(tmp_path: Path) -> None:
    (tmp_path / "plain").write_bytes(b"")
    with pytest.raises(InputError, match=r"plain/out\.json: cannot write there: a part of .*plain is a file, not"):
        atomic_write(tmp_path / "plain" / "out.json", b"x")
    with pytest.raises(InputError, match=r"cannot write there"):
        atomic_write(tmp_path / "plain" / "sub" / "out.json", b"x")


def test_a_file_that_appears_meanwhile_is_not_clobbered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Another process creates the target after the existence check: without overwrite,
    # its file must survive and this write must fail.
    target = tmp_path / "pin.jsonl"
    real_clean = atomic.clean_stale_temps

    def intruder(t: Any) -> list[Path]:
        target.write_bytes(b"theirs")
        return real_clean(t)

    monkeypatch.setattr(atomic, "clean_stale_temps", intruder)
    with pytest.raises(InputError, match="already exists"):
        atomic_write(target, NEW)
    assert target.read_bytes() == b"theirs"
    assert leftovers(target) == []


def test_backup_keeps_what_it_replaces(tmp_path: Path) -> None:
    target = tmp_path / "pin.jsonl"
    target.write_bytes(OLD)
    kept = atomic_write(target, NEW, overwrite=True, backup=True)
    assert kept is not None and kept.parent == tmp_path
    assert kept.name.startswith("pin.jsonl.bak-")
    assert kept.read_bytes() == OLD
    assert target.read_bytes() == NEW
    # The backup is its own file: changing the target in place (an append) leaves it be.
    with open(target, "ab") as fh:
        fh.write(b"appended")
    assert kept.read_bytes() == OLD


def test_backup_of_nothing_is_none(tmp_path: Path) -> None:
    assert atomic_write(tmp_path / "new.jsonl", NEW, overwrite=True, backup=True) is None
    assert backups(tmp_path / "new.jsonl") == []


def test_backups_in_the_same_second_do_not_overwrite_each_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(time, "strftime", lambda fmt, *a: "20250101-000000")
    target = tmp_path / "pin.jsonl"
    target.write_bytes(b"v1")
    first = atomic_write(target, b"v2", overwrite=True, backup=True)
    second = atomic_write(target, b"v3", overwrite=True, backup=True)
    assert first is not None and second is not None and first != second
    assert first.read_bytes() == b"v1", "the first backup, of the original, was overwritten"
    assert second.read_bytes() == b"v2"
    assert target.read_bytes() == b"v3"


def test_backup_without_hard_links(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # File systems without hard links (some network and FUSE mounts): a copy, then a rename.
    def no_links(*a: Any, **k: Any) -> None:
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    target = tmp_path / "pin.jsonl"
    target.write_bytes(OLD)
    kept = atomic_write(target, NEW, overwrite=True, backup=True)
    assert kept is not None and kept.read_bytes() == OLD
    assert target.read_bytes() == NEW
    assert leftovers(target) == [] and leftovers(kept) == []


def test_a_failed_rename_leaves_everything_as_it_was(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*a: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken)
    target = tmp_path / "pin.jsonl"
    target.write_bytes(OLD)
    with pytest.raises(OSError, match="No space"):
        atomic_write(target, NEW, overwrite=True, backup=True)
    assert target.read_bytes() == OLD
    assert leftovers(target) == []
    # A backup linked to a target that was then not replaced would change with it.
    assert backups(target) == []


def test_stale_temporaries_are_cleaned_live_ones_kept(tmp_path: Path) -> None:
    import fcntl

    target = tmp_path / "pin.jsonl"
    stale = tmp_path / ".pin.jsonl.dead01dead01.tmp"
    live = tmp_path / ".pin.jsonl.11fe11fe11fe.tmp"
    other = tmp_path / ".other.jsonl.dead02dead02.tmp"  # another target's leftover: gate's too
    lookalike = tmp_path / "pin.jsonl.dead03dead03.tmp"
    not_ours = tmp_path / ".pin.jsonl.dead04.tmp"
    for p in (stale, live, other, lookalike, not_ours):
        p.write_bytes(b"partial")
    fd = os.open(live, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # as a writer in another process holds its own
        atomic_write(target, NEW)
        assert not stale.exists() and not other.exists()
        assert live.exists(), "a live writer's temporary file was removed under it"
    finally:
        os.close(fd)
    assert lookalike.exists() and not_ours.exists(), "only names of gate's own shape are touched"
    assert clean_stale_temps(target) == [live]


# --------------------------------------------------------------------------- SIGKILL


class SlowFile:
    """A file object that writes in small, paced pieces, announcing each on a pipe."""

    def __init__(self, fh: Any, say: Callable[[bytes], None], piece: int, pause: float) -> None:
        self._fh, self._say, self._piece, self._pause = fh, say, piece, pause

    def write(self, data: bytes) -> int:
        view = memoryview(data)
        for i in range(0, len(view), self._piece):
            self._fh.write(view[i : i + self._piece])
            self._fh.flush()
            self._say(b"w")
            time.sleep(self._pause)
        return len(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fh, name)

    def __enter__(self) -> SlowFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._fh.close()


def _child(target: Path, *, backup: bool, hang_at: str | None, pause: float, w: int) -> None:
    """In the forked child: write NEW over the target slowly; hang forever at `hang_at`."""

    def say(what: bytes) -> None:
        os.write(w, what)

    def hook(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*a: Any, **k: Any) -> Any:
            say(name.encode()[:1].upper())
            if hang_at == name:
                time.sleep(3600)
            time.sleep(pause)
            return real(*a, **k)

        return wrapped

    real_fdopen = os.fdopen
    os.fdopen = lambda fd, *a, **k: SlowFile(real_fdopen(fd, *a, **k), say, 64 * 1024, pause)  # type: ignore[assignment]
    os.fsync = hook("fsync", os.fsync)
    os.link = hook("link", os.link)
    os.replace = hook("replace", os.replace)
    atomic._fsync_dir = hook("dirsync", atomic._fsync_dir)
    if hang_at == "write":
        os.fdopen = lambda fd, *a, **k: SlowFile(real_fdopen(fd, *a, **k), say, 64 * 1024, 3600)  # type: ignore[assignment]
    atomic_write(target, NEW, overwrite=True, backup=backup)
    say(b"!")  # done
    time.sleep(3600)


def _spawn(target: Path, **kw: Any) -> tuple[int, int]:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            _child(target, w=w, **kw)
        finally:
            os._exit(0)
    os.close(w)
    return pid, r


def _kill(pid: int, r: int) -> bytes:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    said = b""
    while chunk := os.read(r, 4096):
        said += chunk
    os.close(r)
    return said


def _wait_for(r: int, marker: bytes, timeout: float = 20.0) -> bytes:
    said = b""
    deadline = time.monotonic() + timeout
    while marker not in said:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([r], [], [], left)[0]:
            raise AssertionError(f"the child never reached {marker!r} (said {said[-40:]!r})")
        said += os.read(r, 4096)
    return said


def _check_disk(target: Path, *, backup: bool) -> bytes:
    """What a kill may leave: the whole old file or the whole new one; backups whole."""
    content = target.read_bytes()
    assert content in (OLD, NEW), f"a partial target: {len(content)} bytes"
    for kept in backups(target):
        assert kept.read_bytes() == OLD, f"a partial backup {kept.name}"
    if content == NEW and backup:
        assert len(backups(target)) == 1, "the new file replaced the old one with no backup kept"
    return content


@pytest.fixture
def target(tmp_path: Path) -> Iterator[Path]:
    t = tmp_path / "pin.jsonl"
    t.write_bytes(OLD)
    yield t


# (where the child hangs, what the target must hold after the kill)
PHASES = [
    ("write", OLD),  # mid-way through the temporary file
    ("fsync", OLD),  # written, not yet durable
    ("link", OLD),  # about to link the backup
    ("replace", OLD),  # backup kept, about to rename
    ("dirsync", NEW),  # renamed, the folder entry not yet synced
]


# Every phase with and without a backup, but "link" (the backup's hard link) only with one.
KILL_CASES = [
    pytest.param(hang_at, expect, backup, id=f"{hang_at}-{'backup' if backup else 'plain'}")
    for backup in (False, True)
    for hang_at, expect in PHASES
    if backup or hang_at != "link"
]


@pytest.mark.parametrize(("hang_at", "expect", "backup"), KILL_CASES)
def test_sigkill_at_each_step(target: Path, backup: bool, hang_at: str, expect: bytes) -> None:
    pid, r = _spawn(target, backup=backup, hang_at=hang_at, pause=0.0)
    marker = {"write": b"w", "fsync": b"F", "link": b"L", "replace": b"R", "dirsync": b"D"}[hang_at]
    try:
        _wait_for(r, marker)
    finally:
        _kill(pid, r)
    assert _check_disk(target, backup=backup) == expect
    if hang_at in ("replace", "dirsync") and backup:
        assert len(backups(target)) == 1
    # The killed writer's temporary file (if any) is cleaned by the next write.
    atomic_write(target, b"next", overwrite=True)
    assert leftovers(target) == []
    assert target.read_bytes() == b"next"


def test_sigkill_at_random_moments(tmp_path: Path) -> None:
    """Many kills spread over a whole slow write: never a partial target, never a lost file."""
    rnd = random.Random(7)
    pause = 0.002
    # One unkilled run measures how long a whole write takes here.
    probe = tmp_path / "probe.jsonl"
    probe.write_bytes(OLD)
    start = time.monotonic()
    pid, r = _spawn(probe, backup=True, hang_at=None, pause=pause)
    try:
        _wait_for(r, b"!")
    finally:
        _kill(pid, r)
    whole = time.monotonic() - start
    assert probe.read_bytes() == NEW

    outcomes = {OLD: 0, NEW: 0}
    kills = 32
    for i in range(kills):
        target = tmp_path / f"pin{i}.jsonl"
        target.write_bytes(OLD)
        backup = i % 2 == 0
        pid, r = _spawn(target, backup=backup, hang_at=None, pause=pause)
        # One random moment in each of `kills` equal slices of 1.5 times the whole write:
        # the kills cover every step, and some surely land after the rename.
        time.sleep((i + rnd.random()) / kills * 1.5 * whole)
        _kill(pid, r)
        outcomes[_check_disk(target, backup=backup)] += 1
        clean_stale_temps(target)
        assert leftovers(target) == []
    # The kills landed both before and after the rename: the test saw the whole write.
    assert outcomes[OLD] >= 5 and outcomes[NEW] >= 2, outcomes
