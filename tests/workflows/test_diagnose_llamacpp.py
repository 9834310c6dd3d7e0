"""`gate diagnose` on llama.cpp (the default model's own Q4_1 GGUF), through ggml's eval callback:
every graph tensor named in gate.engines.llamacpp.capture maps to its transformers point, and a
planted KV-cache bug in a LlamaCppEngine subclass (a cell evicted before each decode step)
is located at layer 0's attention on the decode path only."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest

pytestmark = pytest.mark.slow
pytest.importorskip("llama_cpp")


@pytest.fixture(scope="module")
def setup() -> Iterator[tuple[Any, Any, Any, Any]]:
    from helpers.requirements import require_distribution
    from helpers.tiny_pin import one_thread

    from gate.core.pins.pin import load_pin
    from gate.models.default import DEFAULT_MODEL, GGUF_DISTRIBUTION, resolve_model_path
    from gate.workflows.diagnose.core import reference_engines, target_given

    require_distribution(GGUF_DISTRIBUTION, "the default model's GGUF")
    path = resolve_model_path(DEFAULT_MODEL)
    target = target_given(load_pin(DEFAULT_MODEL), "code-numpy", 8)
    with one_thread(), reference_engines(path) as (ref, hon):
        yield path, target, ref, hon


def test_every_llamacpp_point_maps_to_a_transformers_point(setup: tuple[Any, Any, Any, Any]) -> None:
    from gate.engines.hf.capture import capture_hf
    from gate.engines.llamacpp.capture import capture_llamacpp
    from gate.engines.llamacpp.engine import LlamaCppEngine
    from gate.models.default import DEFAULT_MODEL

    _, t, ref, _ = setup
    engine = LlamaCppEngine(DEFAULT_MODEL, preflight="false")
    try:
        cap = capture_llamacpp(engine, t.prompt_ids, t.context_ids, "decode")
    finally:
        engine.close()
    hf = {x.point.module: x for x in capture_hf(ref, t.prompt_ids, t.context_ids, "decode").tensors}
    got = {x.point.module: x for x in cap.tensors}
    assert set(got) == set(hf) and len(got) == 1 + 30 * 5 + 2
    assert all(got[m].point == hf[m].point for m in got)
    # Decode: every context position of layer 0; lm_head at the last prompt token and each step.
    n, p = len(t.context_ids), len(t.prompt_ids)
    assert got["model.layers.0.self_attn"].positions == tuple(range(n))
    assert got["lm_head"].positions == tuple(range(p - 1, n))


class _KVEvictionBug:
    """Mixed into LlamaCppEngine: before each single-token decode, the KV cache cell of
    position 1 is evicted (a cache-management bug: the prefill attends to it, decode steps
    do not)."""

    def _decode(self, tokens: Sequence[int], pos0: int) -> None:
        import llama_cpp

        if len(tokens) == 1 and pos0 > 2:
            memory = llama_cpp.llama_get_memory(self.ctx.ctx)  # type: ignore[attr-defined]
            llama_cpp.llama_memory_seq_rm(memory, 0, 1, 2)
        super()._decode(tokens, pos0)  # type: ignore[misc]


def test_a_llamacpp_kv_cache_bug_is_located_on_the_decode_path_only(setup: tuple[Any, Any, Any, Any]) -> None:
    from gate.engines.llamacpp.engine import LlamaCppEngine
    from gate.models.default import DEFAULT_MODEL
    from gate.workflows.diagnose.core import diagnose_engine

    path, t, _, _ = setup
    bug = type("PlantedLlamaCpp", (_KVEvictionBug, LlamaCppEngine), {})(DEFAULT_MODEL, preflight="false")
    try:
        d = diagnose_engine(bug, t, path)
    finally:
        bug.close()
    assert d.finding.first is not None, d.summary
    assert (d.finding.first.layer, d.finding.first.part, d.path) == (0, "attention", "decode"), d.summary
    assert d.other is not None and d.other.first is None, d.summary
