"""`--engine openai --engine-opt prompt=text` against a real llama-cpp-python server
(`python -m llama_cpp.server`) on 127.0.0.1, serving the default model's own Q4_1 GGUF.

One server for the module; every request loop is bounded by the prompts' max_tokens.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from helpers.llama_servers import have_llama_cpp_python_server, llama_cpp_python_server

from gate.core.engine import ForcedDecodeUnavailable, PromptInput
from gate.engines.http.openai import OpenAIEngine
from gate.errors import EngineError, InputError
from gate.models.default import DEFAULT_MODEL, find_gguf

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not have_llama_cpp_python_server(), reason="needs gate[llamacpp-server]"),
]

# The default pin's "chat-capital" (its oracle stops on <|im_end|>, id 2, after 8 tokens)
# and "code-numpy".
CHAT = (1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407, 19712, 8182, 2)
CHAT += (198, 1, 4093, 198, 1780, 314, 260, 3575, 282, 7158, 47, 19842, 281, 582, 6330, 30, 2, 198, 1, 520, 9531, 198)
CODE_TEXT = "import numpy as np"
CODE = (2017, 6772, 347, 2333)


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    gguf, _ = find_gguf()
    with llama_cpp_python_server(gguf) as base:
        yield base


@pytest.fixture(scope="module")
def engine(url: str) -> Iterator[OpenAIEngine]:
    eng = OpenAIEngine(DEFAULT_MODEL, base_url=url, prompt="text")
    try:
        yield eng
    finally:
        eng.close()


def test_token_ids_to_a_text_server_are_refused_once_with_what_it_said(url: str) -> None:
    # The first thing a user tries: this server takes no token-id prompt, and says so with a 500.
    eng = OpenAIEngine(DEFAULT_MODEL, base_url=url, backoff="30")
    try:
        with pytest.raises(EngineError) as info:
            eng.generate([PromptInput(id="p", prompt_token_ids=CODE, max_tokens=2)], 1)
    finally:
        eng.close()
    msg = str(info.value)
    assert "HTTP 500" in msg and "the server refused the request" in msg and "valid string" in msg
    assert "attempts" not in msg  # not retried (backoff=30 would have taken minutes)


def test_text_prompts_come_back_as_token_ids(engine: OpenAIEngine) -> None:
    [rec] = engine.generate([PromptInput(id="code", prompt_token_ids=CODE, max_tokens=8, prompt=CODE_TEXT)], 5)
    assert len(rec.token_ids) == 8 and rec.finish_reason == "length"
    assert rec.top_logprobs is not None
    for token, top in zip(rec.token_ids, rec.top_logprobs, strict=True):
        assert top[0][0] == token and top == sorted(top, key=lambda p: (-p[1], p[0]))
    texts = engine.decode_tokens(rec.token_ids)
    assert texts is not None and engine.text is not None
    # The ids are the ones the server's own tokenizer gives for the text it generated.
    assert engine.text._tokenize("".join(texts)) == rec.token_ids


def test_a_chat_prompt_goes_as_its_rendered_template_and_the_stop_token_is_named(engine: OpenAIEngine) -> None:
    # The pinned text of a chat prompt is its last message; the server gets the template's
    # text, recovered from the pinned ids and checked to tokenise back to them.
    p = PromptInput(id="chat", prompt_token_ids=CHAT, max_tokens=32, prompt="What is the capital of Italy?")
    [rec] = engine.generate([p], 5)
    assert rec.finish_reason == "stop" and len(rec.token_ids) < 32
    assert rec.token_ids[-1] == 2 and rec.top_logprobs is None


def test_ids_no_text_reproduces_are_refused_as_tokenizer_drift(engine: OpenAIEngine) -> None:
    # "import" split into two tokens: the same text, but not the server's tokenisation.
    assert engine.text is not None
    split = (*engine.text._tokenize("imp"), *engine.text._tokenize("ort"), *CODE[1:])
    with pytest.raises(InputError, match="tokenises its text to 4 tokens, the pin has 5"):
        engine.generate([PromptInput(id="drift", prompt_token_ids=split, max_tokens=2, prompt=CODE_TEXT)], 1)


def test_forced_decode_on_its_own_tokens_gives_them_back(engine: OpenAIEngine) -> None:
    [rec] = engine.generate([PromptInput(id="code", prompt_token_ids=CODE, max_tokens=5, prompt=CODE_TEXT)], 3)
    forced = engine.force(CODE, rec.token_ids, 3)
    assert forced.mode == "decode" and forced.token_ids == rec.token_ids


def test_forced_decode_is_unavailable_where_no_text_reproduces_the_prefix(engine: OpenAIEngine) -> None:
    # Two "\n" tokens (198) one after the other, as the oracle wrote them after code-numpy:
    # their text "\n\n" is one token (1116), so that state cannot be sent as text.
    with pytest.raises(ForcedDecodeUnavailable, match="first 2 tokens"):
        engine.force(CODE, (198, 198, 2017), 1)


def test_strings_that_name_no_single_id_are_not_mapped(engine: OpenAIEngine) -> None:
    assert engine.text is not None
    assert engine.text._token_id("") is None  # partial characters and special tokens read ""
    assert engine.text._token_id(" numpy as") is None  # two tokens
    assert engine.text._token_id(" numpy") == 6772
