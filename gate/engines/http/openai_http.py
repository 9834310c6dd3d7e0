"""The HTTP side of the OpenAI-compatible engine: one keep-alive connection per thread,
and requests with retries, backoff and error messages that never show the API key.

The protocol mapping (completions, logprobs, the forced decode) is the engines' own:
`gate.engines.http.openai` (vLLM's token ids), `gate.engines.http.openai_text` (servers that take text),
`gate.engines.http.llama_server` (llama.cpp's native API).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import random
import re
import socket
import ssl
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlsplit

import orjson

from gate.core.storage.json_shape import MAX_JSON_DEPTH, keys_and_depth
from gate.errors import EngineError, InputError

# A Retry-After longer than this is not waited out: the run would look hung.
MAX_RETRY_AFTER_S = 60.0
MAX_BACKOFF_S = 30.0
# Any other 4xx is the request's fault, and 501/505 are the server's final word: another
# attempt will not improve them.
NO_RETRY_5XX = frozenset({501, 505})
# Bodies quoted in error messages are cut to this many characters.
QUOTE_CHARS = 300
# The largest response body read before it is parsed (`--engine-opt max_response_bytes`).
# An honest answer is far smaller: 1,000 positions x 21 logprob entries is about 1 MB even
# in llama-server's verbose shape. The cap is what a hostile or broken server can cost per
# request in flight (parsing takes a few times the bytes), so four in flight stay in the
# hundreds of MB, never GBs.
DEFAULT_MAX_RESPONSE_BYTES = 16 * 1024 * 1024
# How far a token's `token_logprobs` value may sit from its own `top_logprobs` entry.
LOGPROB_AGREEMENT = 1e-6
# Bodies are read in chunks of this size, so the cap is checked as the bytes arrive.
_READ_CHUNK = 64 * 1024
# A JSON string in raw bytes (escapes included), for counting the colons outside strings.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
# A 5xx whose error text says the input is invalid is the request's fault, not the server's
# trouble: llama-cpp-python's server answers a body its schema refuses with HTTP 500 and the
# validation message ("Input should be a valid string"). Retrying cannot change that answer.
_INVALID_INPUT = re.compile(
    r"\b(?:invalid|not valid|should be a valid|validation errors?|unprocessable)\b", re.IGNORECASE
)


class ServerError(EngineError):
    """The server answered with an HTTP error status (kept in `status`); `invalid` is true
    when it refused the request itself (a 4xx, or a 5xx whose body says the input is invalid),
    which is never retried."""

    def __init__(self, message: str, status: int, *, invalid: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.invalid = invalid


class _TooLarge(Exception):
    """A response body past the cap (the bytes read so far are dropped)."""


class _Retryable(Exception):
    """One failed attempt that another attempt may fix; `wait` is the server's Retry-After."""

    def __init__(self, reason: str, detail: str = "", wait: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = detail
        self.wait = wait


@dataclass(frozen=True, slots=True)
class Endpoint:
    scheme: str
    host: str
    port: int
    prefix: str  # path up to and including /v1, without a trailing slash

    @property
    def display(self) -> str:
        """The URL as it may be shown: no user, password or query string."""
        default = 443 if self.scheme == "https" else 80
        port = "" if self.port == default else f":{self.port}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}{port}{self.prefix}"

    @property
    def root(self) -> str:
        """The path prefix without the trailing /v1: where a server's native, non-OpenAI
        endpoints live (llama-server's /completion, llama-cpp-python's /extras/tokenize)."""
        return self.prefix[: -len("/v1")] if self.prefix.endswith("/v1") else self.prefix

    @property
    def root_display(self) -> str:
        return self.display[: len(self.display) - len(self.prefix)] + self.root


def parse_base_url(raw: str) -> Endpoint:
    url = raw.strip()
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise InputError(f"--engine-opt base_url: not a valid URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InputError("--engine-opt base_url: expected http://HOST:PORT or https://HOST[/PREFIX]")
    path = parts.path.rstrip("/")
    # Clients disagree on whether the base URL ends in /v1; accept both.
    if not path.endswith("/v1"):
        path += "/v1"
    return Endpoint(
        scheme=parts.scheme,
        host=parts.hostname,
        port=port or (443 if parts.scheme == "https" else 80),
        prefix=path,
    )


class Transport:
    """Blocking JSON over HTTP with one keep-alive connection per thread.

    `timeout` is a deadline for the whole response (from sending the request to the last
    byte of the body), not for each socket read: a server that trickles its answer a byte
    at a time must not hold a worker forever. A timer shuts the socket down at the
    deadline, which wakes any read blocked on it. `max_bytes` caps the body, checked as
    its chunks arrive (and against Content-Length before any is read)."""

    def __init__(
        self,
        endpoint: Endpoint,
        timeout: float,
        headers: Mapping[str, str],
        max_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    ) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.headers = dict(headers)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open: set[http.client.HTTPConnection] = set()

    def _connection(self) -> tuple[http.client.HTTPConnection, bool]:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is not None:
            return conn, True
        ep = self.endpoint
        if ep.scheme == "https":
            conn = http.client.HTTPSConnection(
                ep.host, ep.port, timeout=self.timeout, context=ssl.create_default_context()
            )
        else:
            conn = http.client.HTTPConnection(ep.host, ep.port, timeout=self.timeout)
        self._local.conn = conn
        with self._lock:
            self._open.add(conn)
        return conn, False

    def _drop(self, conn: http.client.HTTPConnection) -> None:
        conn.close()
        self._local.conn = None
        with self._lock:
            self._open.discard(conn)

    def request(
        self, method: str, path: str, body: bytes | None, *, root: bool = False
    ) -> tuple[int, str, Mapping[str, str], bytes]:
        """One round trip: (status, reason, headers, body). Raises OSError/HTTPException.
        `root`: `path` is under the server's root, not under /v1."""
        headers = dict(self.headers)
        if body is not None:
            headers["Content-Type"] = "application/json"
        while True:
            conn, reused = self._connection()
            expired = threading.Event()
            timer = threading.Timer(self.timeout, _expire, (conn, expired))
            timer.daemon = True
            timer.start()
            try:
                prefix = self.endpoint.root if root else self.endpoint.prefix
                conn.request(method, prefix + path, body=body, headers=headers)
                resp = conn.getresponse()
                data = self._read_body(resp)
                if expired.is_set():  # the shutdown ended the body early: it is not whole
                    raise TimeoutError
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self._drop(conn)
                if expired.is_set():
                    raise TimeoutError(f"no complete response within {self.timeout:g} s") from None
                # Most likely a kept-alive connection the server closed while idle: one more
                # try on a fresh connection is not counted as a retry (greedy requests are
                # idempotent, so a request that did arrive may safely be sent again).
                if reused:
                    continue
                raise
            except BaseException:
                self._drop(conn)
                if expired.is_set():
                    raise TimeoutError(f"no complete response within {self.timeout:g} s") from None
                raise
            finally:
                timer.cancel()
            if resp.will_close:
                self._drop(conn)
            return resp.status, resp.reason, {k.lower(): v for k, v in resp.getheaders()}, data

    def _read_body(self, resp: http.client.HTTPResponse) -> bytes:
        length = resp.getheader("Content-Length")
        if length is not None and length.strip().isdigit() and int(length) > self.max_bytes:
            raise _TooLarge(f"Content-Length {int(length)}")
        chunks: list[bytes] = []
        size = 0
        while True:
            chunk = resp.read(_READ_CHUNK)
            if not chunk:
                if resp.length:  # the connection ended before Content-Length said
                    raise http.client.IncompleteRead(b"".join(chunks), resp.length)
                return b"".join(chunks)
            size += len(chunk)
            if size > self.max_bytes:
                raise _TooLarge(f"more than {self.max_bytes} bytes")
            chunks.append(chunk)

    def close(self) -> None:
        with self._lock:
            conns, self._open = list(self._open), set()
        for conn in conns:
            conn.close()


def _expire(conn: http.client.HTTPConnection, expired: threading.Event) -> None:
    """The response deadline passed: wake the read blocked on the socket."""
    expired.set()
    sock = conn.sock
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


class HttpClient:
    """Requests with retries: a 429, a 5xx (but 501 and 505), a timeout or a dropped
    connection is retried with exponential backoff and jitter (or the server's
    Retry-After); anything else fails at once as an EngineError naming the URL, with the
    API key scrubbed from every message."""

    def __init__(
        self,
        endpoint: Endpoint,
        transport: Transport,
        *,
        timeout: float,
        backoff: float,
        secret: str = "",
        hints: Mapping[int, str] | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self.backoff = backoff
        self.hints = dict(hints or {})
        self._transport = transport
        self._secret = secret

    def scrub(self, text: str) -> str:
        return text.replace(self._secret, "[api key]") if self._secret else text

    def close(self) -> None:
        self._transport.close()

    def call(
        self, method: str, path: str, body: bytes | None, retries: int, *, root: bool = False, about: str = ""
    ) -> Any:
        """The decoded JSON answer of one request, retried as the class doc says. `root`:
        `path` is under the server's root (native endpoints), not under /v1. `about` (e.g.
        " (prompt 'p1')") follows the URL in the messages about the answer's content."""
        url = (self.endpoint.root_display if root else self.endpoint.display) + path
        attempts = retries + 1
        for attempt in range(attempts):
            try:
                return self._attempt(method, path, body, url, root, about)
            except _Retryable as exc:
                if attempt + 1 >= attempts:
                    tries = f"after {attempts} attempts" if attempts > 1 else "(retries=0)"
                    raise EngineError(self.scrub(_joined(f"{url}: {exc.reason} {tries}", exc.detail))) from None
                time.sleep(exc.wait if exc.wait is not None else self._backoff_s(attempt))
        raise AssertionError("unreachable")

    def _backoff_s(self, attempt: int) -> float:
        # Exponential with "equal jitter": half the step fixed, half random, so that
        # concurrent workers that failed together do not retry together.
        step = min(MAX_BACKOFF_S, self.backoff * 2.0**attempt)
        return step / 2 + random.uniform(0.0, step / 2)

    def _attempt(self, method: str, path: str, body: bytes | None, url: str, root: bool, about: str) -> Any:
        try:
            status, reason, headers, data = self._transport.request(method, path, body, root=root)
        except _TooLarge as exc:
            cap = self._transport.max_bytes
            raise EngineError(
                self.scrub(
                    f"{url}{about}: the response body is larger than the cap of {cap} bytes ({exc}); refused "
                    "before parsing (--engine-opt max_response_bytes=N raises the cap)"
                )
            ) from None
        except TimeoutError:
            raise _Retryable(
                f"no response within {self.timeout:g} s", "a slow server needs a larger --engine-opt timeout"
            ) from None
        except ConnectionRefusedError:
            raise _Retryable("connection refused", "is the server running and listening there?") from None
        except (ConnectionError, http.client.HTTPException) as exc:
            raise _Retryable(f"connection failed ({type(exc).__name__})", str(exc)) from None
        except socket.gaierror as exc:
            raise EngineError(self.scrub(f"{url}: cannot resolve host {self.endpoint.host!r}: {exc}")) from None
        except ssl.SSLError as exc:
            raise EngineError(self.scrub(f"{url}: TLS failed: {exc}")) from None
        except OSError as exc:
            raise _Retryable("connection failed", str(exc.strerror or exc)) from None
        detail = error_text(_loads_or_text(data)) if status >= 400 else ""
        refused = status >= 400 and status not in (408, 429) and (status < 500 or bool(_INVALID_INPUT.search(detail)))
        if refused:
            # The server refused the request itself: say so, with what it said, and do not
            # send it again (another attempt gets the same answer).
            hint = self.hints.get(status, "")
            head = f"{url}: HTTP {status} {reason}{hint}: the server refused the request"
            raise ServerError(self.scrub(_joined(head, detail)), status, invalid=True)
        if status in (408, 429) or (500 <= status < 600 and status not in NO_RETRY_5XX):
            raise _Retryable(f"HTTP {status} {reason}", detail, _retry_after(headers.get("retry-after")))
        if status >= 400:
            hint = self.hints.get(status, "")
            raise ServerError(self.scrub(_joined(f"{url}: HTTP {status} {reason}{hint}", detail)), status)
        if 300 <= status < 400:
            raise EngineError(
                self.scrub(
                    f"{url}: HTTP {status} redirect to {headers.get('location', '?')!r}: "
                    "gate does not follow redirects (it would resend the key); "
                    "set base_url to the final address"
                )
            )
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise EngineError(
                self.scrub(
                    f"{url}: malformed JSON in the HTTP {status} response ({exc}); the body begins "
                    f"{quote(data.decode('utf-8', 'replace'), 80)!r}"
                )
            ) from None
        keys, depth = keys_and_depth(obj)
        if depth > MAX_JSON_DEPTH:
            raise EngineError(
                self.scrub(
                    f"{url}{about}: the answer is nested {depth} levels deep, more than {MAX_JSON_DEPTH}: "
                    "no completion answer comes near it; refused"
                )
            )
        twice = duplicate_key(data, obj, keys)
        if twice is not None:
            where, key = twice
            raise EngineError(
                self.scrub(
                    f"{url}{about}: {where} names {quote(repr(key), 60)} twice in one JSON object; refused, "
                    "because readers disagree on which value counts (orjson takes the last, others the first)"
                )
            )
        return obj


class _Twice(dict[str, Any]):
    """An object that named `key` twice (a parse only for finding it)."""

    key = ""


def duplicate_key(raw: bytes, obj: Any, keys: int | None = None) -> tuple[str, str] | None:
    """Where a JSON answer's object repeats a key: (its path, e.g. `choices[0].logprobs.
    top_logprobs[3]`, and the key), else None.

    Fast: every key is followed by one colon outside strings, so when the body holds no
    more colons than the parsed objects hold keys, no key was repeated. Only a body that
    fails that is parsed again, slowly, to find the object. `keys`: the objects' keys, when
    counted already (`keys_and_depth`); `obj` must nest at most MAX_JSON_DEPTH levels."""
    if keys is None:
        keys = keys_and_depth(obj)[0]
    colons = raw.count(b":")
    if colons == keys or (colons > keys and _JSON_STRING.sub(b"", raw).count(b":") == keys):
        return None

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                twice = _Twice(out)
                twice.key = key
                return twice
            out[key] = value
        return out

    try:
        return _find_twice(json.loads(raw, object_pairs_hook=pairs), "")
    except (ValueError, RecursionError):
        return None


def _find_twice(value: Any, path: str) -> tuple[str, str] | None:
    if isinstance(value, _Twice):
        return path or "the answer", value.key
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        hit = _find_twice(v, f"{path}[{k}]" if isinstance(k, int) else f"{path}.{k}" if path else str(k))
        if hit is not None:
            return hit
    return None


def only_choice(choices: Any) -> dict[str, Any] | str:
    """The one choice of an answer's `choices`, or what is wrong with them (a str): gate
    sends one prompt and asks for one completion, so the answer holds exactly one choice,
    for index 0 (an `index` may be left out). Two, or one for another index, would leave
    which one is the prompt's greedy continuation a guess."""
    if not isinstance(choices, list) or not choices:
        return "the response has no choices[0] object"
    choice = choices[0]
    if not isinstance(choice, dict):
        return "the response's choices[0] is not an object"
    if len(choices) != 1:
        return f"the response holds {len(choices)} choices for one prompt and one completion (n=1)"
    index = choice.get("index", 0)
    if type(index) is not int or index != 0:
        return f"the response's one choice has index {quote(repr(index), 40)}, not 0: the choice of another prompt"
    return choice


def logprobs_agree(a: float, b: float) -> bool:
    """Two logprobs a server gives for one token at one position (`token_logprobs` and its
    `top_logprobs` entry) are one number: servers compute both from the same float, so any
    difference beyond float32 rounding of a printed value means the answer contradicts itself."""
    return abs(a - b) <= LOGPROB_AGREEMENT * max(1.0, abs(a))


def _loads_or_text(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return data.decode("utf-8", "replace")


def error_text(obj: Any) -> str:
    """The message of an OpenAI-style error body ({"error": {"message": ...}}), else the body."""
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        if isinstance(err, dict):
            msg = err.get("message") or err.get("detail") or json.dumps(err)
        else:
            msg = obj.get("message") or obj.get("detail") or err
        return quote(str(msg), QUOTE_CHARS)
    return quote(str(obj), QUOTE_CHARS)


def _joined(head: str, detail: str) -> str:
    return f"{head}: {detail}" if detail else head


def quote(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date), capped."""
    if not value:
        return None
    try:
        secs = float(value)
    except ValueError:
        try:
            secs = parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError, IndexError):
            return None
    if not math.isfinite(secs):
        return None
    return min(max(secs, 0.0), MAX_RETRY_AFTER_S)
