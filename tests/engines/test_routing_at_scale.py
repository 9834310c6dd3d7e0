"""MoE routing at Qwen3.6's scale (slow: loads a model): the tiny-width Qwen3.5-MoE with 256
experts, 8 per token, plus the shared expert. The router hooks record 8 distinct experts per
token and layer out of 256 (and the scores of the 12 best), replaying that record reproduces
the run bit for bit, and replaying experts moved by one id changes the tokens: the replay is
really used."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

EXPERTS, PER_TOKEN = 256, 8


@pytest.fixture(scope="module")
def wide_path(tiny_models_dir: Path) -> Path:
    from helpers.tiny_models import build_tiny_qwen3_5_moe

    return build_tiny_qwen3_5_moe(tiny_models_dir / "qwen3.5-moe-256", seed=6, lm_head_scale=20.0, experts=(256, 8))


def prompts() -> list[Any]:
    from gate.core.engine import PromptInput

    return [
        PromptInput(id=f"p{i}", prompt_token_ids=tuple((11 * i + 5 * j) % 250 for j in range(40)), max_tokens=16)
        for i in range(4)
    ]


def test_routing_over_256_experts_is_recorded_and_replayed_bit_for_bit(wide_path: Path) -> None:
    from gate.engines.hf.engine import HFEngine

    engine = HFEngine(str(wide_path), tokenizer=False)
    assert engine._moe_info()["num_experts"] == EXPERTS and engine._moe_info()["top_k"] == PER_TOKEN
    own = engine.generate(prompts(), 5)
    for r in own:
        rows = r.routed_experts
        assert len(rows) == len(r.prompt_token_ids) + len(r.token_ids) - 1  # every token fed
        for token in rows:
            assert len(token) == 4
            assert all(len(set(layer)) == PER_TOKEN and all(0 <= e < EXPERTS for e in layer) for layer in token)
        assert all(len(layer) == PER_TOKEN + 4 for layer in r.router_top[0])
    recorded = {tuple(r.prompt_token_ids): r.routed_experts for r in own}
    replaying = HFEngine(str(wide_path), routing="oracle", tokenizer=False)
    replaying.replay_routing(recorded)
    again = replaying.generate(prompts(), 5)
    assert [(r.token_ids, r.top_logprobs) for r in again] == [(r.token_ids, r.top_logprobs) for r in own]
    moved = {k: [[[(e + 1) % EXPERTS for e in layer] for layer in t] for t in v] for k, v in recorded.items()}
    replaying.replay_routing(moved)
    other = replaying.generate(prompts(), 5)
    assert [r.top_logprobs for r in other] != [r.top_logprobs for r in own]
