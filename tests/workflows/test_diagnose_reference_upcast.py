"""gate diagnose's reference widened in place from the honest engine's load
(gate.engines.hf.upcast): bit for bit the float32 load where `widens_exactly` says so, on
each architecture the tests build, and refused where widening cannot give it (a float32
checkpoint loaded in bf16, a buffer computed in bf16, headers that cannot be read)."""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

CONTEXT = (3, 17, 42, 8, 99, 5, 11, 23)


@pytest.fixture(scope="module")
def threads() -> Iterator[None]:
    from helpers.tiny_pin import one_thread

    with one_thread():
        yield


def builders() -> dict[str, Callable[[Path], Path]]:
    from helpers.tiny_models import architectures

    return architectures(seed=3)


def engine(folder: Path, dtype: str) -> Any:
    from gate.engines.hf.engine import HFEngine

    return HFEngine(str(folder), tokenizer=False, dtype=dtype)


@pytest.mark.parametrize("arch", ["llama", "qwen3-moe", "qwen3.5-moe-hybrid", "qwen3.5-moe-256"])
def test_widening_the_bf16_load_is_the_float32_load_bit_for_bit(
    tiny_models_dir: Path, threads: None, arch: str
) -> None:
    import numpy as np
    import torch

    from gate.core.diagnosis.capture import PREFILL
    from gate.engines.hf.upcast import widen, widens_exactly

    folder = builders()[arch](tiny_models_dir / f"upcast-{arch}")
    widened, loaded = engine(folder, "bfloat16"), engine(folder, "float32")
    assert widens_exactly(widened)
    widen(widened)
    assert widened.dtype == torch.float32 and widened.options["dtype"] == "float32"
    for (name, x), (_, y) in zip(widened.model.named_buffers(), loaded.model.named_buffers(), strict=True):
        assert x.dtype == y.dtype and torch.equal(x, y), name
    ids = torch.tensor([list(CONTEXT)])
    with torch.inference_mode():
        la = widened.model(input_ids=ids, logits_to_keep=0).logits
        lb = loaded.model(input_ids=ids, logits_to_keep=0).logits
    assert la.dtype == torch.float32 and torch.equal(la, lb)
    # Every capture point (each layer's parts, the DeltaNet's conv and gates), not only the logits.
    a = widened.capture_path(CONTEXT, CONTEXT, PREFILL)
    b = loaded.capture_path(CONTEXT, CONTEXT, PREFILL)
    assert [t.point for t in a.tensors] == [t.point for t in b.tensors] and len(a.tensors) > 10
    for x, y in zip(a.tensors, b.tensors, strict=True):
        assert np.array_equal(x.values, y.values), x.point.module


@pytest.mark.parametrize("arch", ["llama", "qwen3.5-moe-hybrid"])
def test_the_reference_holds_no_float32_copy_of_the_weights(tiny_models_dir: Path, threads: None, arch: str) -> None:
    """Widening is per module while it runs: after a forward every weight is back in its loaded
    dtype, and the float32 held is one unit's (a decoder layer), not the model's (on
    Qwen3.6-35B-A3B a float32 copy is 140 GB)."""
    import torch

    from gate.core.diagnosis.capture import PREFILL
    from gate.engines.hf.upcast import widen

    folder = builders()[arch](tiny_models_dir / f"upcast-{arch}")
    eng = engine(folder, "bfloat16")
    before = {n: p.dtype for n, p in eng.model.named_parameters()}
    widen(eng)
    eng.capture_path(CONTEXT, CONTEXT, PREFILL)
    assert {n: p.dtype for n, p in eng.model.named_parameters()} == before
    weights = sum(p.numel() for p in eng.model.parameters() if p.dtype == torch.bfloat16)
    held = eng.model._gate_widening.buffer.numel()
    assert 0 < held < weights / 2


