"""The seam for engines behind an HTTP server: one `Dialect` per server API, one
`ServerEngine` that turns any dialect into gate's engine contract.

A dialect owns everything that differs between servers: how a greedy request is written
(the prompt as token ids or as text, the sampler settings that make the pick the argmax),
how the answer is read back into token ids and top-k logprobs (and refused when it cannot
be read without guessing), and how forced data is obtained (`forced_mode`: "decode", one
request per position on the cached prefix; "prefill", prompt logprobs; or "none"). The
engine owns what is the same everywhere: the HTTP options, the API key, retries (in
`HttpClient`), and a bounded pool of requests in flight.

Built-in dialects: vLLM's OpenAI API with token ids (`gate.engines.http.openai`), OpenAI-style
servers that take text (`gate.engines.http.openai_text`), llama.cpp's native API
(`gate.engines.http.llama_server`). A new server (SGLang's `/generate`, TGI's `/generate`) is one
module with a dialect class and a `ServerEngine` subclass naming it, registered as a plugin
(docs/reference/engines.md describes the contract).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from typing import Any, ClassVar, Protocol, TypeVar

from gate.core.engine import ForcedDecode, PromptInput
from gate.core.traces.trace import PromptRecord
from gate.engines.http.openai_http import DEFAULT_MAX_RESPONSE_BYTES, Endpoint, HttpClient, Transport, parse_base_url
from gate.errors import InputError
from gate.version import __version__

T = TypeVar("T")
R = TypeVar("R")

# The options every server engine takes (`--engine-opt key=value`); a dialect adds its own.
HTTP_OPTIONS: dict[str, tuple[type, Any]] = {
    "base_url": (str, None),
    "api_key_env": (str, None),
    "timeout": (float, 120.0),
    "concurrency": (int, 1),
    "retries": (int, 3),
    "backoff": (float, 0.5),
    "max_response_bytes": (int, DEFAULT_MAX_RESPONSE_BYTES),
}


class Dialect(Protocol):
    """One server API. `generate` and `force` follow the engine contract's shapes
    (gate.core.engine) for one prompt; they may be called from several threads at once."""

    name: str
    forced_mode: str

    def describe(self) -> dict[str, Any]:
        """Provenance from the server itself (build, model, context, threads...)."""
        ...

    def generate(self, prompt: PromptInput, top_k: int) -> PromptRecord: ...

    def force(self, prompt_token_ids: Sequence[int], token_ids: Sequence[int], top_k: int) -> ForcedDecode: ...

    def decode_tokens(self, ids: Sequence[int]) -> list[str] | None: ...


def check_http_options(engine: str, opts: Mapping[str, Any]) -> None:
    """Refuse HTTP option values no request could honour."""
    if not (math.isfinite(opts["timeout"]) and opts["timeout"] > 0):
        raise InputError(f"--engine-opt timeout={opts['timeout']}: expected a positive number of seconds")
    if not (math.isfinite(opts["backoff"]) and opts["backoff"] >= 0):
        raise InputError(f"--engine-opt backoff={opts['backoff']}: expected a number of seconds >= 0")
    for key, low in (("concurrency", 1), ("retries", 0), ("max_response_bytes", 1)):
        if opts[key] < low:
            raise InputError(f"--engine-opt {key}={opts[key]}: expected an integer >= {low}")


def connect(
    engine: str, base_url: str, opts: Mapping[str, Any], hints: Mapping[int, str] | None = None
) -> tuple[Endpoint, HttpClient]:
    """The endpoint and HTTP client for `base_url`, with the key from `api_key_env` (sent in
    the Authorization header only, and scrubbed from every message)."""
    endpoint = parse_base_url(base_url)
    headers = {"Accept": "application/json", "User-Agent": f"gate/{__version__}"}
    secret = ""
    env = opts.get("api_key_env") or None
    if env:
        secret = os.environ.get(env, "")
        if not secret:
            raise InputError(f"--engine-opt api_key_env={env}: the environment variable is not set or empty")
        headers["Authorization"] = f"Bearer {secret}"
    http = HttpClient(
        endpoint,
        Transport(
            endpoint,
            float(opts["timeout"]),
            headers,
            int(opts.get("max_response_bytes") or DEFAULT_MAX_RESPONSE_BYTES),
        ),
        timeout=float(opts["timeout"]),
        backoff=float(opts["backoff"]),
        secret=secret,
        hints=hints,
    )
    return endpoint, http


class BoundedPool:
    """At most `workers` calls in flight; the first failure cancels the rest and is raised.
    One pool for the engine's life, so each worker thread keeps its keep-alive connection."""

    def __init__(self, workers: int, thread_name: str) -> None:
        self.workers = workers
        self._name = thread_name
        self._pool: ThreadPoolExecutor | None = None

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        if self.workers == 1 or len(items) <= 1:
            return [fn(x) for x in items]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix=self._name)
        futures: list[Future[R]] = [self._pool.submit(fn, x) for x in items]
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        for fut in futures:
            exc = fut.exception() if fut in done else None
            if exc is not None:
                for other in futures:
                    other.cancel()
                raise exc
        return [fut.result() for fut in futures]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


class ServerEngine:
    """Gate's engine contract over a `Dialect`: prompts go out `concurrency` at a time.

    A subclass sets `name`, builds `self.dialect`, `self.http` and `self.pool` in its
    `__init__`, and may add provenance in `info()`.
    """

    name: ClassVar[str] = "server"
    # The schedule knob the invariance check may turn, and the --engine-opt key that sets it.
    schedule_knobs: ClassVar[Mapping[str, str]] = {"concurrency": "concurrency"}
    dialect: Dialect
    http: HttpClient
    pool: BoundedPool

    @property
    def concurrency(self) -> int:
        """Requests in flight at once: the runner hands this many prompts to one `generate`."""
        return self.pool.workers

    def info(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": __version__,
            "dialect": self.dialect.name,
            "forced": self.dialect.forced_mode,
            "concurrency": self.pool.workers,
            **self.dialect.describe(),
        }

    def generate(self, prompts: Sequence[PromptInput], top_k: int) -> list[PromptRecord]:
        return self.pool.map(lambda p: self.dialect.generate(p, top_k), prompts)

    def force(self, prompt_token_ids: Sequence[int], token_ids: Sequence[int], top_k: int) -> ForcedDecode:
        return self.dialect.force(prompt_token_ids, token_ids, top_k)

    def encode(
        self, text: str | None = None, messages: Sequence[Mapping[str, str]] | None = None
    ) -> tuple[int, ...] | None:
        return None  # the pinned token ids are sent as they are

    def decode_tokens(self, ids: Sequence[int]) -> list[str] | None:
        return self.dialect.decode_tokens(ids)

    def close(self) -> None:
        self.pool.close()
        self.http.close()
