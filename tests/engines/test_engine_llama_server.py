"""`--engine llama-server`: a real llama-server (scripts/install.sh --llama-server) on 127.0.0.1,
started by the engine on a free port, serving the default model's own Q4_1 GGUF.

One server for the module; every request loop is bounded by the prompts' max_tokens.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.llama_servers import llama_server_binary

from gate.core.engine import Engine, PromptInput
from gate.engines.http.llama_server import LlamaServerEngine
from gate.engines.registry import load_engine
from gate.errors import EngineError, InputError
from gate.models.default import DEFAULT_MODEL, materialize_default

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(llama_server_binary() is None, reason="no llama-server (scripts/install.sh --llama-server)"),
]

# The default pin's prompts "chat-capital" (its oracle stops on <|im_end|> after 8 tokens) and
# "code-numpy" ("import numpy as np").
CHAT = (1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407, 19712, 8182, 2)
CHAT += (198, 1, 4093, 198, 1780, 314, 260, 3575, 282, 7158, 47, 19842, 281, 582, 6330, 30, 2, 198, 1, 520, 9531, 198)
CODE = (2017, 6772, 347, 2333)


@pytest.fixture(scope="module")
def engine() -> Iterator[LlamaServerEngine]:
    # The default model built first (any earlier `gate run` builds it): the engine reads the
    # GGUF the pin's weights were dequantised from in its manifest. On a fresh machine no
    # earlier test need have built it.
    materialize_default()
    eng = load_engine("llama-server", DEFAULT_MODEL, {"threads": "1"})
    assert isinstance(eng, LlamaServerEngine)
    try:
        yield eng
    finally:
        eng.close()


def test_it_is_an_engine_and_names_its_server(engine: LlamaServerEngine) -> None:
    assert isinstance(engine, Engine)
    info = engine.info()
    assert info["name"] == "llama-server" and info["started_by_gate"] is True
    assert info["server_build"] and "llama-cpp-python-0.3.36" in info["server_build"]
    assert info["n_ctx"] == 2048 and info["total_slots"] == 1 and info["threads"] == 1
    assert info["health"] == "ok" and info["tie_break"] == "lowest_id"
    assert Path(info["server_model_path"]).name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    # The default pin's weights were dequantised from exactly the GGUF the server runs.
    assert info["pin_weights_dequantised_from_this_gguf"] is True
    assert info["model_meta"]["n_vocab"] == 49152
    json.dumps(info)  # provenance goes into the trace header as JSON


def test_greedy_is_the_argmax_of_the_full_distribution(engine: LlamaServerEngine) -> None:
    [rec] = engine.generate([PromptInput(id="code", prompt_token_ids=CODE, max_tokens=12)], 20)
    assert len(rec.token_ids) == 12 and rec.finish_reason == "length"
    assert rec.top_logprobs is not None and len(rec.top_logprobs) == 12
    for token, top in zip(rec.token_ids, rec.top_logprobs, strict=True):
        assert top[0][0] == token  # the pick is the top of its own list (lowest id among ties first)
        assert top == sorted(top, key=lambda p: (-p[1], p[0]))
        # Probabilities of the whole vocabulary: the top 20 hold at most all of the mass.
        assert sum(math.exp(lp) for _, lp in top) <= 1.0 + 1e-5


def test_top_logprobs_do_not_depend_on_how_many_are_asked(engine: LlamaServerEngine) -> None:
    # A truncated, renormalised distribution would change every logprob with k.
    p = PromptInput(id="code", prompt_token_ids=CODE, max_tokens=4)
    [wide] = engine.generate([p], 20)
    [narrow] = engine.generate([p], 3)
    assert wide.token_ids == narrow.token_ids
    assert wide.top_logprobs is not None and narrow.top_logprobs is not None
    for w, n in zip(wide.top_logprobs, narrow.top_logprobs, strict=True):
        assert [t for t, _ in n] == [t for t, _ in w[: len(n)]]
        # Equal up to the prompt cache (the second request re-evaluates the prompt's last
        # token alone, not in a prefill batch): about 1e-5 nats. Renormalising over the top 3
        # would move them by the log of the mass left out, tenths of a nat here.
        assert all(abs(a[1] - b[1]) < 1e-4 for a, b in zip(n, w, strict=False))


def test_a_chat_prompt_stops_on_the_end_of_turn_token(engine: LlamaServerEngine) -> None:
    [rec] = engine.generate([PromptInput(id="chat", prompt_token_ids=CHAT, max_tokens=64)], 5)
    assert rec.finish_reason == "stop" and len(rec.token_ids) < 64
    assert rec.token_ids[-1] == 2  # <|im_end|>, kept in the record as vLLM keeps its stop token


def test_forced_decode_on_its_own_tokens_gives_them_back(engine: LlamaServerEngine) -> None:
    [rec] = engine.generate([PromptInput(id="code", prompt_token_ids=CODE, max_tokens=6)], 5)
    forced = engine.force(CODE, rec.token_ids, 5)
    assert forced.mode == "decode" and forced.token_ids == rec.token_ids
    assert forced.top_logprobs is not None and [t[0][0] for t in forced.top_logprobs] == list(rec.token_ids)


def test_forced_decode_follows_the_oracle_not_its_own_picks(engine: LlamaServerEngine) -> None:
    [rec] = engine.generate([PromptInput(id="code", prompt_token_ids=CODE, max_tokens=3)], 0)
    other = 11 if rec.token_ids[0] != 11 else 12
    forced = engine.force(CODE, (other, *rec.token_ids[1:]), 0)
    [after] = engine.generate([PromptInput(id="c2", prompt_token_ids=(*CODE, other), max_tokens=2)], 0)
    assert forced.token_ids[0] == rec.token_ids[0] and forced.token_ids[1] == after.token_ids[0]


def test_the_servers_prompt_cache_count_is_the_shared_prefix(engine: LlamaServerEngine) -> None:
    # One slot: the second prompt finds the first's tokens in it (timings.cache_n).
    [rec] = engine.generate([PromptInput(id="code", prompt_token_ids=CODE, max_tokens=2)], 0)
    first = engine.prefix_reuse()
    longer = (*CODE, 30, 31)
    engine.generate([PromptInput(id="longer", prompt_token_ids=longer, max_tokens=2)], 0)
    second = engine.prefix_reuse()
    assert first is not None and second is not None, "llama-server says what its prompt cache served"
    held = (*CODE, *rec.token_ids)
    shared = next(i for i, (a, b) in enumerate(zip((*held, -1), longer, strict=False)) if a != b)
    assert shared >= len(CODE)
    assert (second[0] - first[0], second[1] - first[1]) == (1, shared), (first, second)


def test_an_existing_server_is_gated_through_base_url(engine: LlamaServerEngine) -> None:
    assert engine.process is not None
    other = LlamaServerEngine(DEFAULT_MODEL, base_url=engine.process.url)
    try:
        assert other.info()["started_by_gate"] is False
        [a] = other.generate([PromptInput(id="code", prompt_token_ids=CODE, max_tokens=4)], 0)
        [b] = engine.generate([PromptInput(id="code", prompt_token_ids=CODE, max_tokens=4)], 0)
        assert a.token_ids == b.token_ids
    finally:
        other.close()
    with pytest.raises(InputError, match="threads: only for a server gate starts"):
        LlamaServerEngine(DEFAULT_MODEL, base_url=engine.process.url, threads="2")


def test_a_token_outside_the_vocabulary_is_refused_once_with_the_servers_words(engine: LlamaServerEngine) -> None:
    with pytest.raises(EngineError) as info:
        engine.generate([PromptInput(id="bad", prompt_token_ids=(5, 10**6), max_tokens=2)], 0)
    msg = str(info.value)
    assert "HTTP 400" in msg and "the server refused the request" in msg and "attempts" not in msg


def test_no_binary_is_a_clear_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not an executable file"):
        LlamaServerEngine(DEFAULT_MODEL, binary=str(tmp_path / "nope"))
