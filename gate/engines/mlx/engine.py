"""The MLX engine: a model folder run by Apple's MLX with mlx-lm's model code and KV cache.

The model: by default the pinned checkpoint's own folder (the embedded default's bf16
safetensors, which `mlx_lm.load` reads as they are; for the Qwen3.6 test checkpoint, its
`mlx_lm.convert` folder), or any local folder `mlx_lm.load` accepts; `quantize=BITS` runs mlx-lm's own
quantisation of it instead (`mlx_lm.convert`, affine, group size `q_group_size`, default 64:
`gate.models.mlx_build`, cached under gate's cache with a manifest); `model_path=FOLDER`
runs a prebuilt MLX folder against the pin named by `--model`.

The decode loop is mlx-lm's own greedy loop (`mlx_lm.generate.generate_step` with its
default sampler), step for step: the prompt but its last token prefilled through the KV
cache (`make_prompt_cache`) in chunks of `prefill_step_size` tokens, then the last prompt
token alone, then one token per step. At each step `logits[:, -1, :]` in the model's dtype,
`logprobs = logits - logsumexp(logits)` in that dtype, and the pick is
`mx.argmax(logprobs, axis=-1)` (mlx-lm's `greedy_sampler`). MLX's argmax keeps the first
maximum (its CPU kernel scans with a strict `>`; its Metal kernel prefers the lower index on
equal values): ties go to the lowest id, as in the oracle. In a bfloat16 model the
subtraction is rounded to bfloat16, so two logits closer than the logprobs' bfloat16 spacing
become an exact tie there and the lower id wins even when its logit is the smaller; each
record lists such positions in `pick_not_logit_argmax` (docs/results/engine-mlx.md), beside
`token_logits` (the pick's raw logit at each position, as the HF engine gives it).

Top-k lists: the float32 values of the step's logits (exact for bfloat16 logits), log-softmax
with a float64 subtraction (`gate.engines._logits`), as the llama.cpp and ONNX Runtime GenAI
engines make them. Teacher-forced decode runs the same step function feeding the oracle's
tokens, so on the engine's own tokens it reproduces `generate` bit for bit;
`force_mode=prefill` computes the fed positions in one forward pass instead. `gate diagnose`
reads the engine's own activations through either path (gate/engines/mlx/capture.py).

Options (`--engine-opt key=value`): model_path, quantize (bits: 2, 3, 4, 5, 6, 8; 0 off; also
spelled q_bits), q_group_size (32, 64, 128; default 64), dtype (bfloat16, float16, float32;
default the folder's own), device (cpu, gpu; default MLX's), prefill_step_size (default
2048, mlx-lm's), force_mode (decode, prefill), prefix_cache (default false: reuse the KV
cache of the previous prompt for the prefix a prompt shares with it, as mlx-lm's server
does with its prompt cache), rope_from_config (default true; see below).

Rope parameters: transformers 5 writes a llama's RoPE base into `rope_parameters`, where
mlx-lm 0.32's llama reads only a top-level `rope_theta`, else 10000: silently another base (85
defects on the default pin). With `rope_from_config` (the default) they are handed to mlx-lm as
the top-level `rope_theta` (and `rope_scaling`) a transformers-4 config states, recorded
(`config_overrides`); `rope_from_config=false` runs the folder as mlx-lm reads it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any, ClassVar

import mlx.core as mx
import numpy as np
from mlx_lm.generate import generation_stream
from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache
from mlx_lm.utils import load as mlx_load

from gate.core.engine import SCHEDULE_KNOBS, ForcedDecode, PromptInput, parse_options
from gate.core.traces.trace import PromptRecord
from gate.engines._common import (
    Pairs,
    TokenizerMethods,
    check_forced_ids,
    check_prompt_ids,
    greedy_record,
    host_platform,
    stop_token_ids,
)
from gate.engines._logits import first_argmax, top_k_pairs
from gate.engines._machine import cpu_flags, cpu_model
from gate.engines.mlx.capture import capture_mlx, named_activations
from gate.errors import EngineError, InputError
from gate.models.default import DEFAULT_MODEL, materialize_default
from gate.models.hashing import source_hashes
from gate.models.mlx_build import DEFAULT_GROUP_SIZE, mlx_converted, mlx_quantised, read_mlx_manifest
from gate.models.qwen_tiny import QWEN_TINY, qwen_tiny_dir

OPTIONS: dict[str, tuple[type, Any]] = {
    "model_path": (str, None),
    "quantize": (int, 0),
    "q_bits": (int, None),
    "q_group_size": (int, DEFAULT_GROUP_SIZE),
    "dtype": (str, None),
    "device": (str, None),
    "prefill_step_size": (int, 2048),
    "force_mode": (str, "decode"),
    "prefix_cache": (bool, False),
    "rope_from_config": (bool, True),
}
DTYPES: dict[str, Any] = {"bfloat16": mx.bfloat16, "float16": mx.float16, "float32": mx.float32}
DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}
FORCE_MODES = ("decode", "prefill")
GREEDY = (
    "mlx_lm greedy_sampler: mx.argmax(logits - logsumexp(logits)) in the model's dtype "
    "(first maximum: lowest id among equals)"
)


class MLXEngine(TokenizerMethods):
    """Greedy decoding with MLX and mlx-lm's model code; see the module doc for the options."""

    name = "mlx"
    # gate.core.engine.SCHEDULE_KNOBS -> the option that sets it (`gate invariance`). The
    # prefix-cache knob is declared only where gate's vocabulary names it.
    schedule_knobs: ClassVar[Mapping[str, str]] = {
        "chunked_prefill": "prefill_step_size",
        "force_mode": "force_mode",
        **{knob: "prefix_cache" for knob in ("prefix_cache",) if knob in SCHEDULE_KNOBS},
    }

    def __init__(self, model: str, **options: Any) -> None:
        opts = parse_options(self.name, options, OPTIONS)
        bits = _bits(opts)
        if opts["prefill_step_size"] < 1:
            raise InputError(f"--engine-opt prefill_step_size={opts['prefill_step_size']}: expected a positive integer")
        force_mode = str(opts["force_mode"]).lower()
        if force_mode not in FORCE_MODES:
            raise InputError(f"--engine-opt force_mode={opts['force_mode']}: expected decode or prefill")
        dtype = _dtype_name(opts["dtype"])
        self.model_id = model
        self.options = opts
        self.bits = bits
        self.group_size = int(opts["q_group_size"])
        self.force_mode = force_mode
        self.prefill_step = int(opts["prefill_step_size"])
        self.device = _set_device(opts["device"])
        self.source: Path | None = None
        self.folder = self._locate(model, opts["model_path"], dtype)
        self.manifest = read_mlx_manifest(self.folder)
        self.model_path = str(self.source) if self.source is not None else None  # gate diagnose's reference
        try:
            self.config_overrides = _rope_overrides(self.folder) if opts["rope_from_config"] else {}
            result: Any = mlx_load(str(self.folder), model_config=dict(self.config_overrides), return_config=True)
            loaded, wrapper, config = result
        except Exception as exc:
            text = " ".join(str(exc).split()) or "no message"
            raise EngineError(f"MLX cannot load {self.folder}: {type(exc).__name__}: {text}") from None
        if dtype is not None and bits == 0:
            _cast(loaded, DTYPES[dtype])
        self.model: Any = loaded
        self.config: dict[str, Any] = dict(config)
        self.tokenizer = getattr(wrapper, "_tokenizer", wrapper)
        self.stop_ids = stop_token_ids(self.tokenizer, _Eos(self.config.get("eos_token_id")))
        vocab = self.config.get("vocab_size") or (self.config.get("text_config") or {}).get("vocab_size")
        self.vocab_size: int | None = int(vocab) if isinstance(vocab, int) else None
        self.dtype = _model_dtype(loaded)
        self._cache: list[Any] | None = None  # prefix_cache: the previous sequence's KV cache
        self._cached: list[int] = []  # ... and the tokens it holds
        self._reused = (0, 0)  # (prompts prefilled from the cache, tokens taken from it)

    def _locate(self, model: str, model_path: str | None, dtype: str | None) -> Path:
        """The folder to load: `model_path`, the model (the default's materialised folder, or a
        local folder), or the MLX-quantised build of that folder."""
        if model_path:
            folder = Path(model_path).expanduser()
            if not (folder / "config.json").is_file():
                raise InputError(f"--engine-opt model_path={model_path}: not a model folder (no config.json there)")
            if self.bits:
                self.source = folder
                return mlx_quantised(folder, self.bits, self.group_size, dtype=dtype)
            return folder
        if model == DEFAULT_MODEL:
            folder = materialize_default()
        elif model == QWEN_TINY:
            folder = qwen_tiny_dir()
        else:
            folder = Path(model).expanduser()
            if not (folder / "config.json").is_file():
                raise InputError(
                    f"engine 'mlx' runs a local model folder: {model!r} is not one (no config.json); "
                    "give a folder, or --engine-opt model_path=FOLDER with the pin's --model"
                )
        self.source = folder
        if self.bits:
            return mlx_quantised(folder, self.bits, self.group_size, dtype=dtype)
        # The Qwen3.6 test checkpoint: its mlx_lm.convert folder, float32 (MLX's CPU GatherMM has no bf16).
        return mlx_converted(folder, dtype=dtype or "float32") if model == QWEN_TINY else folder

    # ------------------------------------------------------------------ the contract

    def info(self) -> dict[str, Any]:
        manifest = self.manifest or {}
        out: dict[str, Any] = {
            "name": self.name,
            "version": _version("mlx"),
            "mlx": _version("mlx"),
            "mlx_lm": _version("mlx-lm"),
            "mlx_backend": _backend(),
            "device": str(self.device),
            "dtype": self.dtype,
            "quantization": self.config.get("quantization"),
            "greedy": GREEDY,
            "tie_break": "lowest_id",
            "logprobs": "float64(logit) - logsumexp (float32 exp, float64 sum) over the float32 values of MLX's logits",
            "prefill_step_size": self.prefill_step,
            "force_mode": self.force_mode,
            "prefix_cache": bool(self.options["prefix_cache"]),
            "config_overrides": self.config_overrides,
            "options": {k: v for k, v in self.options.items() if v is not None},
            "model": self.model_id,
            "mlx_model_dir": str(self.folder),
            "model_type": self.config.get("model_type"),
            "vocab_size": self.vocab_size,
            **host_platform(),
            "hardware": {"cpu_model": cpu_model(), "cpu_flags": cpu_flags()},
        }
        if manifest:
            out["mlx_model_sha256"] = manifest.get("model_sha256")
            out["builder"] = manifest.get("builder")
        # The folder run is the source's weights (bf16 as they are) or mlx-lm's quantisation
        # of them, so a pin recorded from the source matches; a prebuilt folder given as
        # model_path names no source and carries no weights hash.
        if self.source is not None:
            recorded = manifest.get("source") or {}
            keys = ("weights_sha256", "tokenizer_sha256")
            hashes = {k: recorded[k] for k in keys if isinstance(recorded.get(k), str)}
            out.update(hashes or source_hashes(self.source))
        return out

    def generate(self, prompts: Sequence[PromptInput], top_k: int) -> list[PromptRecord]:
        return [self._generate_one(p, top_k) for p in prompts]

    def force(self, prompt_token_ids: Sequence[int], token_ids: Sequence[int], top_k: int) -> ForcedDecode:
        """Teacher-forced decode through the KV cache: the same steps as `generate`, feeding
        the oracle's token at each position instead of the engine's pick."""
        check_prompt_ids("forced", prompt_token_ids, self.vocab_size)
        check_forced_ids(token_ids, self.vocab_size)
        if not token_ids:
            return ForcedDecode(token_ids=(), top_logprobs=[] if top_k > 0 else None, mode=self.force_mode)
        if self.force_mode == "prefill":
            return self._force_prefill(prompt_token_ids, token_ids, top_k)
        chosen: list[int] = []
        tops: list[Pairs] = []
        odd: list[int] = []
        raw: list[float] = []
        with mx.stream(generation_stream):
            cache, logits = self._prefill(prompt_token_ids)
            for i, fed in enumerate(token_ids):
                picked, row = self._pick(logits)
                # The next step's input is the oracle's token: it is computed while this
                # position's list is read.
                nxt = self._step(mx.array([int(fed)], dtype=mx.uint32), cache) if i + 1 < len(token_ids) else None
                token, top = self._read(picked, row, i, top_k, odd, raw)
                chosen.append(token)
                if top is not None:
                    tops.append(top)
                logits = nxt
        self._keep(cache, [*prompt_token_ids, *token_ids[:-1]])
        return ForcedDecode(
            token_ids=tuple(chosen),
            top_logprobs=tops if top_k > 0 else None,
            mode="decode",
            extra={"token_logits": raw, "pick_not_logit_argmax": odd},
        )

    def capture_path(self, prompt_token_ids: Sequence[int], context_token_ids: Sequence[int], path: str) -> Any:
        """`gate diagnose`'s capture through either path (gate.engines.mlx.capture)."""
        return capture_mlx(self, prompt_token_ids, context_token_ids, path)

    def capture_activations(self, context_token_ids: Sequence[int], names: Sequence[str] | None = None) -> Any:
        """The named activations of one forward over the context (a dump's content)."""
        return named_activations(self, context_token_ids, names)

    def prefix_reuse(self) -> tuple[int, int]:
        """`ReportsPrefixReuse`: (prompts prefilled from a cached prefix, tokens taken from it)."""
        return self._reused

    def close(self) -> None:
        self.model = None
        self._cache = None

    # ------------------------------------------------------------------ the decode loop

    def _generate_one(self, prompt: PromptInput, top_k: int) -> PromptRecord:
        check_prompt_ids(prompt.id, prompt.prompt_token_ids, self.vocab_size)
        ids: list[int] = []
        tops: list[Pairs] = []
        odd: list[int] = []
        raw: list[float] = []
        finish = "length"
        if prompt.max_tokens > 0:
            fed = [int(t) for t in prompt.prompt_token_ids]
            with mx.stream(generation_stream):
                cache, logits = self._prefill(fed)
                for i in range(prompt.max_tokens):
                    picked, row = self._pick(logits)
                    # As generate_step does: the next step is queued on the pick before it is
                    # read (one step wasted after a stop token, as there).
                    nxt = self._step(picked, cache) if i + 1 < prompt.max_tokens else None
                    token, top = self._read(picked, row, i, top_k, odd, raw)
                    ids.append(token)
                    if top is not None:
                        tops.append(top)
                    if nxt is not None:
                        fed.append(token)
                    if token in self.stop_ids:
                        finish = "stop"
                        break
                    logits = nxt
            self._keep(cache, fed)
        texts = self.decode_tokens(ids)
        extra = {"pick_not_logit_argmax": odd}
        return greedy_record(prompt, ids, tops if top_k > 0 else None, finish, texts, extra, token_logits=raw)

    def _step(self, tokens: Any, cache: list[Any]) -> Any:
        """One model call on `tokens` (a 1-d array) through `cache`, queued: the last position's
        logits ([1, vocab], the model's dtype)."""
        logits = self.model(tokens[None], cache=cache)[:, -1, :]
        mx.async_eval(logits)
        return logits

    def _prefill(self, prompt_ids: Sequence[int]) -> tuple[list[Any], Any]:
        """mlx-lm's prefill: every prompt token but the last through the cache in chunks of
        `prefill_step_size`, then the last one alone. With `prefix_cache`, the prefix this
        prompt shares with the cached sequence is taken from the cache instead."""
        ids = [int(t) for t in prompt_ids]
        cache, start = self._reuse(ids)
        end = len(ids) - 1
        while start < end:
            n = min(self.prefill_step, end - start)
            self.model(mx.array(ids[start : start + n], dtype=mx.uint32)[None], cache=cache)
            mx.eval([c.state for c in cache])
            start += n
        return cache, self._step(mx.array(ids[-1:], dtype=mx.uint32), cache)

    def _reuse(self, ids: Sequence[int]) -> tuple[list[Any], int]:
        """(the cache to prefill into, how many prompt tokens it already holds)."""
        cache = self._cache
        if not self.options["prefix_cache"] or cache is None:
            return make_prompt_cache(self.model), 0
        self._cache = None
        shared = 0
        for a, b in zip(self._cached, ids[:-1], strict=False):  # the last token is always run
            if a != b:
                break
            shared += 1
        if shared == 0 or not can_trim_prompt_cache(cache):
            return make_prompt_cache(self.model), 0
        trim_prompt_cache(cache, len(self._cached) - shared)
        self._reused = (self._reused[0] + 1, self._reused[1] + shared)
        return cache, shared

    def _keep(self, cache: list[Any], tokens: Sequence[int]) -> None:
        """Keep the cache of the sequence just run, and the tokens it holds (`prefix_cache`)."""
        if self.options["prefix_cache"]:
            self._cache, self._cached = cache, [int(t) for t in tokens]

    @staticmethod
    def _pick(logits: Any) -> tuple[Any, Any]:
        """mlx-lm's greedy pick, queued: `greedy_sampler` on `logits - logsumexp(logits)` in
        the model's dtype, as `generate_step` computes it (MLX's argmax keeps the first
        maximum: the lowest id); and the logits' float32 values for the top-k list."""
        logprobs = logits - mx.logsumexp(logits, keepdims=True)
        picked = mx.argmax(logprobs, axis=-1)
        row = logits.astype(mx.float32)
        mx.async_eval(picked, row)
        return picked, row

    @staticmethod
    def _read(
        picked: Any, row32: Any, position: int, top_k: int, odd: list[int], raw: list[float]
    ) -> tuple[int, Pairs | None]:
        """One position's pick and top-k list, from `_pick`'s arrays; the pick's raw logit goes
        to `raw`, and the position to `odd` when the pick is not the logits' first argmax."""
        token = int(picked.item())
        row = np.asarray(row32).reshape(-1)
        if not np.isfinite(row).all():
            raise EngineError(f"the model produced non-finite logits at position {position} (NaN or inf)")
        raw.append(float(row[token]))
        if first_argmax(row) != token:
            odd.append(position)
        return token, top_k_pairs(row, top_k, token, position=position) if top_k > 0 else None

    def _force_prefill(self, prompt_ids: Sequence[int], token_ids: Sequence[int], top_k: int) -> ForcedDecode:
        """The fed positions in one forward pass over the prompt and the oracle's tokens but
        the last: row j of the logits is the position after the (j+1)-th token."""
        seq = [*map(int, prompt_ids), *map(int, token_ids[:-1])]
        chosen: list[int] = []
        tops: list[Pairs] = []
        odd: list[int] = []
        raw: list[float] = []
        with mx.stream(generation_stream):
            out = self.model(mx.array(seq, dtype=mx.uint32)[None], cache=make_prompt_cache(self.model))
            first = len(prompt_ids) - 1
            for i in range(len(token_ids)):
                picked, row = self._pick(out[:, first + i, :])
                token, top = self._read(picked, row, i, top_k, odd, raw)
                chosen.append(token)
                if top is not None:
                    tops.append(top)
        return ForcedDecode(
            token_ids=tuple(chosen),
            top_logprobs=tops if top_k > 0 else None,
            mode="prefill",
            extra={"token_logits": raw, "pick_not_logit_argmax": odd},
        )


