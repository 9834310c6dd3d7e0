"""A manifest of a build gate keeps (the default model, an MLX, ONNX or ExecuTorch build),
damaged on disk into JSON of another shape, is a folder to rebuild (its check says why) and no
provenance, never an error: each engine checks its build before it loads it, and the llama.cpp
engine and llama-server read the default model's GGUF provenance."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

# (manifest file, version key) -> JSON of the wrong shape: `source` and `versions` not objects,
# `files` not an object of sha256s.
BODIES = [
    '"source": "a string", "files": {}',
    '"source": ["a", "list"], "versions": "x", "files": {"config.json": "0"}',
    '"source": {"sha256": 5, "weights_sha256": 5}, "versions": [1], "files": []',
    '"source": null, "versions": {"executorch": 5}, "files": {"config.json": 5}',
]


def checks() -> list[tuple[str, str, Callable[[Path], object]]]:
    from gate.engines.executorch.cache import PTE_MANIFEST, check_program_folder
    from gate.engines.ortgenai.builder import ONNX_MANIFEST, check_onnx_folder
    from gate.models.default import MANIFEST, check_folder
    from gate.models.mlx_build import MLX_MANIFEST, check_mlx_folder

    return [
        (MLX_MANIFEST, "gate_mlx_manifest", lambda f: check_mlx_folder(f, source_weights_sha256="0" * 64)),
        (MANIFEST, "gate_model_manifest", lambda f: check_folder(f, gguf_sha256="0" * 64)),
        (MANIFEST, "gate_model_manifest", check_folder),
        (ONNX_MANIFEST, "gate_onnx_manifest", lambda f: check_onnx_folder(f, source_weights_sha256="0" * 64)),
        (PTE_MANIFEST, "gate_executorch_manifest", lambda f: check_program_folder(f, source_weights_sha256="0" * 64)),
        (PTE_MANIFEST, "gate_executorch_manifest", lambda f: check_program_folder(f, attention="masked")),
    ]


@pytest.mark.parametrize("body", BODIES)
@pytest.mark.parametrize("which", range(6))
def test_a_build_manifest_of_another_shape_is_a_reason_to_rebuild(tmp_path: Path, body: str, which: int) -> None:
    name, version_key, check = checks()[which]
    (tmp_path / "config.json").write_bytes(b"{}")
    for data in ("[]", '"a string"', f'{{"{version_key}": 1, {body}}}'):
        (tmp_path / name).write_text(data)
        assert isinstance(check(tmp_path), str), data


@pytest.mark.parametrize("data", ["[]", '"a string"', *(f'{{"gate_model_manifest": 1, {b}}}' for b in BODIES)])
def test_a_damaged_default_manifest_is_no_gguf_provenance(tmp_path: Path, data: str) -> None:
    from gate.models.default import MANIFEST, default_source_sha256

    (tmp_path / MANIFEST).write_text(data)
    assert default_source_sha256(tmp_path) is None


def test_the_provenance_of_a_whole_manifest_is_its_source_sha256(tmp_path: Path) -> None:
    from gate.models.default import MANIFEST, default_source_sha256

    (tmp_path / MANIFEST).write_bytes(b'{"gate_model_manifest": 1, "source": {"sha256": "ab"}}')
    assert default_source_sha256(tmp_path) == "ab"
    assert default_source_sha256(tmp_path / "absent") is None
