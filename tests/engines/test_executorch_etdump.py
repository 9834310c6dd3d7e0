"""What ExecuTorch's own ETDump exposes of a program gate exported (scripts/executorch_etdump.py,
on the tiny Llama): the embedding, each layer's input norm and residual stream, and the
logits are among the tensors the runtime logs; the attention, the post-attention norm and the
MLP, computed inside XNNPACK delegate calls, are not (nor, in this tiny program, the final
norm). This is why `gate diagnose` captures the executorch engine at its layers only
(docs/results/engine-executorch.md, "Diagnosis"); if a new ExecuTorch logs them, this test
fails and the capture can name the parts too."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("executorch")
pytest.importorskip("transformers")

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("executorch_etdump", ROOT / "scripts" / "executorch_etdump.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_etdump_holds_each_layers_residual_stream_but_not_its_parts(
    llama_path: Path, executorch_cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gate.engines.executorch.engine import ExecuTorchEngine

    monkeypatch.setenv("GATE_CACHE_DIR", str(executorch_cache_dir))
    engine = ExecuTorchEngine(str(llama_path), max_seq_len=64)
    pte = engine.pte
    engine.close()
    s = script()
    ids = [1, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50]
    found = s.reachability(s.logged_outputs(Path(pte), ids, 64 << 20), s.module_outputs(llama_path, ids), 1e-4)
    layers = sorted({int(n.split(".")[2]) for n in found if n.startswith("model.layers.")})
    assert layers == [0, 1]
    seen = {name for name, (hit, _, _) in found.items() if hit}
    want = {"model.embed_tokens", "lm_head"}
    want |= {f"model.layers.{i}{p}" for i in layers for p in ("", ".input_layernorm")}
    assert seen == want
