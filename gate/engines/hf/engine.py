"""The HF engine: any transformers causal LM, decoded greedily by gate's own loop.

gate does not call `model.generate`: it runs the model forward itself, one prompt at a
time with a KV cache (one prefill pass over the prompt, then one forward per new token),
so that every step goes through two small methods that tests and fault injection can
see and wrap:

- `_logits_hook(logits, position)`: the float32 logits of one step, before anything is
  read from them. Identity here; `gate selftest` wraps it to inject faults.
- `_pick(logits)`: the greedy choice, `torch.argmax`, ties to the lowest token id (or, with
  `tie_break=highest`, deliberately the highest: the gate's own mutation test).

`force` runs the very same step function while feeding the oracle's tokens, so on the
engine's own tokens it reproduces `generate` bit for bit.

Schedules (`gate invariance`, docs/guides/invariance.md): `batch_size` N > 1 decodes up to N prompts
of one `generate` call together, left-padded to the longest with an attention mask (and
position ids counted from each prompt's first real token), one forward per step for the
whole batch; a batch of one, and the default `batch_size` 1, is the one-prompt loop above,
unchanged. `prefill_chunk` C > 0 prefills a prompt C tokens at a time through the KV cache
(a chunked prefill). `prefix_cache` keeps the KV cache of the last prompts prefilled and
reuses a new prompt's longest cached prefix, computing only the rest
(`gate.engines.hf.schedules.PrefixCache`). `force_mode=prefill` computes a forced decode in one forward over the
prompt and the fed tokens instead of a decode step per token.

Options (`--engine-opt key=value`): device (cpu, cuda, cuda:N, mps, xpu; default cpu),
dtype (bfloat16, float16, float32; default bfloat16), tie_break (lowest, highest),
trust_remote_code (default false), revision, attn_implementation (e.g. eager, sdpa),
threads (torch's intra-op threads for the whole process; default torch's choice, one per
core: on a machine shared with other jobs, 1 avoids OpenMP spinning against them, which
measured 7x slower per token with 2 threads on 2 busy cores), batch_size (default 1),
prefill_chunk (default 0: the whole prompt in one forward), force_mode (decode, prefill),
prefix_cache (default false).

MoE models (docs/guides/moe-routing.md): forward hooks on the routers (`gate.engines.hf.routing`,
installed only when the model has MoE routers) record each input token's experts and
router scores, in the records' `routed_experts`/`router_top` (free run) and
`forced_routed_experts`/`forced_router_top` (forced). Options: record_routing (default
true), routing (own, or oracle: use the pin's recorded experts instead of the router's
own top-k; the scores are still computed and recorded), router_tie_break (lowest, or
highest: a deliberate mutant taking the higher expert ids among equal router scores).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from gate.core.diagnosis.capture import PREFILL, Capture, activations_of
from gate.core.engine import ForcedDecode, PromptInput, parse_options
from gate.core.traces.trace import PromptRecord
from gate.engines._common import (
    Pairs,
    TokenizerMethods,
    check_forced_ids,
    check_prompt_ids,
    greedy_record,
    host_platform,
    sort_top,
)
from gate.engines._common import stop_token_ids as _stop_token_ids
from gate.engines._machine import host_machine
from gate.engines.hf.loading import device_name, device_of, load_tokenizer, to_device
from gate.engines.hf.routing import SOFTMAX, RouterHooks, find_routers
from gate.engines.hf.schedules import PrefixCache, force_prefill, generate_batch, prefill_cached, prefill_chunked
from gate.errors import EngineError, InputError
from gate.models.default import resolve_model_path

OPTIONS: dict[str, tuple[type, Any]] = {
    "device": (str, "cpu"),
    "dtype": (str, "bfloat16"),
    "tie_break": (str, "lowest"),
    "trust_remote_code": (bool, False),
    "revision": (str, None),
    "attn_implementation": (str, None),
    "threads": (int, None),
    "record_routing": (bool, True),
    "routing": (str, "own"),
    "router_tie_break": (str, "lowest"),
    "batch_size": (int, 1),
    "prefill_chunk": (int, 0),
    "force_mode": (str, "decode"),
    "prefix_cache": (bool, False),
}
FORCE_MODES = ("decode", "prefill")
ROUTING_MODES = ("own", "oracle")
DTYPES: dict[str, torch.dtype] = {
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
}
TIE_BREAKS = ("lowest", "highest")
# Extra candidates `top_k_pairs` asks torch.topk for, to see past a tie at the k-th place.
TOP_K_MARGIN = 8


@dataclass(frozen=True, slots=True)
class StepResult:
    """What one decode step yields: the greedy choice, its raw float32 logit, and the
    top-k list (None when top_k is 0)."""

    chosen: int
    logit: float
    top: Pairs | None


class HFEngine(TokenizerMethods):
    """Greedy decoding of a transformers causal LM; see the module doc for the options."""

    name = "hf"
    # gate.core.engine.SCHEDULE_KNOBS -> the option that sets it (`gate invariance`).
    schedule_knobs: ClassVar[Mapping[str, str]] = {
        "batch_size": "batch_size",
        "threads": "threads",
        "chunked_prefill": "prefill_chunk",
        "force_mode": "force_mode",
        "prefix_cache": "prefix_cache",
    }

    def __init__(self, model: str, **options: Any) -> None:
        # `tokenizer=False` (a bool, from Python; never an --engine-opt string): ids only, no
        # tokenizer (gate diagnose's reference and honest engine are given ids, and loading
        # the default model's tokenizer costs about two prefills of a short context).
        tokenizer = options.pop("tokenizer") if isinstance(options.get("tokenizer"), bool) else True
        lender = options.pop("lender", None)  # Python only: gate.engines.hf.borrow.load_causal_lm
        opts = parse_options(self.name, options, OPTIONS)
        dtype_name = str(opts["dtype"]).lower()
        if dtype_name not in DTYPES:
            raise InputError(f"--engine-opt dtype={opts['dtype']}: expected one of bfloat16, float16, float32")
        tie_break = str(opts["tie_break"]).lower()
        if tie_break not in TIE_BREAKS:
            raise InputError(f"--engine-opt tie_break={opts['tie_break']}: expected lowest or highest")
        self.model_id = model
        self.options = opts
        self.dtype = DTYPES[dtype_name]
        self.tie_break = tie_break
        self.device = device_of(str(opts["device"]))
        self.batch_size, self.prefill_chunk, self.force_mode = _schedule(opts)
        if opts["threads"] is not None:
            if opts["threads"] < 1:
                raise InputError(f"--engine-opt threads={opts['threads']}: expected a positive integer")
            torch.set_num_threads(int(opts["threads"]))
        self.model_path = resolve_model_path(model)

        kwargs: dict[str, Any] = {"dtype": self.dtype, "trust_remote_code": bool(opts["trust_remote_code"])}
        if opts["revision"]:
            kwargs["revision"] = opts["revision"]
        if opts["attn_implementation"]:
            kwargs["attn_implementation"] = opts["attn_implementation"]
        from gate.engines.hf.borrow import load_causal_lm

        try:
            loaded, self.borrowed = load_causal_lm(self.model_path, kwargs, lender, self.dtype)
        except OSError as exc:
            # transformers' way of saying "no such folder or repo, or not cached offline".
            raise InputError(f"cannot load model {model!r}: {exc}") from None
        self.model: Any = to_device(loaded, self.device).eval()
        self.tokenizer = load_tokenizer(self.model_path, kwargs) if tokenizer else None
        self.stop_ids = _stop_token_ids(self.tokenizer, getattr(self.model, "generation_config", None))
        self.vocab_size: int | None = getattr(self.model.config, "vocab_size", None)
        self.router_hooks = self._routing_hooks(opts)
        self.prefix_store = PrefixCache.for_options(opts, self.batch_size, self.router_hooks is not None)
        self.oracle_routing: Mapping[tuple[int, ...], Any] | None = None
        self._rows: list[Any] = []  # this prompt's routing so far: experts, then router top
        self._tops: list[Any] = []
        self._seq = 0

    # ------------------------------------------------------------------ the contract

    def info(self) -> dict[str, Any]:
        import transformers

        return {
            "name": self.name,
            "version": transformers.__version__,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "device": str(self.device),
            "device_name": device_name(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
            "tie_break": self.tie_break,
            "attn_implementation": getattr(self.model.config, "_attn_implementation", None),
            "threads": torch.get_num_threads(),
            "options": {k: v for k, v in self.options.items() if v is not None},
            "model": self.model_id,
            "model_path": self.model_path,
            "architecture": type(self.model).__name__,
            **host_platform(),
            **({"moe": self._moe_info()} if self.router_hooks is not None else {}),
            "hardware": host_machine(self.device.type, self.device.index),
        }

    def generate(self, prompts: Sequence[PromptInput], top_k: int) -> list[PromptRecord]:
        """Greedy free run of each prompt; see `gate.core.engine.Engine` for the shapes.

        Beyond v1's fields, each record's `token_logits` holds the raw (float32)
        logit of the chosen token at every position. With `batch_size` N > 1, up to N
        prompts at a time are decoded together (`gate.engines.hf.schedules`).
        """
        size = len(prompts) if self.batch_size == 0 else self.batch_size
        if size <= 1:
            return [self._generate_one(p, top_k) for p in prompts]
        out: list[PromptRecord] = []
        for start in range(0, len(prompts), size):
            chunk = prompts[start : start + size]
            out.extend(generate_batch(self, chunk, top_k) if len(chunk) > 1 else [self._generate_one(chunk[0], top_k)])
        return out

    def force(self, prompt_token_ids: Sequence[int], token_ids: Sequence[int], top_k: int) -> ForcedDecode:
        """Teacher-forced decode: prefill the prompt, then at each position i record this
        engine's greedy choice and top-k, and feed `token_ids[i]` (the oracle's token) as the
        next input, one decode step at a time through the KV cache, exactly as `generate`
        does with its own choice."""
        check_prompt_ids("forced", prompt_token_ids, self.vocab_size)
        check_forced_ids(token_ids, self.vocab_size)
        if self.force_mode == "prefill" and token_ids:
            return force_prefill(self, prompt_token_ids, token_ids, top_k)
        chosen: list[int] = []
        tops: list[Pairs] = []
        logits_out: list[float] = []
        self._start_routing(prompt_token_ids)
        with torch.inference_mode():
            logits, cache = self._prefill(prompt_token_ids) if token_ids else (None, None)
            for i, fed in enumerate(token_ids):
                step = self._step(logits, i, top_k)
                chosen.append(step.chosen)
                logits_out.append(step.logit)
                if step.top is not None:
                    tops.append(step.top)
                if i + 1 < len(token_ids):
                    logits, cache = self._decode(int(fed), cache)
        return ForcedDecode(
            token_ids=tuple(chosen),
            top_logprobs=tops if top_k > 0 else None,
            mode="decode",
            extra={"token_logits": logits_out, **self._routing_extra("forced_")},
        )

    # ------------------------------------------------------------------ gate diagnose
    def capture_path(
        self,
        prompt_token_ids: Sequence[int],
        context_token_ids: Sequence[int],
        path: str,
        logits_from: int | None = None,
    ) -> Capture:
        """`CapturesPaths` and `CapturesReference`: forward hooks on this engine's own model
        (gate.engines.hf.capture, loaded only for `gate diagnose`)."""
        from gate.engines.hf.capture import capture_hf

        return capture_hf(self, prompt_token_ids, context_token_ids, path, logits_from=logits_from)

    def capture_paths_shared(
        self, decode_prompt_token_ids: Sequence[int], context_token_ids: Sequence[int], logits_from: int = 0
    ) -> dict[str, Capture]:
        """`CapturesReference`: both paths from one prefill (gate.engines.hf.capture)."""
        from gate.engines.hf.capture import capture_hf_shared

        return capture_hf_shared(self, decode_prompt_token_ids, context_token_ids, logits_from=logits_from)

    def widens_exactly(self) -> bool:
        """`CapturesReference`: whether `widen` gives this model's float32 load (gate.engines.hf.upcast)."""
        from gate.engines.hf.upcast import widens_exactly

        return widens_exactly(self)

    def widen(self) -> None:
        """`CapturesReference`: this engine's weights widened to float32 in place."""
        from gate.engines.hf.upcast import widen

        widen(self)

    def capture_activations(
        self, context_token_ids: Sequence[int], names: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        """`CapturesActivations`: one prefill over the context through `capture_path`."""
        return activations_of(self.capture_path(context_token_ids, context_token_ids, PREFILL), names)

    def prefix_reuse(self) -> tuple[int, int]:
        """`ReportsPrefixReuse`: (prompts prefilled from a cached prefix, tokens taken from it)."""
        store = self.prefix_store
        return (store.hits, store.reused_tokens) if store is not None else (0, 0)

    def close(self) -> None:
        # Hooks that live as long as the model (routing, the reference's widening) and the
        # modules they hold form cycles: removed, a closed model is freed at once, not when
        # the cyclic collector next runs (tests/engines/test_hf_close_releases.py).
        widening = getattr(self.model, "_gate_widening", None)
        if widening is not None:
            widening.remove()
        if self.router_hooks is not None:
            self.router_hooks.remove()
        self.model = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    # ------------------------------------------------------------------ the decode loop

    def _generate_one(self, prompt: PromptInput, top_k: int) -> PromptRecord:
        check_prompt_ids(prompt.id, prompt.prompt_token_ids, self.vocab_size)
        ids: list[int] = []
        tops: list[Pairs] = []
        logits_out: list[float] = []
        finish = "length"
        self._start_routing(prompt.prompt_token_ids)
        with torch.inference_mode():
            logits, cache = self._prefill(prompt.prompt_token_ids) if prompt.max_tokens > 0 else (None, None)
            for i in range(prompt.max_tokens):
                step = self._step(logits, i, top_k)
                ids.append(step.chosen)
                logits_out.append(step.logit)
                if step.top is not None:
                    tops.append(step.top)
                if step.chosen in self.stop_ids:
                    finish = "stop"
                    break
                if i + 1 < prompt.max_tokens:
                    logits, cache = self._decode(step.chosen, cache)
        texts = self.decode_tokens(ids)
        routing = self._routing_extra("")
        return greedy_record(
            prompt, ids, tops if top_k > 0 else None, finish, texts, token_logits=logits_out, **routing
        )

    def _prefill(self, prompt_ids: Sequence[int]) -> tuple[torch.Tensor, Any]:
        """One forward over the whole prompt. Returns (logits of the last position, shape
        [vocab], in the model's dtype; the KV cache the model built). With `prefill_chunk`
        C, the prompt goes C tokens a forward through the cache instead."""
        ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=self.device)
        self._seq = 0
        if self.prefix_store is not None:
            return prefill_cached(self, ids)
        if self.prefill_chunk > 0 and ids.shape[1] > self.prefill_chunk:
            return prefill_chunked(self, ids)
        out = self._forward(ids, input_ids=ids, use_cache=True, logits_to_keep=1)
        return out.logits[0, -1], out.past_key_values

    def _decode(self, token: int, cache: Any) -> tuple[torch.Tensor, Any]:
        """One decode step: feed one token against the cache. Returns ([vocab] logits, cache)."""
        ids = torch.tensor([[token]], dtype=torch.long, device=self.device)
        out = self._forward(ids, input_ids=ids, past_key_values=cache, use_cache=True)
        return out.logits[0, -1], out.past_key_values

    # ------------------------------------------------------------------ MoE routing

    def _forward(self, ids: torch.Tensor, **kwargs: Any) -> Any:
        """One model call; on an MoE model, with its routing recorded (and replayed)."""
        hooks = self.router_hooks
        if hooks is None:
            return self.model(**kwargs)
        hooks.begin(self._seq)
        out = self.model(**kwargs)
        if self.options["record_routing"]:
            rows, top = hooks.take()
            self._rows.extend(rows)
            self._tops.extend(top)
        self._seq += int(ids.shape[1])
        return out

    def _routing_hooks(self, opts: Mapping[str, Any]) -> RouterHooks | None:
        mode, tie = str(opts["routing"]).lower(), str(opts["router_tie_break"]).lower()
        if mode not in ROUTING_MODES:
            raise InputError(f"--engine-opt routing={opts['routing']}: expected own or oracle")
        if tie not in ("lowest", "highest"):
            raise InputError(f"--engine-opt router_tie_break={opts['router_tie_break']}: expected lowest or highest")
        if not opts["record_routing"] and mode == "own" and tie == "lowest":
            return None  # nothing to record or change: the model runs untouched
        routers = find_routers(self.model)
        if not routers:
            if mode == "oracle" or tie == "highest":
                raise InputError(
                    f"--engine-opt routing/router_tie_break: {self.model_id!r} has no MoE router gate knows"
                )
            return None
        hooks = RouterHooks(routers, tie_break=tie)
        if tie == "highest" and hooks.kind != SOFTMAX:
            hooks.remove()
            raise InputError("--engine-opt router_tie_break=highest is for softmax routers (not grouped top-k)")
        return hooks

    def replay_routing(self, oracle: Mapping[tuple[int, ...], Any]) -> None:
        """The oracle's recorded experts by prompt token ids (gate.core.verdict.routing.oracle_routing),
        used instead of the router's own choice when `routing=oracle`."""
        self.oracle_routing = oracle

    def _start_routing(self, prompt_ids: Sequence[int]) -> None:
        self._rows, self._tops = [], []
        hooks = self.router_hooks
        if hooks is None or self.options["routing"] != "oracle":
            return
        rows = self.oracle_routing.get(tuple(prompt_ids)) if self.oracle_routing is not None else None
        if rows is None:
            raise InputError(
                "--engine-opt routing=oracle: the pin has no recorded routing for this prompt "
                "(record the pin with the vllm engine on an MoE model: docs/guides/moe-routing.md)"
            )
        hooks.replay = rows

    def _routing_extra(self, prefix: str) -> dict[str, Any]:
        if self.router_hooks is None or not self.options["record_routing"] or not self._rows:
            return {}
        return {f"{prefix}routed_experts": self._rows, f"{prefix}router_top": self._tops}

    def _moe_info(self) -> dict[str, Any]:
        hooks = self.router_hooks
        assert hooks is not None
        return {
            "layers": hooks.layers,
            "top_k": hooks.top_k,
            "num_experts": hooks.num_experts,
            "source": "hf_router_hooks",
            "score": hooks.score_name,
            "routing": self.options["routing"],
            "router_tie_break": hooks.tie_break,
        }

    def _step(self, raw_logits: torch.Tensor | None, position: int, top_k: int) -> StepResult:
        """Read one position: raw logits ([vocab], model dtype) to the greedy choice, the
        chosen token's float32 logit, and the top-k list.

        Logprobs are `log_softmax` of the float32-cast logits, as vLLM's sampler computes
        them (`logits.log_softmax(dim=-1, dtype=torch.float32)`).
        """
        assert raw_logits is not None  # callers prefill before the first step
        logits = self._logits_hook(raw_logits.float(), position)
        chosen = self._pick(logits)
        logit = float(logits[chosen])
        if top_k <= 0:
            return StepResult(chosen, logit, None)
        logprobs = torch.log_softmax(logits, dim=-1)
        top = top_k_pairs(logprobs, top_k, chosen)
        if not all(math.isfinite(lp) for _, lp in top):
            raise EngineError(f"the model produced non-finite logits at position {position} (NaN or inf)")
        return StepResult(chosen, logit, top)

    def _logits_hook(self, logits: torch.Tensor, position: int) -> torch.Tensor:
        """The float32 logits ([vocab]) of generated position `position`, before anything
        reads them. Identity; fault injection (`gate selftest`) wraps this."""
        return logits

    def _pick(self, logits: torch.Tensor) -> int:
        """The greedy choice from float32 logits of shape [vocab]."""
        if self.tie_break == "highest":
            # The wrong convention, on purpose: the last maximal index, so that the gate's
            # own mutation test can check it is caught as exact ties with tie_break "higher_id".
            return int(logits.shape[-1] - 1 - torch.argmax(logits.flip(-1)))
        # Ties go to the lowest token id. PyTorch documents torch.argmax: "If there are
        # multiple maximal values then the indices of the first maximal value are
        # returned." vLLM's greedy sampler is `logits.argmax(dim=-1)` (Sampler.greedy_sample;
        # on CPU its `_C.greedy_argmax` op, which also returns the first maximum), so the
        # oracle and this engine break exact ties the same way.
        return int(torch.argmax(logits))


