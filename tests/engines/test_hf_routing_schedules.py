"""The HF engine's MoE routing record under its serving schedules (slow: loads tiny models).

A prompt's routing record is a row per token it computed (prompt, then every fed token) of the
experts each router chose. Under the prefix cache the rows of a reused prefix are those its
kept entry was computed with (a KV cache cropped, or a recurrent model's snapshot); in a batch
each row is its own prompt's tokens, never the left padding nor a neighbour's. Both must be the
record one prompt at a time gives, in float32 (where no router score sits within rounding of
its top-k edge on these prompts), on a dense-attention MoE (Qwen3-MoE) and on the hybrid
(Gated DeltaNet + gated attention, Qwen3.5-MoE). Replaying the pin's experts (routing=oracle)
under either schedule is refused in one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

HEAD = list(range(40, 70))
# Prompts branching from one head at two points, of different lengths (a batch pads them).
PROMPTS = [
    [*HEAD, *range(100, 120)],
    [*HEAD, *range(130, 141)],
    [*HEAD, *range(150, 163)],
    [*HEAD, *range(130, 136), *range(200, 209)],
    [*HEAD, *range(100, 120)],
]
MAX_TOKENS = 6


@pytest.fixture(params=["qwen3_moe_path", "qwen3_5_moe_path"])
def moe_path(request: pytest.FixtureRequest) -> Path:
    return Path(request.getfixturevalue(request.param))


def _records(path: Path, **options: Any) -> list[Any]:
    from gate.core.engine import PromptInput
    from gate.engines.hf.engine import HFEngine

    engine = HFEngine(str(path), dtype="float32", tokenizer=False, **options)
    prompts = [PromptInput(id=f"p{i}", prompt_token_ids=tuple(p), max_tokens=MAX_TOKENS) for i, p in enumerate(PROMPTS)]
    try:
        return engine.generate(prompts, 3)
    finally:
        engine.close()


@pytest.fixture
def one_at_a_time(moe_path: Path) -> list[Any]:
    return _records(moe_path)


def _check_same_routing(records: list[Any], reference: list[Any]) -> None:
    for got, want in zip(records, reference, strict=True):
        assert got.token_ids == want.token_ids, got.id
        rows = len(got.prompt_token_ids) + len(got.token_ids) - 1  # the last chosen token is never fed
        assert want.routed_experts is not None and len(want.routed_experts) == rows
        assert got.routed_experts is not None and len(got.routed_experts) == rows, got.id
        assert got.router_top is not None and len(got.router_top) == rows, got.id
        assert [list(r) for r in got.routed_experts] == [list(r) for r in want.routed_experts], got.id


def test_the_prefix_cache_records_the_reused_prefix_with_the_routing_it_was_computed_with(
    moe_path: Path, one_at_a_time: list[Any]
) -> None:
    from gate.core.engine import PromptInput
    from gate.engines.hf.engine import HFEngine

    engine = HFEngine(str(moe_path), dtype="float32", tokenizer=False, prefix_cache=True)
    prompts = [PromptInput(id=f"p{i}", prompt_token_ids=tuple(p), max_tokens=MAX_TOKENS) for i, p in enumerate(PROMPTS)]
    try:
        records = engine.generate(prompts, 3)
        hits, reused = engine.prefix_reuse()
    finally:
        engine.close()
    # A dense cache crops any kept entry (4 hits); a recurrent one reuses snapshots only (3: C, D, A again).
    assert hits >= 3 and reused >= 3 * len(HEAD)
    _check_same_routing(records, one_at_a_time)


def test_a_batch_records_each_prompts_own_routing(moe_path: Path, one_at_a_time: list[Any]) -> None:
    _check_same_routing(_records(moe_path, batch_size=4), one_at_a_time)


@pytest.mark.parametrize("schedule", [{"batch_size": 2}, {"prefix_cache": True}])
def test_replaying_the_pins_experts_under_a_shared_schedule_is_refused_in_one_line(
    qwen3_moe_path: Path, schedule: dict[str, Any]
) -> None:
    from gate.engines.hf.engine import HFEngine
    from gate.errors import InputError

    with pytest.raises(InputError, match="routing=oracle") as caught:
        HFEngine(str(qwen3_moe_path), dtype="float32", tokenizer=False, routing="oracle", **schedule)
    assert "\n" not in str(caught.value)
