"""A file's sha256 kept in gate's cache (gate.core.storage.digests): returned while the file is
the one hashed (device, inode, size, mtime and ctime agree), hashed again on any change,
never kept for a file that changed too recently to trust its times, and never in the way
when the cache cannot be read or written."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

from gate.core.storage import digests


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GATE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(digests, "RACY_SECONDS", 0.0)  # files written by the test have settled
    return tmp_path / "cache"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def hashes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records every real hashing from now on."""
    seen: list[str] = []
    real = digests.file_sha256

    def counting(path: str | os.PathLike[str]) -> str:
        seen.append(str(path))
        return real(path)

    monkeypatch.setattr(digests, "file_sha256", counting)
    return seen


def test_an_unchanged_file_is_hashed_once(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "weights.bin"
    f.write_bytes(b"abc" * 1000)
    seen = hashes(monkeypatch)
    assert digests.known_sha256(f) == sha(b"abc" * 1000)
    assert digests.known_sha256(f) == sha(b"abc" * 1000)
    link = tmp_path / "link.bin"
    link.symlink_to(f)
    assert digests.known_sha256(link) == sha(b"abc" * 1000)  # the real path's entry
    assert len(seen) == 1
    assert len(list((cache / "digests").iterdir())) == 1


def test_the_same_size_rewritten_with_its_old_mtime_is_hashed_again(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = tmp_path / "weights.bin"
    f.write_bytes(b"aaaa")
    first = digests.known_sha256(f)
    st = f.stat()
    time.sleep(0.05)  # past the file clock's coarse tick (a jiffy), so the ctime moves
    with open(f, "r+b") as fh:  # in place: same inode, same size
        fh.write(b"bbbb")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # the old mtime back; the ctime moved
    assert f.stat().st_mtime_ns == st.st_mtime_ns and f.stat().st_ino == st.st_ino
    assert digests.known_sha256(f) == sha(b"bbbb") != first


def test_a_replaced_file_is_hashed_again(cache: Path, tmp_path: Path) -> None:
    f = tmp_path / "weights.bin"
    f.write_bytes(b"one")
    digests.known_sha256(f)
    other = tmp_path / "other.bin"
    other.write_bytes(b"two")
    os.replace(other, f)
    assert digests.known_sha256(f) == sha(b"two")


def test_a_file_changed_just_before_its_hashing_is_not_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATE_CACHE_DIR", str(tmp_path / "cache"))
    f = tmp_path / "weights.bin"
    f.write_bytes(b"fresh")  # its ctime is now: within RACY_SECONDS of the hashing
    seen = hashes(monkeypatch)
    assert digests.known_sha256(f) == sha(b"fresh")
    assert digests.known_sha256(f) == sha(b"fresh")
    assert len(seen) == 2
    assert not (tmp_path / "cache" / "digests").exists()


@pytest.mark.parametrize(
    "kept",
    [b"not json", b'{"gate_digest": 1}', b"[]", b'{"gate_digest": 2, "sha256": "x"}'],
)
def test_an_unreadable_or_foreign_entry_is_hashed_again(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kept: bytes
) -> None:
    f = tmp_path / "weights.bin"
    f.write_bytes(b"data")
    digests.known_sha256(f)
    (entry,) = (cache / "digests").iterdir()
    entry.write_bytes(kept)
    seen = hashes(monkeypatch)
    assert digests.known_sha256(f) == sha(b"data")
    assert len(seen) == 1


def test_an_entry_claiming_another_digest_for_another_identity_is_not_believed(cache: Path, tmp_path: Path) -> None:
    import orjson

    f = tmp_path / "weights.bin"
    f.write_bytes(b"data")
    digests.known_sha256(f)
    (entry,) = (cache / "digests").iterdir()
    data = orjson.loads(entry.read_bytes())
    entry.write_bytes(orjson.dumps({**data, "size": data["size"] + 1, "sha256": "0" * 64}))
    assert digests.known_sha256(f) == sha(b"data")


def test_a_cache_that_cannot_be_written_still_gives_the_digest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "cache"
    blocker.write_bytes(b"a file where the cache folder would be")
    monkeypatch.setenv("GATE_CACHE_DIR", str(blocker))
    monkeypatch.setattr(digests, "RACY_SECONDS", 0.0)
    f = tmp_path / "weights.bin"
    f.write_bytes(b"data")
    assert digests.known_sha256(f) == sha(b"data")
