"""A small OpenAI-compatible completions server for tests, with faults on demand.

It answers `/v1/completions` and `/v1/models` on 127.0.0.1 (a free port) from a tiny
deterministic "model" (`FakeModel`), in the shape vLLM's server answers: token-id
prompts, `logprobs` with `return_tokens_as_token_ids`, `echo` with prompt logprobs.
Tests script faults with a queue of `Reply` objects that the next requests consume (one
each), and read the call history in `requests`. Behaviour knobs (`token_keys`,
`omit_chosen`, `prompt_logprobs`) make it a server that does less than vLLM does.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson

VOCAB = 500
EOS = 2


class QuietServer(ThreadingHTTPServer):
    """socketserver's threaded HTTP server, except that a client hanging up mid-answer (the
    hostile-client tests, a bounded read that stops early) is not printed as an error of the
    fake's; every other error in a handler is printed as socketserver prints it."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


@dataclass(frozen=True)
class FakeModel:
    """Greedy next token = a hash of the context; a fixed ladder of log-probabilities."""

    vocab: int = VOCAB

    def top(self, context: Sequence[int]) -> list[tuple[int, float]]:
        """(token, logprob) for the 24 likeliest tokens after `context`, likeliest first
        (more than the top-20 a pin asks for: a server lists as many as asked)."""
        h = 7
        for t in context:
            h = (h * 31 + t + 1) % 1_000_003
        best = 3 + h % (self.vocab - 3)  # never EOS, never 0..2
        # Logits: the greedy token clearly ahead, then a ladder; normalised over the vocab
        # with the rest at -8 so the logprobs are real log-probabilities.
        logits = {best: 4.0}
        for j in range(1, 24):
            logits[(best + 37 * j) % self.vocab] = 4.0 - 0.75 * j if j < 8 else -1.5 - 0.25 * (j - 8)
        rest = self.vocab - len(logits)
        norm = math.log(sum(math.exp(v) for v in logits.values()) + rest * math.exp(-8.0))
        pairs = [(t, v - norm) for t, v in logits.items()]
        return sorted(pairs, key=lambda p: (-p[1], p[0]))

    def logprob(self, context: Sequence[int], token: int) -> float:
        for t, lp in self.top(context):
            if t == token:
                return lp
        norm = self.top(context)[0][1] - 4.0  # -log Z
        return -8.0 + norm

    def greedy(self, prompt: Sequence[int], n: int) -> list[int]:
        out: list[int] = []
        for _ in range(n):
            out.append(self.top([*prompt, *out])[0][0])
        return out


@dataclass
class Reply:
    """One scripted answer, consumed by the next request.

    status/body/headers: send this instead of the model's answer (body None: a JSON
    error object for status >= 400, the model's answer otherwise).
    delay: seconds to wait before answering. trickle: send the body one byte at a time,
    this many seconds apart. drop: close the connection unanswered.
    short: answer with this many fewer tokens than asked (finish_reason `length`).
    finish_reason: override the model's finish reason.
    """

    status: int = 200
    body: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    trickle: float = 0.0
    drop: bool = False
    short: int = 0
    finish_reason: str | None = None


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    at: float


