"""An HTTP answer nested deeper than gate walks is an engine failure (exit 3, one line
naming the URL and prompt), never an internal error: orjson parses 1024 levels, Python's
recursion stops near 1000, and the duplicate-key check walked the answer recursively.
Against the fake server on 127.0.0.1 (no real server sends such an answer)."""

from __future__ import annotations

import orjson
import pytest
from helpers.fake_openai_server import FakeOpenAIServer, Reply, no_retry_engine

from gate.core.engine import PromptInput
from gate.errors import EngineError

PROMPT = PromptInput("p0", (11, 12, 13), 4)


def _honest(server: FakeOpenAIServer) -> bytes:
    body = {"model": "fake/model", "prompt": list(PROMPT.prompt_token_ids), "max_tokens": PROMPT.max_tokens}
    status, obj = server.answer({**body, "logprobs": 3}, None)
    assert status == 200
    return orjson.dumps(obj)


@pytest.mark.parametrize("levels", [990, 1020])
@pytest.mark.parametrize("dup", [False, True], ids=["fast", "duplicate-key path"])
def test_an_answer_nested_too_deep_is_an_engine_failure(server: FakeOpenAIServer, levels: int, dup: bool) -> None:
    deep = b"[" * levels + b"]" * levels
    extra = b'"x":1,"x":2,' if dup else b""
    server.queue(Reply(body=_honest(server)[:-1] + b"," + extra + b'"deep":' + deep + b"}"))
    with pytest.raises(EngineError) as info:
        no_retry_engine(server.url).generate([PROMPT], 3)
    msg = str(info.value)
    assert info.value.exit_code == 3 and "\n" not in msg
    assert f"{server.url}/v1/completions (prompt 'p0')" in msg and "nested" in msg


def test_an_honest_answer_still_passes(server: FakeOpenAIServer) -> None:
    (rec,) = no_retry_engine(server.url).generate([PROMPT], 3)
    assert rec.token_ids == tuple(server.model.greedy(PROMPT.prompt_token_ids, 4))
