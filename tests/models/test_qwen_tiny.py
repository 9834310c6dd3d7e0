"""The Qwen3.6 test checkpoint as files: found by its id, checked against its manifest on every
use, its GGUF found only when it was converted from exactly these weights. No torch."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gate.errors import InputError
from gate.models import qwen_tiny
from gate.models.default import resolve_model_path
from gate.models.qwen_tiny import QWEN_TINY, gguf_path, packaged_dir, publish_gguf, qwen_tiny_dir


def test_its_id_resolves_to_the_packaged_folder_in_the_real_models_layout() -> None:
    folder = Path(resolve_model_path(QWEN_TINY))
    assert folder == packaged_dir() == qwen_tiny_dir()
    config = json.loads((folder / "config.json").read_text())
    text = config["text_config"]
    assert config["architectures"] == ["Qwen3_5MoeForConditionalGeneration"] and config["model_type"] == "qwen3_5_moe"
    assert text["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    assert text["attn_output_gate"] is True and text["shared_expert_intermediate_size"] > 0
    assert 0 < text["num_experts_per_tok"] < text["num_experts"] and text["mtp_num_hidden_layers"] == 1
    assert config["vision_config"]["depth"] >= 1
    size = sum(p.stat().st_size for p in folder.iterdir())
    assert size < 12_000_000, size


@pytest.fixture
def copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "Qwen3.6-tiny"
    shutil.copytree(packaged_dir(), folder)
    monkeypatch.setattr(qwen_tiny, "packaged_dir", lambda: folder)
    monkeypatch.setenv("GATE_CACHE_DIR", str(tmp_path / "cache"))
    return folder


def test_an_altered_checkpoint_is_refused_naming_the_file(copy: Path) -> None:
    assert qwen_tiny_dir() == copy
    data = bytearray((copy / "model.safetensors").read_bytes())
    data[-1] ^= 1
    (copy / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(InputError, match=r"model\.safetensors does not match its sha256"):
        qwen_tiny_dir()


def test_a_missing_gguf_says_how_to_build_it(copy: Path) -> None:
    with pytest.raises(InputError, match=r"python scripts/build_qwen36_test_model\.py convert"):
        gguf_path()


def test_a_gguf_of_other_weights_is_refused(copy: Path, tmp_path: Path) -> None:
    built = tmp_path / "built.gguf"
    built.write_bytes(b"GGUF" + bytes(60))
    target = publish_gguf(built, copy, "test")
    assert gguf_path() == target
    manifest = target.parent / qwen_tiny.GGUF_MANIFEST
    recorded = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**recorded, "source_weights_sha256": "0" * 64}))
    with pytest.raises(InputError, match="made from other weights"):
        gguf_path()
    manifest.write_text(json.dumps(recorded))
    target.write_bytes(b"GGUF" + bytes(61))
    with pytest.raises(InputError, match="does not match its sha256"):
        gguf_path()


def test_its_pin_looks_like_a_trained_models() -> None:
    """The committed pin's distributions are a trained model's, not a random initialisation's:
    peaked where the teacher was sure (top-1 above 0.9 at many positions), close where it
    hesitated (top two within the default near-tie threshold) and exactly tied somewhere
    (bf16 logits), as on the real model (docs/reference/qwen36-test-checkpoint.md)."""
    import math

    from gate.core.pins.pin import load_pin

    top1: list[float] = []
    exact = near = 0
    for record in load_pin(QWEN_TINY).trace.records:
        for pos in record.top_logprobs or ():
            (_, first), (_, second) = pos[0], pos[1]
            top1.append(math.exp(first))
            exact += first == second
            near += 0 < (first - second) * 1000 <= 125
    top1.sort()
    median = top1[len(top1) // 2]
    assert len(top1) >= 1000  # 41 prompts of up to 32 tokens
    assert 0.3 <= median <= 0.9, median
    assert sum(p > 0.9 for p in top1) >= 0.1 * len(top1)
    assert exact >= 3 and near >= 20, (exact, near)
