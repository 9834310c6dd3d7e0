"""The server seam without a server: option checks, the refused-request rule, the bounded
pool, and the text dialect's reading of string-keyed top-k maps.

The real servers are in tests/engines/test_engine_llama_server.py and tests/engines/test_engine_openai_text.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

import orjson
import pytest

from gate.engines.http.llama_server import LlamaServerEngine
from gate.engines.http.openai import OpenAIEngine
from gate.engines.http.openai_http import HttpClient, ServerError, parse_base_url
from gate.engines.http.openai_text import TextCompletionsDialect
from gate.engines.http.server import BoundedPool
from gate.errors import EngineError, InputError
from gate.models.default import DEFAULT_MODEL


class ScriptedTransport:
    """Answers every request with one status and body, and counts the requests."""

    def __init__(self, status: int, body: Mapping[str, Any]) -> None:
        self.status = status
        self.body = orjson.dumps(body)
        self.calls = 0

    def request(self, method: str, path: str, body: bytes | None, *, root: bool = False) -> Any:
        self.calls += 1
        return self.status, "Reason", {}, self.body

    def close(self) -> None:
        pass


def _client(transport: ScriptedTransport) -> HttpClient:
    ep = parse_base_url("http://127.0.0.1:9")
    return HttpClient(ep, transport, timeout=1.0, backoff=0.0)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("status", "message", "invalid", "calls"),
    [
        (500, "1 validation error: prompt: Input should be a valid string", True, 1),
        (400, "invalid token id 1000000", True, 1),
        (422, "unprocessable", True, 1),
        (500, "CUDA out of memory", False, 3),
        (503, "loading model", False, 3),
    ],
)
def test_a_refused_request_is_not_retried_and_says_so(status: int, message: str, invalid: bool, calls: int) -> None:
    transport = ScriptedTransport(status, {"error": {"message": message}})
    with pytest.raises(EngineError) as info:
        _client(transport).call("POST", "/completions", b"{}", 2)
    assert transport.calls == calls
    assert message in str(info.value)
    assert ("the server refused the request" in str(info.value)) == invalid
    assert isinstance(info.value, ServerError) == invalid


def test_native_endpoints_live_under_the_servers_root() -> None:
    ep = parse_base_url("http://127.0.0.1:8080/proxy/v1")
    assert ep.prefix == "/proxy/v1" and ep.root == "/proxy"
    assert ep.root_display == "http://127.0.0.1:8080/proxy"


def test_the_pool_bounds_requests_in_flight_and_keeps_order() -> None:
    pool = BoundedPool(3, "t")
    lock = threading.Lock()
    live = peak = 0

    def work(x: int) -> int:
        nonlocal live, peak
        with lock:
            live += 1
            peak = max(peak, live)
        time.sleep(0.02)
        with lock:
            live -= 1
        return x * 2

    try:
        assert pool.map(work, list(range(10))) == [x * 2 for x in range(10)]
    finally:
        pool.close()
    assert peak == 3


def test_the_runner_sends_a_server_engine_its_concurrency_of_prompts_at_once() -> None:
    """With concurrency N the runner hands N prompts to one generate call, so N requests
    are in flight; handed one at a time, the pool would never run two."""
    from gate.engines.http.server import ServerEngine
    from gate.workflows.common.engine_calls import batch_size_for

    engine = ServerEngine.__new__(ServerEngine)
    engine.pool = BoundedPool(3, "t")
    try:
        assert batch_size_for(engine, 10) == 3  # type: ignore[arg-type]
    finally:
        engine.pool.close()


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"prompt": "tokens"}, "prompt=tokens: expected one of ids, text"),
        ({"prompt": "text", "forced": "prefill"}, "forced=prefill: expected one of decode, none with prompt=text"),
        ({"stop_token_ids": "2,x", "prompt": "text"}, "stop_token_ids=2,x"),
        ({"concurrency": "0"}, "concurrency=0"),
    ],
)
def test_bad_openai_options_are_input_errors(options: dict[str, str], problem: str) -> None:
    with pytest.raises(InputError, match=problem):
        OpenAIEngine(DEFAULT_MODEL, base_url="http://127.0.0.1:9", **options)


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"base_url": "http://127.0.0.1:9", "n_ctx": "4096"}, "n_ctx: only for a server gate starts"),
        ({"forced": "prefill"}, "forced=prefill: expected one of decode, none"),
        ({"threads": "0"}, "threads=0"),
        ({"model_path": "/nonexistent.gguf"}, "does not exist"),
    ],
)
def test_bad_llama_server_options_are_input_errors(options: dict[str, str], problem: str) -> None:
    with pytest.raises(InputError, match=problem):
        LlamaServerEngine(DEFAULT_MODEL, **options)


def test_the_schedule_knobs_name_options_the_engines_take() -> None:
    assert OpenAIEngine.schedule_knobs == {"concurrency": "concurrency"}
    assert set(LlamaServerEngine.schedule_knobs) == {"concurrency", "threads", "n_batch", "n_ubatch", "prefix_cache"}
    assert LlamaServerEngine.schedule_knobs["prefix_cache"] == "cache_prompt"


class _Vocab(TextCompletionsDialect):
    """The text dialect with its token-string map given, not asked of a server."""

    def __init__(self, ids: Mapping[str, int]) -> None:
        self.ids = dict(ids)
        self.http = _client(ScriptedTransport(200, {}))
        self.where = "http://127.0.0.1:9/v1/completions"
        self.max_logprobs = 20

    def _token_id(self, s: str) -> int | None:
        return self.ids.get(s)


def test_a_string_keyed_top_list_is_kept_only_while_it_can_be_trusted() -> None:
    d = _Vocab({"a": 5, "b": 3, "c": 9, "d": 1})
    # "x" names no single id: the list ends before it, though "d" after it would map.
    assert d._top_list({"a": -0.1, "b": -2.0, "x": -3.0, "d": -4.0}, 5, -0.1, 4, "p", 0) == [[5, -0.1], [3, -2.0]]
    # A logprob that rises is an entry out of place: the list ends there.
    assert d._top_list({"a": -0.1, "b": -2.0, "c": -1.0, "d": -4.0}, 5, -0.1, 4, "p", 0) == [[5, -0.1], [3, -2.0]]
    # Fewer keys than asked (4): two ids shared a key, and its value may be the other's.
    assert d._top_list({"a": -0.1, "b": -6.0, "c": -3.0}, 5, -0.1, 4, "p", 0) == [[5, -0.1]]
    # The chosen token is always in, with its own logprob.
    assert d._top_list({"x": -0.1}, 9, -0.5, 4, "p", 0) == [[9, -0.5]]
    with pytest.raises(EngineError, match="not a finite number"):
        d._top_list({"x": -0.1}, 9, float("nan"), 4, "p", 0)


def test_a_string_keyed_list_whose_chosen_entry_contradicts_token_logprobs_keeps_only_the_chosen() -> None:
    # The chosen token's string carries another id's value (ids that share a string): the
    # list is cut to the chosen token (shorter than asked, so not judged), never kept whole.
    d = _Vocab({"a": 5, "b": 3, "c": 9, "d": 1})
    assert d._top_list({"a": -0.3, "b": -2.0, "c": -3.0, "d": -4.0}, 5, -0.1, 4, "p", 0) == [[5, -0.1]]
    # Two strings that map to one id: refused, as a JSON key named twice is.
    d2 = _Vocab({"a": 5, "a ": 5, "c": 9, "d": 1})
    with pytest.raises(EngineError, match="position 0: token 5 is named twice"):
        d2._top_list({"a": -0.1, "a ": -0.2, "c": -3.0, "d": -4.0}, 5, -0.1, 4, "p", 0)