def test_only_the_routed_experts_rows_are_widened(tiny_models_dir: Path, threads: None) -> None:
    """With 256 experts, 8 per token, a forward widens the dense weights and the rows of the
    experts its tokens reach, no other: the rest of the buffer is never read (NaN there changes
    nothing), and a decode step widens fewer than the prefill before it."""
    import torch

    from gate.engines.hf.upcast import widen

    folder = builders()["qwen3.5-moe-256"](tiny_models_dir / "upcast-qwen3.5-moe-256")
    eng = engine(folder, "bfloat16")
    widen(eng)
    widening = eng.model._gate_widening
    widening.buffer.fill_(float("nan"))
    experts = [m for m in eng.model.modules() if type(m).__name__.endswith("Experts")]
    stacked = sum(p.numel() for m in experts for p in m.parameters())
    dense = sum(p.numel() for p in eng.model.parameters() if p.dtype == torch.bfloat16) - stacked
    dense -= eng.model.get_input_embeddings().weight.numel()  # looked up, then widened
    dense -= sum(p.numel() for n, p in eng.model.named_parameters() if "visual" in n)  # never runs
    routed: list[int] = []

    def chosen(module: Any, args: Any, out: Any) -> None:
        routed.append(len(torch.unique(out[2])))

    handles = [m.gate.register_forward_hook(chosen) for m in eng.model.modules() if hasattr(m, "shared_expert")]
    prompt = CONTEXT[:-1]
    with torch.inference_mode():
        logits, cache = eng._prefill(list(prompt))
        after_prefill = widening.copied
        per_expert = stacked // (len(experts) * 256)
        assert after_prefill == dense + per_expert * sum(routed)
        assert sum(routed) < 64 * len(experts) and torch.isfinite(logits).all()
        routed.clear()
        step, _ = eng._decode(CONTEXT[-1], cache)
        assert torch.isfinite(step).all()
        assert widening.copied - after_prefill == dense + per_expert * sum(routed) and sum(routed) <= 8 * len(experts)
    for h in handles:
        h.remove()


def test_a_float32_checkpoint_loaded_in_bf16_is_not_widened(tiny_models_dir: Path, threads: None) -> None:
    from helpers.tiny_models import build_tiny_llama

    from gate.engines.hf.upcast import stored_dtypes, widens_exactly

    folder = build_tiny_llama(tiny_models_dir / "upcast-f32", seed=3, dtype="float32")
    assert stored_dtypes(folder) == {"F32"}
    assert not widens_exactly(engine(folder, "bfloat16"))
    assert not widens_exactly(engine(folder, "float32"))  # already float32: nothing to widen


def test_a_buffer_held_in_bf16_is_not_widened(tiny_models_dir: Path, threads: None) -> None:
    import torch
    from helpers.tiny_models import build_tiny_llama

    from gate.engines.hf.upcast import widens_exactly

    eng = engine(build_tiny_llama(tiny_models_dir / "upcast-llama-b", seed=3), "bfloat16")
    assert widens_exactly(eng)
    eng.model.model.rotary_emb.inv_freq = eng.model.model.rotary_emb.inv_freq.to(torch.bfloat16)
    assert not widens_exactly(eng)


def header(tmp_path: Path, name: str, body: bytes, length: int | None = None) -> Path:
    f = tmp_path / name
    f.write_bytes(struct.pack("<Q", len(body) if length is None else length) + body)
    return f


def test_stored_dtypes_read_only_well_formed_headers(tmp_path: Path) -> None:
    from gate.engines.hf.upcast import stored_dtypes

    assert stored_dtypes(tmp_path) is None  # no safetensors files
    good = b'{"__metadata__": {"format": "pt"}, "a": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]},'
    good += b' "b": {"dtype": "I64", "shape": [1], "data_offsets": [4, 12]}}'
    header(tmp_path, "model.safetensors", good)
    assert stored_dtypes(tmp_path) == {"BF16"}
    header(tmp_path, "model-2.safetensors", b'{"c": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}')
    assert stored_dtypes(tmp_path) == {"BF16", "F32"}
    for bad in (b"not json", b"[1, 2]", b'{"c": {"shape": [1]}}', b'{"c": 3}'):
        header(tmp_path, "model-2.safetensors", bad)
        assert stored_dtypes(tmp_path) is None, bad
    header(tmp_path, "model-2.safetensors", b"{}", length=1 << 40)
    assert stored_dtypes(tmp_path) is None
    (tmp_path / "model-2.safetensors").write_bytes(b"\x01")  # shorter than the length itself
    assert stored_dtypes(tmp_path) is None