class FakeOpenAIServer:
    """`with FakeOpenAIServer() as srv:` serves on `srv.url` until the block ends."""

    def __init__(
        self,
        model: FakeModel | None = None,
        *,
        served_model: str = "fake/model",
        token_keys: str = "ids",
        omit_chosen: bool = False,
        prompt_logprobs: str = "echo",
        answer_model: str | None = None,
        listed_models: list[str] | None = None,
    ) -> None:
        # token_keys: "ids" honours return_tokens_as_token_ids; "text" ignores it.
        # prompt_logprobs: "echo" (vLLM: echo arrays and a prompt_logprobs field), "field"
        # (only the prompt_logprobs field), "ignore" (echo ignored), "reject" (400).
        self.model = model or FakeModel()
        self.served_model = served_model
        self.token_keys = token_keys
        self.omit_chosen = omit_chosen
        self.prompt_logprobs = prompt_logprobs
        # The model name the answers carry (default: the served one): a server serving another model.
        self.answer_model = answer_model
        # What `/v1/models` lists (default: the served model): a server listing another model.
        self.listed_models = listed_models
        self.script: deque[Reply] = deque()
        self.requests: list[Seen] = []
        self.connections = 0
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle

    @property
    def port(self) -> int:
        assert self._httpd is not None
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeOpenAIServer:
        handler = _make_handler(self)
        httpd = QuietServer(("127.0.0.1", 0), handler)
        httpd.daemon_threads = True
        httpd.block_on_close = False
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ behaviour

    def queue(self, *replies: Reply) -> None:
        self.script.extend(replies)

    def completion_requests(self) -> list[Seen]:
        return [r for r in self.requests if r.path.endswith("/completions")]

    def _next_reply(self) -> Reply | None:
        with self._lock:
            return self.script.popleft() if self.script else None

    def _key(self, token: int) -> str:
        return f"token_id:{token}" if self.token_keys == "ids" else f"tok{token % 7}"

    def answer(self, body: dict[str, Any], reply: Reply | None) -> tuple[int, dict[str, Any]]:
        prompt = body.get("prompt")
        if not isinstance(prompt, list) or not prompt or not all(isinstance(t, int) for t in prompt):
            return 400, _error("prompt must be a non-empty list of token ids", 400)
        if body.get("model") != self.served_model:
            return 404, _error(f"The model `{body.get('model')}` does not exist.", 404)
        k = body.get("logprobs")
        max_tokens = int(body.get("max_tokens", 16))
        echo = bool(body.get("echo"))
        if echo and self.prompt_logprobs == "reject":
            return 400, _error("echo is not supported with logprobs", 400)
        n = max_tokens - (reply.short if reply else 0)
        generated = self.model.greedy(prompt, n)
        finish = (reply.finish_reason if reply and reply.finish_reason else None) or "length"
        choice: dict[str, Any] = {"index": 0, "text": "", "finish_reason": finish, "stop_reason": None}
        if k is not None:
            positions = [[*prompt, *generated[:i]] for i in range(len(generated))]
            tokens = [self._key(t) for t in generated]
            token_lps: list[float | None] = [
                self.model.logprob(ctx, t) for ctx, t in zip(positions, generated, strict=True)
            ]
            tops: list[dict[str, float] | None] = [
                self._top_map(ctx, t, int(k)) for ctx, t in zip(positions, generated, strict=True)
            ]
            if echo and self.prompt_logprobs in ("echo", "field"):
                rows: list[dict[str, Any] | None] = [None]
                for i in range(1, len(prompt)):
                    row = {
                        str(t): {"logprob": lp, "rank": r + 1, "decoded_token": f"tok{t}"}
                        for r, (t, lp) in enumerate(self.model.top(prompt[:i])[: int(k)])
                    }
                    row.setdefault(
                        str(prompt[i]),
                        {"logprob": self.model.logprob(prompt[:i], prompt[i]), "rank": 99, "decoded_token": "x"},
                    )
                    rows.append(row)
                choice["prompt_logprobs"] = rows
                if self.prompt_logprobs == "echo":
                    tokens = [self._key(t) for t in prompt] + tokens
                    token_lps = (
                        [None] + [self.model.logprob(prompt[:i], prompt[i]) for i in range(1, len(prompt))] + token_lps
                    )
                    tops = [None] + [self._top_map(prompt[:i], prompt[i], int(k)) for i in range(1, len(prompt))] + tops
            choice["logprobs"] = {
                "text_offset": list(range(len(tokens))),
                "token_logprobs": token_lps,
                "tokens": tokens,
                "top_logprobs": tops,
            }
        return 200, {
            "id": "cmpl-fake",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.answer_model or self.served_model,
            "choices": [choice],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(generated)},
        }

    def _top_map(self, context: Sequence[int], chosen: int, k: int) -> dict[str, float]:
        # Like vLLM: the chosen token first, then the top k (a repeat keeps its first place).
        out: dict[str, float] = {}
        if not self.omit_chosen:
            out[self._key(chosen)] = self.model.logprob(context, chosen)
        for t, lp in self.model.top(context)[:k]:
            if self.omit_chosen and t == chosen:
                continue
            out.setdefault(self._key(t), lp)
        return out


def _error(message: str, code: int) -> dict[str, Any]:
    return {"error": {"message": message, "type": "BadRequestError", "code": code}}


