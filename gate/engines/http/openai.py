"""`--engine openai`: any server that speaks the OpenAI-compatible `/v1/completions` API.

The prompt goes out as token ids (the pinned ids, never re-tokenised) and the answer comes
back as token ids: `return_tokens_as_token_ids` makes vLLM key every top-logprob map by
`"token_id:N"`, because maps keyed by decoded strings collide for distinct ids (two byte
tokens that both decode to U+FFFD, for one). A server that ignores the flag is refused
with a clear error rather than gated on guesses.

Forced decode over HTTP is possible only as a prefill: the prompt plus the oracle's tokens
go out in one request with `echo` and `logprobs`, and the prompt logprobs at each oracle
position give the server's greedy choice there (`ForcedDecode(mode="prefill")`). A server
that offers no prompt logprobs raises `ForcedDecodeUnavailable`; the runner then counts
the positions after a prompt's first divergence as unadjudicated.

`prompt=text` gates servers that take only text prompts (llama-cpp-python's server): the
dialect in `gate.engines.http.openai_text` sends the pinned text after checking the server's
tokenisation of it, and maps returned strings to ids only where that is unambiguous.

Only the standard library speaks HTTP: one keep-alive connection per worker thread, a
bounded number of retries with exponential backoff and jitter on 429, 5xx, timeouts and
dropped connections, and `Retry-After` honoured. The API key is read from the environment
variable named by `api_key_env`; it is sent in the Authorization header and nowhere else,
and every message gate builds from a server's answer is scrubbed of it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import orjson

from gate.core.engine import ForcedDecode, ForcedDecodeUnavailable, PromptInput, parse_options
from gate.core.traces.trace import PromptRecord
from gate.engines.http.openai_answers import TokenIdAnswers, keep_top, prompt_logprob_rows
from gate.engines.http.openai_http import DEFAULT_MAX_RESPONSE_BYTES, ServerError
from gate.engines.http.openai_text import TextCompletionsDialect, local_decoder, stop_ids
from gate.engines.http.server import BoundedPool, check_http_options, connect
from gate.errors import EngineError, InputError
from gate.version import __version__

FORCED_MODES = ("none", "prefill")
TEXT_FORCED_MODES = ("decode", "none")
PROMPT_MODES = ("ids", "text")
# vLLM's server refuses `logprobs` above its `--max-logprobs` (20 unless raised).
DEFAULT_MAX_LOGPROBS = 20
# Request keys the engine's correctness rests on; extra_body may not touch them.
_OWNED_KEYS = frozenset(
    {"model", "prompt", "max_tokens", "temperature", "logprobs", "echo", "n", "stream", "return_tokens_as_token_ids"}
)

SCHEMA: dict[str, tuple[type, Any]] = {
    "base_url": (str, None),
    "model": (str, None),
    "api_key_env": (str, None),
    "timeout": (float, 120.0),
    "concurrency": (int, 4),
    "retries": (int, 3),
    "backoff": (float, 0.5),
    "forced": (str, "prefill"),
    "max_logprobs": (int, DEFAULT_MAX_LOGPROBS),
    "extra_body": (str, None),
    "prompt": (str, "ids"),
    "tokenize_path": (str, "/extras/tokenize"),
    "stop_token_ids": (str, None),
    "max_response_bytes": (int, DEFAULT_MAX_RESPONSE_BYTES),
}


class OpenAIEngine(TokenIdAnswers):
    """A candidate engine behind an OpenAI-compatible HTTP server.

    Options (`--engine-opt key=value`):
      base_url      the server, e.g. http://127.0.0.1:8000 or .../v1 (required)
      model         the served model name (default: the gate model id)
      api_key_env   name of the environment variable that holds the API key
      timeout       seconds for one whole response, request to last byte (default 120)
      max_response_bytes  the largest response body read (default 16 MiB); a larger one is refused
      concurrency   requests in flight at once (default 4)
      retries       further attempts after a 429, 5xx, timeout or dropped connection (default 3)
      backoff       first backoff in seconds; doubles per attempt, with jitter (default 0.5)
      forced        "prefill" (prompt logprobs as forced data, default) or "none";
                    with prompt=text: "decode" (one request per position, default) or "none"
      max_logprobs  the server's cap on `logprobs` (vLLM: --max-logprobs, default 20)
      extra_body    a JSON object merged into every request body (a null value removes a key)
      prompt        "ids" (token ids, vLLM; default) or "text" (servers that take only text)
      tokenize_path with prompt=text: the server's tokenize endpoint under its root
                    (default /extras/tokenize, llama-cpp-python's; detokenize beside it)
      stop_token_ids with prompt=text: the ids a stop may have been on, comma-separated
                    (default: the model's eos_token_id where gate has its folder)
    """

    name = "openai"
    schedule_knobs: ClassVar[Mapping[str, str]] = {"concurrency": "concurrency"}

    def __init__(self, model: str, /, **options: Any) -> None:
        # Positional-only: `--engine-opt model=NAME` (the served name) arrives in `options`.
        opts = parse_options(self.name, options, SCHEMA)
        if not opts["base_url"]:
            raise InputError("engine 'openai' needs --engine-opt base_url=http://HOST:PORT")
        self.model = model
        self.served_model: str = opts["model"] or model
        check_http_options(self.name, opts)
        if opts["max_logprobs"] < 1:
            raise InputError(f"--engine-opt max_logprobs={opts['max_logprobs']}: expected an integer >= 1")
        if opts["prompt"] not in PROMPT_MODES:
            raise InputError(f"--engine-opt prompt={opts['prompt']}: expected one of {', '.join(PROMPT_MODES)}")
        self.prompt_mode: str = opts["prompt"]
        modes = FORCED_MODES if self.prompt_mode == "ids" else TEXT_FORCED_MODES
        if "forced" not in options and self.prompt_mode == "text":
            opts["forced"] = "decode"
        if opts["forced"] not in modes:
            raise InputError(
                f"--engine-opt forced={opts['forced']}: expected one of {', '.join(modes)} "
                f"with prompt={self.prompt_mode}"
            )
        self.timeout: float = opts["timeout"]
        self.concurrency: int = opts["concurrency"]
        self.retries: int = opts["retries"]
        self.backoff: float = opts["backoff"]
        self.forced_mode: str = opts["forced"]
        self.max_logprobs: int = opts["max_logprobs"]
        self.extra_body = _parse_extra_body(opts["extra_body"])
        self.api_key_env: str | None = opts["api_key_env"] or None
        self.endpoint, self._http = connect(
            self.name, opts["base_url"], opts, _hints(self.api_key_env, self.served_model)
        )
        self._server_models: list[str] | None = None
        self._lock = threading.Lock()
        self._answered: set[str] = set()
        self._pool = BoundedPool(self.concurrency, "gate-openai")
        self.text: TextCompletionsDialect | None = None
        if self.prompt_mode == "text":
            self.text = TextCompletionsDialect(
                self._http,
                served_model=self.served_model,
                retries=self.retries,
                max_logprobs=self.max_logprobs,
                forced_mode=self.forced_mode,
                # llama-cpp-python's name for the repetition penalty, which its greedy path applies first.
                sampling={**self._sampling_extras(), "repeat_penalty": 1.0},
                tokenize_path="/" + opts["tokenize_path"].lstrip("/"),
                stop_token_ids=stop_ids(model, opts["stop_token_ids"]),
                local_decode=local_decoder(model),
            )

    def __repr__(self) -> str:
        return f"OpenAIEngine(base_url={self.endpoint.display!r}, model={self.served_model!r})"

    # ----------------------------------------------------------------- contract

    def info(self) -> dict[str, Any]:
        if self._server_models is None:
            self._server_models = self._list_models()
        out: dict[str, Any] = {
            "name": self.name,
            "version": __version__,
            "client": "gate.engines.openai",
            "base_url": self.endpoint.display,
            "served_model": self.served_model,
            "forced": self.forced_mode,
            "max_logprobs": self.max_logprobs,
            "sampling": {"temperature": 0, **self._sampling_extras()},
            "concurrency": self.concurrency,
        }
        if self.text is not None:
            out.update(dialect=self.text.name, **self.text.describe())
        if self._server_models:
            out["server_models"] = self._server_models
        if self.api_key_env:
            out["api_key_env"] = self.api_key_env  # the variable's name, never its value
        return out

    def generate(self, prompts: Sequence[PromptInput], top_k: int) -> list[PromptRecord]:
        text = self.text
        if text is not None:
            return self._pool.map(lambda p: text.generate(p, top_k), prompts)
        return self._pool.map(lambda p: self._generate_one(p, top_k), prompts)

    def force(self, prompt_token_ids: Sequence[int], token_ids: Sequence[int], top_k: int) -> ForcedDecode:
        if self.text is not None:
            return self.text.force(prompt_token_ids, token_ids, top_k)
        if self.forced_mode == "none":
            raise ForcedDecodeUnavailable(
                f"{self.endpoint.display}: forced decode is off (--engine-opt forced=none); "
                "positions after a prompt's first divergence stay unadjudicated"
            )
        return self._prefill(tuple(prompt_token_ids), tuple(token_ids), top_k)

    def encode(
        self, text: str | None = None, messages: Sequence[Mapping[str, str]] | None = None
    ) -> tuple[int, ...] | None:
        return None  # the pinned token ids are sent as they are

    def decode_tokens(self, ids: Sequence[int]) -> list[str] | None:
        return self.text.decode_tokens(ids) if self.text is not None else None

    def close(self) -> None:
        self._pool.close()
        self._http.close()

    # ----------------------------------------------------------------- requests

    def _sampling_extras(self) -> dict[str, Any]:
        # Greedy is temperature 0, sent explicitly: a server otherwise applies the model's
        # generation config. The penalties change the argmax itself, so they are pinned
        # off too (vLLM's repetition_penalty is an extension; extra_body may drop it).
        body: dict[str, Any] = {
            "top_p": 1.0,
            "frequency_penalty": 0.0,
            "presence_penalty": 0.0,
            "repetition_penalty": 1.0,
        }
        for key, value in self.extra_body.items():
            if value is None:
                body.pop(key, None)
            else:
                body[key] = value
        return body

    def _body(self, prompt: Sequence[int], max_tokens: int, logprobs: int, **more: Any) -> bytes:
        body: dict[str, Any] = {
            "model": self.served_model,
            "prompt": list(prompt),
            "max_tokens": max_tokens,
            "temperature": 0,
            "n": 1,
            "stream": False,
            "logprobs": logprobs,
            "return_tokens_as_token_ids": True,
        }
        body.update(more)
        body.update(self._sampling_extras())
        return orjson.dumps(body)

    def _generate_one(self, prompt: PromptInput, top_k: int) -> PromptRecord:
        where = f"{self.endpoint.display}/completions"
        body = self._body(prompt.prompt_token_ids, prompt.max_tokens, self._logprobs_for(top_k))
        answer = self._post("/completions", body, about=f" (prompt {prompt.id!r})")
        self._note_model(answer)
        choice = self._choice(answer, where, prompt.id)
        lp = choice.get("logprobs")
        if not isinstance(lp, dict):
            self._fail(where, prompt.id, "the response has no logprobs (the server ignored `logprobs`)")
        tokens = lp.get("tokens")
        token_logprobs = lp.get("token_logprobs")
        tops = lp.get("top_logprobs")
        if not (isinstance(tokens, list) and isinstance(token_logprobs, list) and isinstance(tops, list)):
            self._fail(where, prompt.id, "logprobs lacks the lists tokens, token_logprobs and top_logprobs")
        if not (len(tokens) == len(token_logprobs) == len(tops)):
            self._fail(
                where,
                prompt.id,
                f"logprobs lists differ in length (tokens {len(tokens)}, token_logprobs "
                f"{len(token_logprobs)}, top_logprobs {len(tops)})",
            )
        ids = tuple(self._token_id(t, where, prompt.id, f"tokens[{i}]") for i, t in enumerate(tokens))
        finish = choice.get("finish_reason")
        n, asked = len(ids), prompt.max_tokens
        if finish not in ("stop", "length"):
            self._fail(
                where, prompt.id, f"finish_reason {finish!r} after {n} of {asked} tokens (expected stop or length)"
            )
        if n > asked:
            self._fail(where, prompt.id, f"returned {n} tokens, more than the {asked} asked for")
        if n < asked and finish != "stop":
            self._fail(
                where,
                prompt.id,
                f"returned {n} of {asked} tokens with finish_reason {finish!r}; a short answer must end with 'stop'",
            )
        top_lists = [self._top_list(tops[i], ids[i], token_logprobs[i], top_k, where, prompt.id, i) for i in range(n)]
        return PromptRecord(
            id=prompt.id,
            prompt_token_ids=tuple(prompt.prompt_token_ids),
            token_ids=ids,
            top_logprobs=top_lists if top_k > 0 else None,
            finish_reason=finish,
            prompt=prompt.prompt,
        )

    def _prefill(self, prompt_ids: tuple[int, ...], oracle_ids: tuple[int, ...], top_k: int) -> ForcedDecode:
        where = f"{self.endpoint.display}/completions"
        if not prompt_ids:
            raise ForcedDecodeUnavailable(f"{where}: prefill needs a non-empty prompt (the first token has no logprob)")
        if not oracle_ids:
            return ForcedDecode(token_ids=(), top_logprobs=[] if top_k > 0 else None, mode="prefill")
        sent = prompt_ids + oracle_ids
        k = self._logprobs_for(top_k)
        body = self._body(sent, 1, k, echo=True)
        try:
            obj = self._post("/completions", body)
        except EngineError as exc:
            if isinstance(exc, ServerError) and exc.status == 400:
                raise ForcedDecodeUnavailable(f"{exc} (echo with logprobs refused: no prefill forced data)") from None
            raise
        self._note_model(obj)
        choice = self._choice(obj, where, None)
        start = len(prompt_ids)
        # The standard echo answer first (its echoed ids prove the prompt was not
        # re-tokenised); vLLM's own prompt_logprobs field carries the same numbers.
        rows = self._echo_rows(choice, sent, where)
        if rows is None:
            rows = prompt_logprob_rows(choice, len(sent))
        if rows is None:
            raise ForcedDecodeUnavailable(
                f"{where}: the server returned no prompt logprobs for echo=true with logprobs; "
                "prefill forced data is unavailable"
            )
        greedy: list[int] = []
        lists = []
        for i, oracle_token in enumerate(oracle_ids):
            row = rows[start + i]
            if not row:
                raise ForcedDecodeUnavailable(f"{where}: no prompt logprobs at prompt position {start + i}")
            pairs = self._sorted_pairs(row.items() if isinstance(row, dict) else row, where, None, start + i)
            self._check_count(len(pairs), top_k, where, None, start + i)
            greedy.append(pairs[0][0])  # torch.argmax order: highest logprob, then lowest id
            lists.append(keep_top(pairs, oracle_token, top_k))
        return ForcedDecode(token_ids=tuple(greedy), top_logprobs=lists if top_k > 0 else None, mode="prefill")

    # ----------------------------------------------------------------- requests

    def _post(self, path: str, body: bytes, about: str = "") -> Any:
        return self._http.call("POST", path, body, self.retries, about=about)

    def _note_model(self, obj: Any) -> None:
        name = obj.get("model") if isinstance(obj, dict) else None
        if isinstance(name, str):
            with self._lock:
                self._answered.add(name)

    def late_info(self) -> dict[str, Any]:
        """Provenance only the answers show, for the trace header after the run: the model
        names the server answered as, and a warning where any is not the one asked for (a
        server that serves another model than asked is visible in the report data; vLLM
        answers a second --served-model-name alias with its first, so it is not refused)."""
        with self._lock:
            names = set(self._answered)
        if self.text is not None:
            names |= self.text.answered_models()
        if not names:
            return {}
        out: dict[str, Any] = {"answered_models": sorted(names)}
        other = sorted(names - {self.served_model})
        if other:
            out["warnings"] = [
                f"{self.endpoint.display}: the server answered as model {', '.join(map(repr, other))}, "
                f"not {self.served_model!r} as asked"
            ]
        return out

    def _list_models(self) -> list[str]:
        try:
            obj = self._http.call("GET", "/models", None, 0)
        except EngineError:
            return []
        data = obj.get("data") if isinstance(obj, dict) else None
        if not isinstance(data, list):
            return []
        return [str(m["id"]) for m in data if isinstance(m, dict) and "id" in m]


def _parse_extra_body(raw: Any) -> dict[str, Any]:
    if raw is None or raw == "":
        return {}
    if isinstance(raw, dict):
        return dict(raw)
    try:
        obj = json.loads(raw)
    except (TypeError, ValueError) as exc:
        raise InputError(f"--engine-opt extra_body: not valid JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise InputError("--engine-opt extra_body: expected a JSON object")
    owned = sorted(set(obj) & _OWNED_KEYS)
    if owned:
        raise InputError(f"--engine-opt extra_body: gate sets {', '.join(owned)} itself; leave them out")
    return obj


def _hints(api_key_env: str | None, served_model: str) -> dict[int, str]:
    """What an HTTP error status means for this engine's options, for the error message."""
    key = (
        f" (check the key in ${api_key_env})"
        if api_key_env
        else " (the server wants a key: --engine-opt api_key_env=VARIABLE)"
    )
    return {401: key, 403: key, 404: f" (is {served_model!r} the served model name? --engine-opt model=NAME)"}
