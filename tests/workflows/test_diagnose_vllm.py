"""`gate diagnose` on vLLM (CPU) through its worker extension: a weight-conversion bug (layer
1's attention output projection transposed in the candidate's folder) is located at layer 1's
attention on both paths against the reference from the original weights; vLLM on the
original weights is located nowhere."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.vllm]
pytest.importorskip("vllm")

PROMPT = tuple(range(40, 72))
CONTEXT = PROMPT + tuple(range(80, 92))


def faulty_copy(clean: Path, folder: Path) -> Path:
    import torch
    from helpers.tiny_models import save_tokenizer
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(clean, dtype=torch.bfloat16)
    o_proj = model.model.layers[1].self_attn.o_proj
    with torch.no_grad():
        o_proj.weight.copy_(o_proj.weight.t().contiguous())
    model.save_pretrained(folder)
    save_tokenizer(folder)
    return folder


def diagnosed(weights: Path, reference: Path) -> Any:
    from gate.engines.vllm.engine import VLLMEngine
    from gate.workflows.diagnose.core import Target, diagnose_engine

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    engine = VLLMEngine(str(weights), max_model_len=256)
    try:
        first = engine.llm
        target = Target("p", len(CONTEXT) - len(PROMPT), "given", "decode", PROMPT, CONTEXT)
        found = diagnose_engine(engine, target, str(reference))
        assert engine.llm is first  # the engine's LLM carries the capture extension: no restart
        return found
    finally:
        engine.close()


def test_vllm_is_captured_and_a_conversion_bug_located(tiny_models_dir: Path) -> None:
    from helpers.tiny_models import build_tiny_llama
    from helpers.tiny_pin import one_thread

    with one_thread():
        clean = build_tiny_llama(tiny_models_dir / "diagnose-vllm", seed=5, lm_head_scale=20.0)
        bad = faulty_copy(clean, tiny_models_dir / "diagnose-vllm-bad")
        d = diagnosed(bad, clean)
        assert d.finding.first is not None, d.summary
        assert (d.finding.first.layer, d.finding.first.part) == (1, "attention"), d.summary
        assert d.other is not None and d.other.first is not None
        assert (d.other.first.layer, d.other.first.part) == (1, "attention")
        assert not d.finding.missing and len(d.finding.layers) == 1 + 2 * 5 + 2
        honest = diagnosed(clean, clean)
        assert honest.finding.first is None and honest.other is not None and honest.other.first is None, honest.summary