def _make_handler(server: FakeOpenAIServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        trickle = 0.0

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def setup(self) -> None:
            super().setup()
            with server._lock:
                server.connections += 1

        def _read_body(self) -> Any:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                return orjson.loads(raw) if raw else None
            except orjson.JSONDecodeError:
                return raw

        def _send(self, status: int, payload: bytes, headers: dict[str, str] | None = None) -> None:
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                if self.trickle:
                    for i in range(len(payload)):
                        self.wfile.write(payload[i : i + 1])
                        self.wfile.flush()
                        time.sleep(self.trickle)
                else:
                    self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError, OSError):
                pass  # the client gave up (a timeout test)

        def _handle(self, method: str) -> None:
            body = self._read_body() if method == "POST" else None
            with server._lock:
                server.requests.append(Seen(method, self.path, dict(self.headers.items()), body, time.monotonic()))
            reply = server._next_reply()
            self.trickle = reply.trickle if reply is not None else 0.0
            if reply is not None and reply.delay:
                time.sleep(reply.delay)
            if reply is not None and reply.drop:
                self.close_connection = True
                self.connection.shutdown(2)
                return
            if reply is not None and reply.status != 200:
                payload = (
                    reply.body if reply.body is not None else orjson.dumps(_error("scripted failure", reply.status))
                )
                self._send(reply.status, payload, reply.headers)
                return
            if reply is not None and reply.body is not None and self.path != "/v1/models":
                self._send(200, reply.body, reply.headers)  # any route: a native API's answer too
                return
            if self.path == "/v1/models" and method == "GET":
                listed = server.listed_models if server.listed_models is not None else [server.served_model]
                data = {"object": "list", "data": [{"id": name, "object": "model"} for name in listed]}
                self._send(200, orjson.dumps(data))
                return
            if self.path != "/v1/completions" or method != "POST":
                self._send(404, orjson.dumps(_error(f"no route {method} {self.path}", 404)))
                return
            status, obj = server.answer(body if isinstance(body, dict) else {}, reply)
            self._send(status, orjson.dumps(obj), reply.headers if reply else None)

        def do_GET(self) -> None:
            self._handle("GET")

        def do_POST(self) -> None:
            self._handle("POST")

    return Handler


def no_retry_engine(url: str, **opts: str) -> Any:
    """gate's OpenAI engine on a fake server: no retries, short waits, one request at a time."""
    from gate.engines.http.openai import OpenAIEngine

    base = {"model": "fake/model", "retries": "0", "backoff": "0.01", "timeout": "5", "concurrency": "1"}
    return OpenAIEngine("fake/model", base_url=url, **{**base, **opts})


def serve(**kwargs: Any) -> Iterator[FakeOpenAIServer]:
    """For fixtures: `yield from serve(...)`."""
    srv = FakeOpenAIServer(**kwargs).start()
    try:
        yield srv
    finally:
        srv.stop()


def write_fake_pin(
    root: Path,
    model: str = "fake/model",
    *,
    fake: FakeModel | None = None,
    n: int = 4,
    max_tokens: int = 6,
    top_k: int = 5,
) -> Path:
    """A pin folder under `root` whose oracle is `fake` (the model this server serves), so
    `gate run --engine openai` can gate the server without any real model. Returns the
    pin file. The prompts are text; their pinned token ids are the text's bytes."""
    from gate.core.pins.oracle_settings import OracleSettings
    from gate.core.pins.pin import folder_for_writing, oracle_header, write_pin
    from gate.core.pins.suite import parse_suite
    from gate.core.traces.trace import PromptRecord, Trace

    fake = fake or FakeModel()
    rows = [{"id": f"p{i}", "text": f"fake prompt {i}: " + "x" * i, "max_tokens": max_tokens} for i in range(n)]
    suite = parse_suite(b"".join(orjson.dumps(r) + b"\n" for r in rows)).resolved(max_tokens)
    records = []
    for sp in suite:
        assert sp.text is not None
        prompt = tuple(sp.text.encode())
        ids = fake.greedy(prompt, max_tokens)
        tops = [[[t, lp] for t, lp in fake.top([*prompt, *ids[:i]])[:top_k]] for i in range(len(ids))]
        records.append(PromptRecord(sp.id, prompt, tuple(ids), tops, "length", prompt=sp.text))
    # oracle.json names the engine that recorded the pin (gate refuses a pin claimed for another).
    settings = OracleSettings(model=model, engine="fake-oracle", max_tokens=max_tokens, top_k=top_k)
    header = oracle_header(
        model=model,
        info={"name": "fake-oracle", "version": "0"},
        settings=settings,
        suite=suite,
        top_k=top_k,
        software={},
    )
    folder = folder_for_writing(model, root)
    write_pin(folder, suite, settings, Trace(header, tuple(records)), force=False)
    return folder.pin_path
