"""The default model's manifest, damaged on disk into JSON of another shape, is a folder to
rebuild (check_folder says why) and no GGUF provenance (default_source_sha256 is None), never
an error: the llama.cpp engine and llama-server read that provenance before they load."""

from __future__ import annotations

from pathlib import Path

import pytest

SHAPES = [
    b"[]",
    b'"a string"',
    b'{"gate_model_manifest": 1, "source": "a string", "files": {}}',
    b'{"gate_model_manifest": 1, "source": ["a", "list"], "files": {"config.json": "0"}}',
    b'{"gate_model_manifest": 1, "source": {"sha256": 5}, "files": []}',
    b'{"gate_model_manifest": 1, "source": null, "files": {"config.json": 5}}',
]


@pytest.mark.parametrize("data", SHAPES)
def test_a_manifest_of_another_shape_is_a_reason_to_rebuild_and_no_provenance(tmp_path: Path, data: bytes) -> None:
    from gate.models.default import MANIFEST, check_folder, default_source_sha256

    (tmp_path / MANIFEST).write_bytes(data)
    (tmp_path / "config.json").write_bytes(b"{}")
    assert isinstance(check_folder(tmp_path, gguf_sha256="0" * 64), str)
    assert isinstance(check_folder(tmp_path), str)
    assert default_source_sha256(tmp_path) is None


def test_the_provenance_of_a_whole_manifest_is_its_source_sha256(tmp_path: Path) -> None:
    from gate.models.default import MANIFEST, default_source_sha256

    (tmp_path / MANIFEST).write_bytes(b'{"gate_model_manifest": 1, "source": {"sha256": "ab"}}')
    assert default_source_sha256(tmp_path) == "ab"
    assert default_source_sha256(tmp_path / "absent") is None
