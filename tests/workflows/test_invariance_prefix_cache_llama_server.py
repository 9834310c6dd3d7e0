"""The prefix_cache cell with a real llama-server (slow; scripts/install.sh --llama-server) on
the default model's Q4_1 GGUF, four prompts of the default pin: the baseline's free runs go
with `cache_prompt` false, the cell's with it true, and the cell is compared position by
position; the server's own `timings.cache_n` says what the judged run took from the cache:
one request at a time on one slot, each prompt finds all of itself cached but the last token,
which the server evaluates again."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from helpers.llama_servers import llama_server_binary

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(llama_server_binary() is None, reason="no llama-server (scripts/install.sh --llama-server)"),
]


def test_llama_servers_prompt_cache_is_a_cell_against_its_cold_baseline() -> None:
    from gate.core.pins.pin import doctrine_for, load_pin
    from gate.engines.http.llama_server import LlamaServerEngine
    from gate.engines.registry import load_engine
    from gate.models.default import DEFAULT_MODEL
    from gate.workflows.invariance.core import InvariancePlan, run_invariance
    from gate.workflows.run.core import shard_pin

    full = load_pin(DEFAULT_MODEL)
    pin = shard_pin(full, [r.id for r in full.trace.records[:4]])
    seen: list[dict[str, Any]] = []

    def load(options: Mapping[str, str]) -> Any:
        engine = load_engine("llama-server", DEFAULT_MODEL, {"threads": "1", **dict(options)})
        seen.append(engine.info())
        return engine

    plan = InvariancePlan(cells=("prefix_cache",))
    result = run_invariance(load, LlamaServerEngine, pin, doctrine_for(pin), plan, engine_name="llama-server")
    cell = result.cells[0]
    assert cell.ran and cell.positions > 0, cell.to_dict()
    assert result.baseline.knobs["prefix_cache"] == "0"
    assert [info["cache_prompt"] for info in seen] == [False, True]
    # Each prompt right after its own filling request: all of it cached but the last token.
    tokens = sum(len(r.prompt_token_ids) - 1 for r in pin.trace.records)
    assert cell.to_dict()["cache_reuse"] == {"requests_hit": 4, "tokens_reused": tokens}
    assert cell.reuse_note == (
        f"the engine served {tokens} prompt token(s) from its prefix cache over 4 of the judged run's 4 request(s)"
    )
