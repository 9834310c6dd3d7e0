"""A damaged entry of the diagnosis cache (gate.workflows.diagnose.cache) is a miss, never an
error: a diagnosis computes the reference and the band again. Damage is tried as a disk or an
interrupted copy leaves it: each file cut short at every length, each byte of each file
flipped, and well-formed JSON of the wrong shape. The reference's bytes are checked by the
zip's own CRC-32, band.json's by its sha256 kept in that zip: a flipped byte is a miss or the
same entry, never another one. No model is loaded (a capture of a few rows stands for a
model's)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

KEY = {"gate_diagnose_cache": 0, "paths": ["decode", "prefill"]}


def entry() -> Any:
    from gate.core.diagnosis.capture import Capture, Point, Tensor
    from gate.core.diagnosis.locate import HonestBand, HonestPoint
    from gate.workflows.diagnose.cache import Entry

    rng = np.random.default_rng(3)
    tensors = (
        Tensor(Point(-1, "embedding", "model.embed_tokens"), (0, 1, 2), rng.standard_normal((3, 4)).astype(np.float32)),
        Tensor(Point(0, "residual", "model.layers.0"), (1, 2), rng.standard_normal((2, 4)).astype(np.float32)),
    )
    bands = {
        p: HonestBand(p, {"model.layers.0": HonestPoint((1, 2), 0.25), "model.embed_tokens": HonestPoint((0,), 0.0)})
        for p in ("decode", "prefill")
    }
    return Entry(Capture("prefill", 3, tensors), bands, {"honest": {"name": "hf"}})


def same(a: Any, b: Any) -> bool:
    ta, tb = a.reference.tensors, b.reference.tensors
    return (
        a.bands == b.bands
        and a.engines == b.engines
        and len(ta) == len(tb)
        and all(
            x.point == y.point and x.positions == y.positions and np.array_equal(x.values, y.values)
            for x, y in zip(ta, tb, strict=True)
        )
    )


@pytest.fixture
def written(tmp_path: Path) -> tuple[Path, Any]:
    from gate.workflows.diagnose import cache

    folder = cache.write(KEY, entry(), tmp_path)
    kept = cache.read(KEY, tmp_path)
    assert kept is not None and same(kept, entry())  # the entry as written reads back whole
    return folder, kept


@pytest.mark.parametrize("name", ["reference.npz", "band.json", "manifest.json"])
def test_a_file_cut_short_at_any_length_is_a_miss(written: tuple[Path, Any], name: str) -> None:
    from gate.workflows.diagnose import cache

    folder, _ = written
    f = folder / name
    whole = f.read_bytes()
    for n in range(len(whole)):
        f.write_bytes(whole[:n])
        assert cache.read(KEY, folder.parent) is None, f"{name} cut to {n} of {len(whole)} bytes"
    f.write_bytes(whole)
    assert cache.read(KEY, folder.parent) is not None


def test_any_flipped_byte_of_the_reference_is_a_miss_or_the_same_entry(written: tuple[Path, Any]) -> None:
    from gate.workflows.diagnose import cache

    folder, kept = written
    f = folder / cache.REFERENCE
    whole = f.read_bytes()
    for i in range(len(whole)):
        f.write_bytes(whole[:i] + bytes([whole[i] ^ 0x5A]) + whole[i + 1 :])
        got = cache.read(KEY, folder.parent)
        assert got is None or same(got, kept), f"byte {i} of {len(whole)} flipped: read as another entry"


@pytest.mark.parametrize("name", ["band.json", "manifest.json"])
def test_any_flipped_byte_of_the_json_is_a_miss(written: tuple[Path, Any], name: str) -> None:
    """band.json is checked by its sha256, kept in the reference's zip; the manifest by being
    the key, field by field (a flip in its whitespace changes no field: the same entry)."""
    from gate.workflows.diagnose import cache

    folder, kept = written
    f = folder / name
    whole = f.read_bytes()
    for i in range(len(whole)):
        for flip in (0x01, 0x5A):
            f.write_bytes(whole[:i] + bytes([whole[i] ^ flip]) + whole[i + 1 :])
            got = cache.read(KEY, folder.parent)
            assert got is None or (name == cache.MANIFEST and same(got, kept)), f"{name}: byte {i} flipped"


@pytest.mark.parametrize(
    "band",
    [
        b"[]",
        b'{"bands": [], "engines": {}}',
        b'{"bands": {"decode": [], "prefill": []}, "engines": {}}',
        b'{"bands": {"decode": {"path": "decode", "points": []}}, "engines": {}}',
        b'{"bands": {"decode": {"path": "decode", "points": {"m": []}}}, "engines": {}}',
        b'{"bands": {"decode": {"path": "decode", "points": {"m": {"positions": 3, "error": 1}}}}, "engines": {}}',
        b'{"bands": {"decode": {"path": "decode", "points": {"m": {"positions": [], "error": []}}}}, "engines": {}}',
        b'{"bands": {"decode": {"path": "decode", "points": {}}, "prefill": {"path": "prefill", "points": {}}}, '
        b'"engines": []}',
    ],
)
def test_band_json_replaced_by_other_json_is_a_miss(written: tuple[Path, Any], band: bytes) -> None:
    from gate.workflows.diagnose import cache

    folder, _ = written
    (folder / cache.BAND).write_bytes(band)
    assert cache.read(KEY, folder.parent) is None