def top_k_pairs(logprobs: torch.Tensor, k: int, chosen: int) -> Pairs:
    """The top-k of `logprobs` ([vocab] float32) as trace pairs, logprob descending then id
    ascending, always including `chosen`.

    `torch.topk` picks arbitrarily among values tied at the k-th place; the list here is
    exact: every id strictly above the k-th value, then the lowest ids equal to it.
    """
    vocab = logprobs.shape[-1]
    k = min(k, vocab)
    # One topk with a margin settles the common case: when the margin's last value is
    # below the k-th, every id tied with the k-th is among the candidates. Only a tie
    # group running past the margin needs the two full-vocabulary scans below.
    values, ids = torch.topk(logprobs, min(k + TOP_K_MARGIN, vocab))
    kth = values[k - 1]
    if ids.numel() == vocab or bool(values[-1] < kth):
        pairs = sort_top(zip(ids.tolist(), values.tolist(), strict=True))[:k]
    else:
        above = torch.nonzero(logprobs > kth).flatten()
        at = torch.nonzero(logprobs == kth).flatten()[: k - above.numel()]
        exact = torch.cat([above, at])
        pairs = sort_top(zip(exact.tolist(), logprobs[exact].tolist(), strict=True))
    if all(t != chosen for t, _ in pairs):
        pairs = sort_top([(t, lp) for t, lp in pairs] + [(chosen, float(logprobs[chosen]))])
    return pairs


def _schedule(opts: Mapping[str, Any]) -> tuple[int, int, str]:
    """(batch_size, prefill_chunk, force_mode) from the options, each checked."""
    batch, chunk, mode = opts["batch_size"], opts["prefill_chunk"], str(opts["force_mode"]).lower()
    if batch < 0:
        raise InputError(f"--engine-opt batch_size={batch}: expected 0 (all at once) or a positive integer")
    if chunk < 0:
        raise InputError(f"--engine-opt prefill_chunk={chunk}: expected 0 (whole prompt) or a positive integer")
    if mode not in FORCE_MODES:
        raise InputError(f"--engine-opt force_mode={opts['force_mode']}: expected decode or prefill")
    return int(batch), int(chunk), mode
