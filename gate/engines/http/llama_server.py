"""`--engine llama-server`: llama.cpp's own HTTP server, through its native API.

Without `base_url`, gate starts the llama-server binary (`scripts/install.sh --llama-server`
builds it from the llama.cpp source llama-cpp-python 0.3.36 ships) on the GGUF — by default the
embedded default model's own `SmolLM2-135M-Instruct.Q4_1.gguf`, the file `--engine llamacpp`
runs — on a free port of 127.0.0.1, and stops it at the end. With `base_url`, gate gates a
server that is already running (its threads and context are then the server's own).

Requests (`POST /completion`):
- the prompt as the pinned token ids (a token-id prompt gets no BOS added: llama-server adds
  one only to a string prompt), checked back through the answer's `tokens_evaluated`;
- greedy as the argmax with the lowest id among equal maxima, as `torch.argmax`: the sampler
  chain is `samplers: ["temperature"]` with `temperature: 0` and nothing else, and
  llama.cpp's temperature sampler at 0 keeps the first strict maximum in a scan of the
  candidates in token-id order (`llama_sampler_temp_impl`: `if (logit > max_l)`). Any
  top-k/top-p/min-p stage before it would re-order the candidates by a partial sort that is
  not stable, and the penalty stages change the argmax, so none is in the chain;
  `backend_sampling: false` keeps the pick on the host (ggml's argmax op keeps the last
  maximum). The answer's `generation_settings` must show these settings, or gate refuses it;
- `n_probs: k` with `post_sampling_probs: false`: the top k of the softmax over the whole
  vocabulary (`get_token_probabilities`: float32 logits, float32 exp and sum), each as
  `{"id", "logprob"}` with `logprob = log(p)` in float32. So the logprobs are of the full
  distribution, not of a truncated one, and are used as they are (re-sorted by logprob, then
  id); `post_sampling_probs: true` would give probabilities renormalised over whatever the
  sampler chain kept, which is why gate never asks for them;
- `cache_prompt: true`, so forced decode costs one new token per request. A free run's
  requests carry the `cache_prompt` option (default true: the server reuses the prefix a
  slot holds from the previous request); `cache_prompt=false` computes every prompt cold
  (the `prefix_cache` knob of `gate invariance`).

A server gate starts runs with `--ctx-checkpoints 0` (`--engine-opt ctx_checkpoints=N` sets
another count). A recurrent or hybrid model's state (a Gated DeltaNet's conv and recurrent
state in Qwen3.5/3.6, Mamba's) holds the sequence's last token only and cannot be cut back to
a shared prefix. With context checkpoints (llama-server's default, 32 a slot) the server
snapshots that state a few tokens before each prompt's end, prefilling the prompt in two
forwards to do so, and serves a later prompt that shares the prefix by restoring a snapshot and
prefilling the rest: the state then comes from another request's computation, in another
split. Without them it reuses a slot only where the new prompt continues exactly the tokens
the state holds (forced decode: one token more) and otherwise computes the prompt again from
scratch, in one forward, as `--engine llamacpp` does. A dense model never checkpoints, so the
option changes nothing there. A server at `base_url` runs with its own setting.

What the prompt cache served: every answer's `timings.cache_n` (prompt tokens taken from the
slot's cache), summed into `prefix_reuse` (`ReportsPrefixReuse`), which is None, "does not
report", until an answer has come and for good after one without a count gate can take
(`gate.engines.http.llama_server_cache`).

Forced decode (`forced=decode`, the default): one request per oracle position, the prompt
plus the oracle's tokens so far with `n_predict: 1`; the server finds the common prefix in
its cache and evaluates the one new token, so each position goes through llama.cpp's decode
path on the KV cache, as a server decodes. The server offers no prompt logprobs, so there is
no prefill mode.

Provenance from `/props` (build, model path, context per slot, slots), `/health` and
`/v1/models` (the model's metadata), plus, for a server gate started, the command, threads,
the GGUF and its sha256.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, NoReturn

import orjson

from gate.core.engine import ForcedDecode, ForcedDecodeUnavailable, PromptInput, parse_options
from gate.core.storage.digests import known_sha256
from gate.core.traces.trace import PromptRecord
from gate.engines._common import Pairs, check_prompt_ids, greedy_record, locate_gguf
from gate.engines.http.llama_server_cache import PromptCacheCount
from gate.engines.http.llama_server_process import LlamaServerProcess, find_binary
from gate.engines.http.openai_http import HttpClient, logprobs_agree
from gate.engines.http.server import HTTP_OPTIONS, BoundedPool, ServerEngine, check_http_options, connect
from gate.errors import EngineError, InputError
from gate.models.default import DEFAULT_MODEL, default_source_sha256

FORCED_MODES = ("decode", "none")
# The sampler chain whose pick is the argmax with the lowest id among equal maxima.
GREEDY_SAMPLERS = ("temperature",)
STOP_TYPES = {"eos": "stop", "limit": "length"}
# Options that only mean something for a server gate starts itself.
SPAWN_OPTIONS = (
    "binary",
    "model_path",
    "threads",
    "threads_batch",
    "n_ctx",
    "n_batch",
    "n_ubatch",
    "startup_timeout",
    "ctx_checkpoints",
)

OPTIONS: dict[str, tuple[type, Any]] = {
    **HTTP_OPTIONS,
    "forced": (str, "decode"),
    "binary": (str, None),
    "model_path": (str, None),
    "threads": (int, None),
    "threads_batch": (int, None),
    "n_ctx": (int, None),
    "n_batch": (int, None),
    "n_ubatch": (int, None),
    "startup_timeout": (float, None),
    "cache_prompt": (bool, True),
    "ctx_checkpoints": (int, None),
}
DEFAULT_THREADS = 1
DEFAULT_N_CTX = 2048
DEFAULT_STARTUP_S = 120.0
# No context checkpoints: a recurrent state is continued or computed again, never restored
# from another request's snapshot (see the module doc).
DEFAULT_CTX_CHECKPOINTS = 0


class LlamaServerDialect:
    """llama.cpp's native `/completion` API, token ids in and out (see the module doc)."""

    name = "llama.cpp /completion"

    def __init__(
        self,
        http: HttpClient,
        *,
        retries: int,
        forced_mode: str,
        cache_prompt: bool = True,
        cache_count: PromptCacheCount | None = None,
    ) -> None:
        self.http = http
        self.cache_count = cache_count if cache_count is not None else PromptCacheCount()
        self.cache_prompt = cache_prompt
        self.retries = retries
        self.forced_mode = forced_mode
        self.where = f"{http.endpoint.root_display}/completion"

    # ----------------------------------------------------------------- the dialect

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"base_url": self.http.endpoint.root_display, "tie_break": "lowest_id"}
        out["cache_prompt"] = self.cache_prompt
        out["sampling"] = {"samplers": list(GREEDY_SAMPLERS), "temperature": 0, "backend_sampling": False}
        out["logprobs"] = "log of llama-server's float32 softmax over the full vocabulary (n_probs, pre-sampling)"
        props = self._get("/props")
        if isinstance(props, dict):
            settings = props.get("default_generation_settings")
            out["server_build"] = props.get("build_info")
            out["server_model_path"] = props.get("model_path")
            out["total_slots"] = props.get("total_slots")
            if isinstance(settings, dict):
                out["n_ctx"] = settings.get("n_ctx")
        health = self._get("/health")
        if isinstance(health, dict):
            out["health"] = health.get("status")
        models = self._get("/v1/models")
        data = models.get("data") if isinstance(models, dict) else None
        if isinstance(data, list) and data and isinstance(data[0], dict) and isinstance(data[0].get("meta"), dict):
            out["model_meta"] = data[0]["meta"]
        return out

    def generate(self, prompt: PromptInput, top_k: int) -> PromptRecord:
        check_prompt_ids(prompt.id, prompt.prompt_token_ids, None)
        if prompt.max_tokens == 0:
            return greedy_record(prompt, (), [] if top_k > 0 else None, "length", ())
        obj = self._complete(prompt.prompt_token_ids, prompt.max_tokens, top_k, prompt.id, cache=self.cache_prompt)
        ids, tops = self._read(obj, top_k, prompt.id)
        n, asked = len(ids), prompt.max_tokens
        finish = STOP_TYPES.get(str(obj.get("stop_type")))
        if finish is None:
            self._fail(prompt.id, f"stop_type {obj.get('stop_type')!r} (expected 'eos' or 'limit')")
        if n > asked or (n < asked and finish != "stop") or (finish == "length" and n != asked):
            self._fail(prompt.id, f"returned {n} of {asked} tokens with stop_type {obj.get('stop_type')!r}")
        texts = [str(e.get("token", "")) for e in obj.get("completion_probabilities") or []]
        return greedy_record(prompt, ids, tops, finish, texts if len(texts) == n else None)

    def force(self, prompt_token_ids: Sequence[int], token_ids: Sequence[int], top_k: int) -> ForcedDecode:
        if self.forced_mode == "none":
            raise ForcedDecodeUnavailable(
                f"{self.where}: forced decode is off (--engine-opt forced=none); "
                "positions after a prompt's first divergence stay unadjudicated"
            )
        check_prompt_ids("forced", prompt_token_ids, None)
        prefix = [int(t) for t in prompt_token_ids]
        chosen: list[int] = []
        tops: list[Pairs] = []
        for i, fed in enumerate(token_ids):
            obj = self._complete(prefix, 1, top_k, None)
            ids, lists = self._read(obj, top_k, None)
            if len(ids) != 1:
                self._fail(None, f"forced position {i}: {len(ids)} tokens for n_predict 1")
            chosen.append(ids[0])
            if lists is not None:
                tops.extend(lists)
            prefix.append(int(fed))
        return ForcedDecode(token_ids=tuple(chosen), top_logprobs=tops if top_k > 0 else None, mode="decode")

    def decode_tokens(self, ids: Sequence[int]) -> list[str] | None:
        out = []
        for t in ids:
            obj = self.http.call("POST", "/detokenize", orjson.dumps({"tokens": [int(t)]}), self.retries, root=True)
            content = obj.get("content") if isinstance(obj, dict) else None
            if not isinstance(content, str):
                return None
            out.append(content)
        return out

    # ----------------------------------------------------------------- requests

    def _get(self, path: str) -> Any:
        try:
            return self.http.call("GET", path, None, 0, root=True)
        except EngineError:
            return None

    def _complete(
        self, prompt_ids: Sequence[int], n_predict: int, top_k: int, prompt_id: str | None, *, cache: bool = True
    ) -> dict[str, Any]:
        body = {
            "prompt": [int(t) for t in prompt_ids],
            "n_predict": n_predict,
            "temperature": 0,
            "samplers": list(GREEDY_SAMPLERS),
            "backend_sampling": False,
            "n_probs": max(0, top_k),
            "post_sampling_probs": False,
            "cache_prompt": cache,
            "return_tokens": True,
            "stream": False,
            "ignore_eos": False,
            "stop": [],
            "seed": 0,
        }
        about = f" (prompt {prompt_id!r})" if prompt_id is not None else ""
        obj = self.http.call("POST", "/completion", orjson.dumps(body), self.retries, root=True, about=about)
        if not isinstance(obj, dict):
            self._fail(prompt_id, "the answer is not a JSON object")
        if "error" in obj and "tokens" not in obj:
            self._fail(prompt_id, f"the server answered with an error: {obj['error']!r}")
        self._check_settings(obj, prompt_id)
        evaluated = obj.get("tokens_evaluated")
        if evaluated is not None and evaluated != len(prompt_ids):
            self._fail(
                prompt_id,
                f"the server evaluated {evaluated} prompt tokens for the {len(prompt_ids)} sent "
                "(it added or dropped tokens, e.g. a BOS)",
            )
        if obj.get("truncated") is True:
            self._fail(prompt_id, "the server truncated the prompt or answer to its context; raise its context size")
        self.cache_count.add(obj, len(prompt_ids))
        return obj

    def _check_settings(self, obj: Mapping[str, Any], prompt_id: str | None) -> None:
        """The server's own account of the settings it used must be the greedy ones sent."""
        settings = obj.get("generation_settings")
        if not isinstance(settings, dict):
            return
        samplers = settings.get("samplers")
        temperature = settings.get("temperature")
        if (samplers is not None and list(samplers) != list(GREEDY_SAMPLERS)) or (
            temperature is not None and temperature != 0
        ):
            self._fail(
                prompt_id,
                f"the server did not apply greedy settings (samplers {samplers!r}, temperature {temperature!r}; "
                f"sent samplers {list(GREEDY_SAMPLERS)!r}, temperature 0)",
            )

    def _read(self, obj: Mapping[str, Any], top_k: int, prompt_id: str | None) -> tuple[list[int], list[Pairs] | None]:
        tokens = obj.get("tokens")
        if not isinstance(tokens, list) or not all(type(t) is int and t >= 0 for t in tokens):
            self._fail(prompt_id, "the answer has no list of token ids in `tokens` (return_tokens)")
        ids = [int(t) for t in tokens]
        if top_k <= 0:
            return ids, None
        probs = obj.get("completion_probabilities")
        if not isinstance(probs, list) or len(probs) != len(ids):
            n = len(probs) if isinstance(probs, list) else None
            self._fail(prompt_id, f"completion_probabilities has {n} entries for {len(ids)} tokens")
        return ids, [self._top_list(entry, ids[i], top_k, prompt_id, i) for i, entry in enumerate(probs)]

    def _top_list(self, entry: Any, chosen: int, top_k: int, prompt_id: str | None, position: int) -> Pairs:
        if not isinstance(entry, dict) or entry.get("id") != chosen:
            self._fail(prompt_id, f"position {position}: completion_probabilities does not name the token {chosen}")
        listed = entry.get("top_logprobs")
        if not isinstance(listed, list):
            self._fail(prompt_id, f"position {position}: no top_logprobs list (n_probs)")
        pairs: dict[int, float] = {}
        for n, item in enumerate([*listed, entry]):
            tid: Any = item.get("id") if isinstance(item, dict) else None
            lp: Any = item.get("logprob") if isinstance(item, dict) else None
            if type(tid) is not int or tid < 0:
                self._fail(prompt_id, f"position {position}: a top_logprobs entry has no token id")
            if type(lp) not in (int, float) or not math.isfinite(lp) or lp > 0:
                self._fail(prompt_id, f"position {position}: logprob {lp!r} is not a finite number <= 0")
            if tid not in pairs:
                pairs[tid] = float(lp)
            elif n < len(listed):
                self._fail(prompt_id, f"position {position}: token {tid} is named twice in top_logprobs")
            elif not logprobs_agree(pairs[tid], float(lp)):
                self._fail(
                    prompt_id,
                    f"position {position}: the chosen token {tid} has logprob {lp!r}, its top_logprobs entry "
                    f"{pairs[tid]!r}; the answer contradicts itself",
                )
        if len(listed) < top_k:
            self._fail(
                prompt_id,
                f"position {position}: {len(listed)} top_logprobs entries where {top_k} were asked (n_probs); "
                "a shortened list cannot be judged",
            )
        # The trace's order: logprob descending, then token id ascending (torch.argmax's
        # preference among equal values); the server's own order among ties is a partial sort's.
        ordered = sorted(pairs.items(), key=lambda p: (-p[1], p[0]))
        kept = [[t, lp] for t, lp in ordered[:top_k]]
        if all(t != chosen for t, _ in kept):
            kept.append([chosen, pairs[chosen]])
        return kept

    def _fail(self, prompt_id: str | None, problem: str) -> NoReturn:
        about = f" (prompt {prompt_id!r})" if prompt_id is not None else ""
        raise EngineError(self.http.scrub(f"{self.where}{about}: {problem}"))


