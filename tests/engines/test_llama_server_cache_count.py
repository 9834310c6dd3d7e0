"""What llama-server's answers say of its prompt cache (`timings.cache_n`), read by the engine
into `prefix_reuse` against a scripted server on 127.0.0.1: a count is taken only while every
answer carries a whole number between 0 and the prompt's length; a missing, odd or hostile one
makes the engine not report (None), never a count of reuse and never an error. The real
server's counts are in tests/engines/test_engine_llama_server.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from helpers.fake_openai_server import FakeOpenAIServer, Reply

from gate.core.engine import PromptInput, ReportsPrefixReuse
from gate.engines.http.llama_server import LlamaServerEngine

PROMPT = PromptInput("p0", (11, 12, 13), 1)
ABSENT = object()


@pytest.fixture
def engine(server: FakeOpenAIServer) -> Iterator[LlamaServerEngine]:
    eng = LlamaServerEngine("fake/model", base_url=server.url, retries="0", timeout="5")
    try:
        yield eng
    finally:
        eng.close()


def answer(cache_n: Any = ABSENT, *, timings: Any = ABSENT, **extra: Any) -> Reply:
    """llama-server's answer to PROMPT (one token), its `timings` as given."""
    body: dict[str, Any] = {
        "tokens": [5],
        "stop_type": "limit",
        "tokens_evaluated": len(PROMPT.prompt_token_ids),
        "generation_settings": {"samplers": ["temperature"], "temperature": 0},
        **extra,
    }
    if timings is ABSENT and cache_n is not ABSENT:
        timings = {"cache_n": cache_n, "prompt_n": 1}
    if timings is not ABSENT:
        body["timings"] = timings
    return Reply(body=orjson.dumps(body))


def serve(server: FakeOpenAIServer, engine: LlamaServerEngine, *replies: Reply) -> None:
    server.queue(*replies)
    for _ in replies:
        [rec] = engine.generate([PROMPT], 0)
        assert rec.token_ids == (5,)


def test_the_servers_counts_are_summed_over_its_answers(server: FakeOpenAIServer, engine: LlamaServerEngine) -> None:
    assert isinstance(engine, ReportsPrefixReuse)
    serve(server, engine, answer(0))
    assert engine.prefix_reuse() == (0, 0), "a cold answer: counted, nothing reused"
    serve(server, engine, answer(2), answer(3), answer(0))
    assert engine.prefix_reuse() == (2, 5)


def test_no_answer_yet_reports_nothing(engine: LlamaServerEngine) -> None:
    assert engine.prefix_reuse() is None


@pytest.mark.parametrize(
    "reply",
    [
        answer(),  # no timings at all
        answer(timings={"prompt_n": 3}),  # timings without cache_n
        answer(timings=None),
        answer(timings=[2]),
        answer(timings="cache_n=2"),
        answer(tokens_cached=3),  # the slot's whole cache after the request, not what it reused
    ],
    ids=["no-timings", "no-cache_n", "timings-null", "timings-list", "timings-string", "tokens_cached-only"],
)
def test_a_server_that_does_not_say_is_not_reported_as_serving_nothing(
    server: FakeOpenAIServer, engine: LlamaServerEngine, reply: Reply
) -> None:
    serve(server, engine, reply)
    assert engine.prefix_reuse() is None


# `timings.cache_n` as the raw JSON text a server might send, for a 3-token prompt.
HOSTILE = {
    "negative": "-1",
    "true": "true",
    "false": "false",
    "float-whole": "2.0",
    "float": "1.5",
    "string": '"2"',
    "null": "null",
    "list": "[2]",
    "object": '{"n": 2}',
    "over-prompt": "4",
    "huge": str(2**62),
    "past-64-bit": str(10**23),
}


@pytest.mark.parametrize("cache_n", HOSTILE.values(), ids=HOSTILE.keys())
def test_an_odd_or_hostile_count_is_never_reuse_and_never_an_error(
    server: FakeOpenAIServer, engine: LlamaServerEngine, cache_n: str
) -> None:
    body = answer(0).body
    assert body is not None and body.count(b'"cache_n":0') == 1
    reply = Reply(body=body.replace(b'"cache_n":0', b'"cache_n":' + cache_n.encode()))
    serve(server, engine, answer(2), reply, answer(2))
    assert engine.prefix_reuse() is None, "one answer the engine cannot count leaves the total unknown"


def test_a_count_the_whole_prompt_long_is_still_a_count(server: FakeOpenAIServer, engine: LlamaServerEngine) -> None:
    serve(server, engine, answer(len(PROMPT.prompt_token_ids)))
    assert engine.prefix_reuse() == (1, 3)


def test_requests_the_engine_never_sends_count_nothing(server: FakeOpenAIServer, engine: LlamaServerEngine) -> None:
    [rec] = engine.generate([PromptInput("none", (11, 12), 0)], 0)  # max_tokens 0: no request
    assert rec.token_ids == () and not server.completion_requests() and engine.prefix_reuse() is None
