"""llama-server's prompt cache on a recurrent model (slow: starts the real server on the Qwen3.6
test checkpoint's GGUF: Gated DeltaNet + gated attention).

A recurrent state holds the last token only. The server gate starts (`--ctx-checkpoints 0`)
continues a slot's state where a prompt extends exactly what the slot holds (forced decode)
and otherwise computes the prompt again from scratch; it never restores a snapshot of another
request's state (llama-server's context checkpoints, which its default keeps). Checked by the
server's own count of prompt tokens taken from the cache (`timings.cache_n`) and by the
logprobs, bit for bit those of the same prompt computed cold.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from helpers.llama_servers import llama_server_binary

from gate.core.pins.pin import load_pin
from gate.engines.http.llama_server import LlamaServerEngine
from gate.models.qwen_tiny import QWEN_TINY

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(llama_server_binary() is None, reason="no llama-server (scripts/install.sh --llama-server)"),
]


@pytest.fixture(scope="module")
def server() -> Iterator[LlamaServerEngine]:
    engine = LlamaServerEngine(QWEN_TINY, threads="1")
    try:
        yield engine
    finally:
        engine.close()


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    records = load_pin(QWEN_TINY).trace.records
    return list(max(records, key=lambda r: len(r.prompt_token_ids)).prompt_token_ids)


def ask(server: LlamaServerEngine, ids: Sequence[int], *, cache: bool, n: int = 4) -> tuple[Any, Any, int]:
    """(tokens, top logprobs, timings.cache_n) of one /completion."""
    obj = server.dialect._complete(ids, n, 5, None, cache=cache)
    probs = [[(e["id"], e["logprob"]) for e in p["top_logprobs"]] for p in obj["completion_probabilities"]]
    return obj["tokens"], probs, obj["timings"]["cache_n"]


def test_the_server_gate_starts_keeps_no_context_checkpoints(server: LlamaServerEngine) -> None:
    info = server.info()
    assert info["ctx_checkpoints"] == 0
    command = info["command"]
    assert command[command.index("--ctx-checkpoints") + 1] == "0"


@pytest.mark.parametrize("shared_short_of_the_end", [1, 3, 8])
def test_a_prompt_after_a_sibling_is_computed_again_not_restored_from_a_snapshot(
    server: LlamaServerEngine, prompt: list[int], shared_short_of_the_end: int
) -> None:
    cold = ask(server, prompt, cache=False)
    sibling = prompt[:-shared_short_of_the_end] + [prompt[-1] + 1] * shared_short_of_the_end
    ask(server, sibling, cache=True)
    tokens, probs, cached = ask(server, prompt, cache=True)
    assert cached == 0  # the server's default would restore a checkpoint a few tokens short of the sibling's end
    assert (tokens, probs) == cold[:2]


def test_a_prompt_that_continues_the_slot_reuses_its_state_bit_for_bit(
    server: LlamaServerEngine, prompt: list[int]
) -> None:
    own, _, _ = ask(server, prompt, cache=True, n=3)
    for i in range(1, 3):
        longer = prompt + own[:i]
        cold = ask(server, longer, cache=False, n=1)
        ask(server, longer[:-1], cache=True, n=1)
        tokens, probs, cached = ask(server, longer, cache=True, n=1)
        assert cached == len(longer) - 1  # the state after every token but the new one, continued
        assert (tokens, probs) == cold[:2]