class LlamaServerEngine(ServerEngine):
    """A GGUF served by llama.cpp's llama-server; see the module doc for the options:
    base_url, binary, model_path, threads, threads_batch, n_ctx, n_batch, n_ubatch,
    ctx_checkpoints (default 0), cache_prompt, concurrency, forced (decode | none),
    timeout (per whole response), retries, backoff, api_key_env,
    max_response_bytes (default 16 MiB), startup_timeout."""

    name = "llama-server"
    schedule_knobs: ClassVar[Mapping[str, str]] = {
        "concurrency": "concurrency",
        "threads": "threads",
        "n_batch": "n_batch",
        "n_ubatch": "n_ubatch",
        "prefix_cache": "cache_prompt",
    }

    def __init__(self, model: str, /, **options: Any) -> None:
        opts = parse_options(self.name, options, OPTIONS)
        check_http_options(self.name, opts)
        if opts["forced"] not in FORCED_MODES:
            raise InputError(f"--engine-opt forced={opts['forced']}: expected one of {', '.join(FORCED_MODES)}")
        for key in ("threads", "threads_batch", "n_ctx", "n_batch", "n_ubatch"):
            if opts[key] is not None and opts[key] < 1:
                raise InputError(f"--engine-opt {key}={opts[key]}: expected a positive integer")
        if opts["ctx_checkpoints"] is not None and opts["ctx_checkpoints"] < 0:
            raise InputError(f"--engine-opt ctx_checkpoints={opts['ctx_checkpoints']}: expected 0 or more")
        self.model = model
        self.options = {k: v for k, v in opts.items() if v is not None}
        self.process: LlamaServerProcess | None = None
        self.spawned: dict[str, Any] = {}
        self.cache_count = PromptCacheCount()
        if opts["base_url"]:
            given = [k for k in SPAWN_OPTIONS if opts[k] is not None]
            if given:
                raise InputError(
                    f"--engine-opt {given[0]}: only for a server gate starts itself; a server at base_url "
                    "has its own (drop base_url to let gate start llama-server)"
                )
            base_url = str(opts["base_url"])
        else:
            base_url = self._start(model, opts)
        try:
            _, self.http = connect(self.name, base_url, opts)
            self.pool = BoundedPool(int(opts["concurrency"]), "gate-llama-server")
            self.dialect = LlamaServerDialect(
                self.http,
                retries=int(opts["retries"]),
                forced_mode=opts["forced"],
                cache_prompt=bool(opts["cache_prompt"]),
                cache_count=self.cache_count,
            )
        except BaseException:
            self._stop()
            raise

    def _start(self, model: str, opts: Mapping[str, Any]) -> str:
        gguf = locate_gguf(
            model,
            opts["model_path"],
            not_a_gguf="engine 'llama-server' serves a GGUF file: {model!r} is not one; give the file with "
            "--engine-opt model_path=FILE.gguf, or a running server with --engine-opt base_url=URL",
        )
        binary = find_binary(opts["binary"])
        threads = int(opts["threads"] or DEFAULT_THREADS)
        parallel = int(opts["concurrency"])
        n_ctx = int(opts["n_ctx"] or DEFAULT_N_CTX)
        # One slot per request in flight, each with n_ctx tokens of context.
        args = ["--model", str(gguf), "--threads", str(threads), "--parallel", str(parallel)]
        args += ["--ctx-size", str(n_ctx * parallel), "--threads-batch", str(opts["threads_batch"] or threads)]
        if opts["n_batch"] is not None:
            args += ["--batch-size", str(opts["n_batch"])]
        if opts["n_ubatch"] is not None:
            args += ["--ubatch-size", str(opts["n_ubatch"])]
        checkpoints = DEFAULT_CTX_CHECKPOINTS if opts["ctx_checkpoints"] is None else int(opts["ctx_checkpoints"])
        args += ["--ctx-checkpoints", str(checkpoints)]
        args += ["--n-gpu-layers", "0", "--no-webui"]
        self.process = LlamaServerProcess(
            binary, args, startup_timeout=float(opts["startup_timeout"] or DEFAULT_STARTUP_S)
        )
        self.process.start()
        sha = known_sha256(gguf)
        self.spawned = {
            "binary": str(binary),
            "command": self.process.command,
            "threads": threads,
            "parallel": parallel,
            "ctx_checkpoints": checkpoints,
            "gguf": str(gguf),
            "gguf_sha256": sha,
        }
        source = default_source_sha256() if model == DEFAULT_MODEL else None
        if source is not None:
            # The default pin's bf16 weights were dequantised from exactly this GGUF.
            self.spawned["pin_weights_dequantised_from_this_gguf"] = source == sha
        return self.process.url

    def __repr__(self) -> str:
        return f"LlamaServerEngine(base_url={self.http.endpoint.root_display!r})"

    def info(self) -> dict[str, Any]:
        out = super().info()
        out.update(model=self.model, options=self.options, started_by_gate=self.process is not None, **self.spawned)
        return out

    def prefix_reuse(self) -> tuple[int, int] | None:
        """`ReportsPrefixReuse`: (requests answered with a cached prefix, prompt tokens taken
        from the cache) by the server's own `timings.cache_n`; None where it does not say."""
        return self.cache_count.total()

    def close(self) -> None:
        super().close()
        self._stop()

    def _stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None