def _rope_overrides(folder: Path) -> dict[str, Any]:
    """The RoPE settings a transformers-5 config states only in `rope_parameters`, as the
    top-level keys mlx-lm's model args read (`rope_theta`; `rope_scaling` for a scaled type);
    empty when the config states `rope_theta` itself or has no `rope_parameters`."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # mlx_lm.load reports the folder's own fault
    params = config.get("rope_parameters") if isinstance(config, dict) else None
    if "rope_theta" in config or not isinstance(params, dict) or "rope_theta" not in params:
        return {}
    out: dict[str, Any] = {"rope_theta": params["rope_theta"]}
    if params.get("rope_type") not in (None, "default") and "rope_scaling" not in config:
        out["rope_scaling"] = {k: v for k, v in params.items() if k != "rope_theta"}
    return out


class _Eos:
    """The config's eos ids where `stop_token_ids` looks for a generation config's (mlx-lm's
    `load_config` puts generation_config.json's `eos_token_id` there)."""

    def __init__(self, eos: Any) -> None:
        self.eos_token_id = eos


def _bits(opts: Mapping[str, Any]) -> int:
    bits, alias = int(opts["quantize"] or 0), opts["q_bits"]
    if alias is not None:
        if bits and bits != alias:
            raise InputError(f"--engine-opt quantize={bits} and q_bits={alias} disagree; give one")
        bits = int(alias)
    if bits < 0:
        raise InputError(f"--engine-opt quantize={bits}: expected bits (2, 3, 4, 5, 6, 8) or 0 (off)")
    return bits


def _dtype_name(raw: Any) -> str | None:
    if raw is None:
        return None
    name = DTYPE_ALIASES.get(str(raw).lower(), str(raw).lower())
    if name not in DTYPES:
        raise InputError(f"--engine-opt dtype={raw}: expected one of bfloat16, float16, float32")
    return name


def _set_device(raw: Any) -> Any:
    """The MLX device every array goes to: `device` (cpu, gpu) or MLX's default."""
    if raw is None:
        return mx.default_device()
    name = str(raw).lower()
    if name not in ("cpu", "gpu"):
        raise InputError(f"--engine-opt device={raw}: expected cpu or gpu")
    if name == "gpu" and not (mx.metal.is_available() or _cuda_available()):
        raise InputError(f"--engine-opt device=gpu: this MLX ({_version('mlx')}) has no GPU backend here")
    device = mx.cpu if name == "cpu" else mx.gpu
    mx.set_default_device(device)
    return mx.default_device()


def _cuda_available() -> bool:
    cuda = getattr(mx, "cuda", None)
    return bool(cuda is not None and cuda.is_available())


def _cast(model: Any, dtype: Any) -> None:
    """Cast the floating-point parameters, as `mlx_lm.convert --dtype` does (its model's
    `cast_predicate` keeps the ones the architecture wants as they are)."""
    from mlx.utils import tree_map_with_path

    keep = getattr(model, "cast_predicate", lambda _: True)
    model.update(
        tree_map_with_path(
            lambda k, v: v.astype(dtype) if keep(k) and mx.issubdtype(v.dtype, mx.floating) else v,
            model.parameters(),
        )
    )
    mx.eval(model.parameters())


def _model_dtype(model: Any) -> str:
    """The dtypes of the model's floating-point parameters (in a quantised model: of its
    scales, biases and norms), comma-separated."""
    from mlx.utils import tree_flatten

    flat: list[Any] = list(tree_flatten(model.parameters()))
    kinds = sorted({str(v.dtype) for _, v in flat if mx.issubdtype(v.dtype, mx.floating)})
    return ",".join(k.removeprefix("mlx.core.") for k in kinds)


def _backend() -> str | None:
    """Which MLX backend package is installed: the CPU one (Linux), Metal (macOS) or CUDA."""
    for dist, name in (("mlx-metal", "metal"), ("mlx-cuda-13", "cuda"), ("mlx-cuda-12", "cuda"), ("mlx-cpu", "cpu")):
        if _version(dist):
            return name
    return None


def _version(dist: str) -> str | None:
    try:
        return str(metadata.version(dist))
    except metadata.PackageNotFoundError:
        return None
