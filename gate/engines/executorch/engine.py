"""The ExecuTorch engine: a `.pte` program run by ExecuTorch's own runtime, its KV cache inside.

The program: by default the ExecuTorch build of the pinned checkpoint, exported once with a
static KV cache and lowered to XNNPACK (`gate.engines.executorch.export`: the `fp32` or the
`8da4w` recipe), cached under gate's cache with a manifest (`gate.engines.executorch.cache`);
`pte=PATH` runs a program a team built itself instead, with the tokenizer of the model
folder given as the model (the default model's by default).

The program's `forward(input_ids [1, seq], cache_position [seq]) -> logits` keeps the KV
cache in its own mutable buffers. gate loads it with `executorch.runtime`
(`Runtime.get().load_program(...).load_method("forward")`) and calls it as ExecuTorch's LLM
runner does: the whole prompt in one call (in chunks of the longest sequence the program
takes), then one call per new token at the next cache position. A new prompt starts again at
position 0: the causal mask hides the cache rows past the current position, so nothing of
the previous prompt is read.

Greedy is the lowest id among the float32 logits' maxima (`numpy.argmax` returns the first
occurrence), the rule of ExecuTorch's own runner (`Sampler::sample_argmax` keeps the first
maximum: it replaces the best only on a strictly greater value) and of the oracle. Top-k
logprobs come from the same float32 row (`gate.engines._logits`: log-softmax over the whole
vocabulary with a float64 subtraction, sorted by logprob descending then id ascending).

Teacher-forced decode is the same loop feeding the oracle's token instead of the pick, one
call per token through the program's KV cache: on its own tokens it reproduces the free run
bit for bit.

Options (`--engine-opt key=value`): recipe (fp32, 8da4w; default fp32), pte (a `.pte` to run
instead of gate's build; recipe then only labels it), max_seq_len (the KV cache length of
gate's build; default 1024), threads (the runtime's CPU threadpool; default its own choice),
attention (gate's build: `masked`, the default, or `custom_sdpa`, ExecuTorch's own
`llama.update_cache` and `llama.custom_sdpa` operators; `gate.engines.executorch.export`).
debug_buffer_mb (`gate diagnose`'s capture: the ETDump debug buffer; default sized from the
program's ETRecord, `gate.engines.executorch.capture`).
A program that calls those operators runs with their kernels, which gate registers by
importing `executorch.extension.llm.custom_ops` before loading it.

`gate diagnose` captures the program through `capture_activations`: its own ETDump over the
context, named by the ETRecord gate's export writes beside it (`gate.engines.executorch.etdump`).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import tempfile
from collections.abc import Iterator, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gate.core.engine import ForcedDecode, PromptInput, parse_options
from gate.core.storage.digests import known_sha256
from gate.core.traces.trace import PromptRecord
from gate.engines._common import (
    Pairs,
    TokenizerMethods,
    check_forced_ids,
    check_prompt_ids,
    greedy_record,
    host_platform,
    refuse_recurrent,
    stop_token_ids,
)
from gate.engines._logits import first_argmax, top_k_pairs
from gate.engines._machine import host_machine
from gate.engines.executorch.cache import PTE_NAME, executorch_program, read_program_manifest
from gate.engines.executorch.export import ATTENTIONS, BACKEND, RECIPES
from gate.engines.executorch.probe import probe
from gate.errors import EngineError, InputError
from gate.models.default import DEFAULT_MODEL, materialize_default, resolve_model_path
from gate.models.hashing import source_hashes


def _quiet_import() -> Any:
    """`executorch.runtime`, imported with the warnings its import logs on every run (torchao's
    CUDA kernels that do not load on a CPU machine; a torch deprecation) kept off stderr."""
    loggers = [logging.getLogger(name) for name in ("torchao", "torch.utils._pytree")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        import executorch.runtime as runtime
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)
    return runtime


_runtime = _quiet_import()
Runtime, Verification = _runtime.Runtime, _runtime.Verification

OPTIONS: dict[str, tuple[type, Any]] = {
    "recipe": (str, "fp32"),
    "pte": (str, None),
    "max_seq_len": (int, 1024),
    "threads": (int, None),
    "attention": (str, "masked"),
    "debug_buffer_mb": (int, None),
}


class ExecuTorchEngine(TokenizerMethods):
    """Greedy decoding of an ExecuTorch program; see the module doc for the options."""

    name = "executorch"

    def __init__(self, model: str, **options: Any) -> None:
        opts = parse_options(self.name, options, OPTIONS)
        recipe = str(opts["recipe"]).lower()
        if recipe not in RECIPES:
            raise InputError(f"--engine-opt recipe={opts['recipe']}: expected one of {', '.join(RECIPES)}")
        if opts["max_seq_len"] < 2:
            raise InputError(f"--engine-opt max_seq_len={opts['max_seq_len']}: expected an integer of 2 or more")
        if opts["debug_buffer_mb"] is not None and opts["debug_buffer_mb"] < 1:
            raise InputError(f"--engine-opt debug_buffer_mb={opts['debug_buffer_mb']}: expected a positive integer")
        if opts["threads"] is not None and opts["threads"] < 1:
            raise InputError(f"--engine-opt threads={opts['threads']}: expected a positive integer")
        attention = str(opts["attention"]).lower()
        if attention not in ATTENTIONS:
            raise InputError(f"--engine-opt attention={opts['attention']}: expected one of {', '.join(ATTENTIONS)}")
        self.model_id = model
        self.options = opts
        self.recipe = recipe
        self.source: Path | None = None
        if opts["pte"] is not None:
            self.pte = Path(str(opts["pte"])).expanduser()
            if not self.pte.is_file():
                raise InputError(f"--engine-opt pte={opts['pte']}: no such file")
            self.pte_sha256 = known_sha256(self.pte)
            # A manifest beside it describes it only if it names this very file.
            manifest = read_program_manifest(self.pte.parent) if self.pte.name == PTE_NAME else None
            self.manifest = manifest if (manifest or {}).get("pte_sha256") == self.pte_sha256 else None
        else:
            self.source = _source(model, given_pte=False)
            assert self.source is not None  # _source raises rather than return None here
            folder = executorch_program(self.source, recipe, int(opts["max_seq_len"]), attention=attention)
            self.pte, self.manifest = folder / PTE_NAME, read_program_manifest(folder)
            self.pte_sha256 = str((self.manifest or {}).get("pte_sha256") or known_sha256(self.pte))
        self.etrecord = _etrecord(self.pte, self.manifest)
        if opts["threads"] is not None:
            _set_threads(int(opts["threads"]))
        _register_llm_ops(required=attention == "custom_sdpa" and opts["pte"] is None)
        if opts["pte"] is not None:
            probe(self.pte)  # a program gate did not build: first in a child process, which may crash
        self.program, self.method = _load(self.pte)
        self.max_seq_len = int(self._constant("get_max_seq_len", opts["max_seq_len"]))
        self.vocab_size: int | None = self._constant("get_vocab_size", None)
        self.max_chunk, self.start_only = self._input_shapes()
        if opts["pte"] is not None:
            # The tokenizer of a program gate did not build: the model folder's (the default's by default).
            self.source = _source(model, given_pte=True)
        self.tokenizer = _tokenizer(self.source)
        self.stop_ids = self._stop_ids()

    def _constant(self, name: str, default: Any) -> Any:
        """A constant method the exporter wrote into the program (ExecuTorch's LLM runner
        reads the same ones), or `default` when the program has none."""
        if name not in self.program.method_names:
            return default
        value = self.program.load_method(name).execute([])[0]
        return int(value.item()) if isinstance(value, torch.Tensor) else int(value)

    def _input_shapes(self) -> tuple[int, bool]:
        """(the most tokens one forward call takes; whether the position input is the start
        position alone, as ExecuTorch's own Llama export takes it, rather than one position
        per token)."""
        meta = self.method.metadata
        if meta.num_inputs() != 2:
            raise EngineError(
                f"{self.pte}: forward takes {meta.num_inputs()} inputs; gate runs programs whose forward "
                "takes (input_ids [1, seq], cache positions)"
            )
        ids, pos = meta.input_tensor_meta(0).sizes(), meta.input_tensor_meta(1).sizes()
        chunk = int(ids[-1]) if ids else 1
        return max(1, chunk), tuple(pos) == (1,) and chunk > 1

    def _stop_ids(self) -> frozenset[int]:
        config = None
        if self.source is not None:
            from transformers import GenerationConfig

            with contextlib.suppress(OSError, ValueError):
                config = GenerationConfig.from_pretrained(str(self.source))
        ids = set(stop_token_ids(self.tokenizer, config))
        if "get_eos_ids" in self.program.method_names:
            ids.update(int(t) for t in self.program.load_method("get_eos_ids").execute([]))
        return frozenset(ids)

    # ------------------------------------------------------------------ the contract

    def info(self) -> dict[str, Any]:
        manifest = self.manifest or {}
        export = manifest.get("export") or {}
        out: dict[str, Any] = {
            "name": self.name,
            "version": _version("executorch"),
            "executorch": _version("executorch"),
            "torch": torch.__version__,
            "torchao": _version("torchao"),
            "recipe": manifest.get("recipe", self.recipe),
            "attention": manifest.get("attention", "masked") if manifest else "as built",
            "backend": manifest.get("backend", BACKEND if manifest else "as built (a program gate did not export)"),
            "pte": str(self.pte),
            "pte_sha256": self.pte_sha256,
            "max_seq_len": self.max_seq_len,
            "prefill_tokens_per_call": self.max_chunk,
            "threads": self.options["threads"] if self.options["threads"] is not None else "runtime default",
            "greedy": "numpy argmax over the program's float32 logits (first maximum, lowest id)",
            "logprobs": "float64(logit) - logsumexp (float32 exp, float64 sum) over the program's float32 logits",
            "options": {k: v for k, v in self.options.items() if v is not None},
            "model": self.model_id,
            **host_platform(),
            "hardware": host_machine("cpu"),
        }
        if manifest:
            out["export"] = {k: export[k] for k in sorted(export)}
            out["exported_with"] = manifest.get("versions")
            source = manifest.get("source") or {}
            # The program is exported from these weights (fp32: widened; 8da4w: quantised
            # from them), so a pin recorded from them matches.
            out.update({k: source[k] for k in ("weights_sha256", "tokenizer_sha256") if isinstance(source.get(k), str)})
        elif self.source is not None and self.options["pte"] is None:
            out.update(source_hashes(self.source))
        return out

    def generate(self, prompts: Sequence[PromptInput], top_k: int) -> list[PromptRecord]:
        return [self._generate_one(p, top_k) for p in prompts]

    def force(self, prompt_token_ids: Sequence[int], token_ids: Sequence[int], top_k: int) -> ForcedDecode:
        check_prompt_ids("forced", prompt_token_ids, self.vocab_size)
        check_forced_ids(token_ids, self.vocab_size)
        self._check_length("forced", len(prompt_token_ids), len(token_ids))
        chosen: list[int] = []
        tops: list[Pairs] = []
        logits = self._forward(prompt_token_ids, 0) if token_ids else None
        for i, fed in enumerate(token_ids):
            assert logits is not None
            token = first_argmax(logits)
            chosen.append(token)
            if top_k > 0:
                tops.append(top_k_pairs(logits, top_k, token, position=i))
            if i + 1 < len(token_ids):
                logits = self._forward([int(fed)], len(prompt_token_ids) + i)
        return ForcedDecode(token_ids=tuple(chosen), top_logprobs=tops if top_k > 0 else None, mode="decode")

    def capture_activations(
        self, context_token_ids: Sequence[int], names: Sequence[str] | None = None
    ) -> dict[str, np.ndarray[Any, Any]]:
        """The module outputs the program's own ETDump holds over the context (one forward from
        position 0), named through the ETRecord gate's export wrote beside it
        (`gate.engines.executorch.etdump`): the embedding, each layer's input norm and residual
        stream, the logits; what the XNNPACK delegates keep inside them is left out."""
        from gate.engines.executorch.capture import layer_names, run_capture

        if self.etrecord is None:
            why = "which gate diagnose needs to name the tensors the program's ETDump logs"
            raise InputError(
                f"{self.pte} was built without an ETRecord, {why}: remove {self.pte.parent} and gate exports it "
                "again, with one (minutes)"
                if self.options["pte"] is None
                else f"{self.pte} has no ETRecord of gate's export beside it, {why}: drop --engine-opt pte to run "
                "gate's own build"
            )
        listed = ((self.manifest or {}).get("files") or {}).get(self.etrecord.name)
        if self.options["pte"] is not None and known_sha256(self.etrecord) != listed:
            # gate's own builds are checked against their manifest on every use; a given program's folder is not
            raise InputError(f"{self.etrecord} does not match its sha256 in {self.pte.parent}'s manifest")
        ids = [int(t) for t in context_token_ids]
        check_prompt_ids("context", ids, self.vocab_size)
        if not 0 < len(ids) <= self.max_chunk:
            raise InputError(
                f"a context of {len(ids)} tokens: the capture runs it in one forward call, which takes 1 to "
                f"{self.max_chunk} tokens"
            )
        wanted = list(names) if names is not None else layer_names(self._layers())
        arrays, _ = run_capture(self.pte, self.etrecord, ids, wanted, buffer_mb=self.options["debug_buffer_mb"])
        return {name: arrays[name] for name in wanted if name in arrays}

    def _layers(self) -> int:
        import orjson

        config = orjson.loads((self.source / "config.json").read_bytes()) if self.source is not None else {}
        return int(config.get("num_hidden_layers", 0))

    def close(self) -> None:
        self.method = None
        self.program = None

    # ------------------------------------------------------------------ the decode loop

    def _generate_one(self, prompt: PromptInput, top_k: int) -> PromptRecord:
        check_prompt_ids(prompt.id, prompt.prompt_token_ids, self.vocab_size)
        self._check_length(prompt.id, len(prompt.prompt_token_ids), prompt.max_tokens)
        ids: list[int] = []
        tops: list[Pairs] = []
        finish = "length"
        logits = self._forward(prompt.prompt_token_ids, 0) if prompt.max_tokens > 0 else None
        for i in range(prompt.max_tokens):
            assert logits is not None
            token = first_argmax(logits)
            ids.append(token)
            if top_k > 0:
                tops.append(top_k_pairs(logits, top_k, token, position=i))
            elif not np.isfinite(logits[token]):
                raise EngineError(f"the model produced non-finite logits at position {i} (NaN or inf)")
            if token in self.stop_ids:
                finish = "stop"
                break
            if i + 1 < prompt.max_tokens:
                logits = self._forward([token], len(prompt.prompt_token_ids) + i)
        return greedy_record(prompt, ids, tops if top_k > 0 else None, finish, self.decode_tokens(ids))

    def _check_length(self, prompt_id: str, prompt_len: int, new_tokens: int) -> None:
        # The last generated token is never fed back, so it needs no cache row.
        needed = prompt_len + max(new_tokens - 1, 0)
        if needed > self.max_seq_len:
            raise InputError(
                f"prompt {prompt_id!r}: {prompt_len} prompt tokens and {new_tokens} to generate need {needed} "
                f"cache positions; the program holds {self.max_seq_len} (export with --engine-opt max_seq_len=N)"
            )

    def _forward(self, ids: Sequence[int], start: int) -> np.ndarray[Any, Any]:
        """Feed `ids` at cache positions `start`, `start + 1`, ...; the float32 logits of
        the last one ([vocab])."""
        out: Any = None
        for offset in range(0, len(ids), self.max_chunk):
            part = list(ids[offset : offset + self.max_chunk])
            at = start + offset
            tokens = torch.tensor([part], dtype=torch.long)
            positions = (
                torch.tensor([at], dtype=torch.long)
                if self.start_only
                else torch.arange(at, at + len(part), dtype=torch.long)
            )
            out = self.method.execute([tokens, positions])[0]
        logits = out[0, -1] if out.dim() == 3 else out[-1] if out.dim() == 2 else out
        # A copy: the runtime may reuse its output buffer on the next call.
        return np.array(logits.detach().to(torch.float32).numpy(), dtype=np.float32, copy=True)


# ---------------------------------------------------------------------- the runtime


def _register_llm_ops(*, required: bool) -> None:
    """ExecuTorch's LLM operators (`llama.update_cache`, `llama.custom_sdpa`, ...): importing
    `executorch.extension.llm.custom_ops` loads the library that registers their kernels with
    the runtime. A program gate built with them needs it; any other program may use them."""
    try:
        from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401
    except (ImportError, OSError, AssertionError) as exc:
        if required:
            raise EngineError(
                f"ExecuTorch's LLM operators did not load ({exc}): attention=custom_sdpa needs them"
            ) from None


def _load(pte: Path) -> tuple[Any, Any]:
    """The program and its forward method. The runtime logs why it refuses a file on the
    process's stderr (from C++); that text is taken into gate's one-line message instead."""
    with _captured_stderr() as said:
        try:
            program = Runtime.get().load_program(pte, verification=Verification.Minimal)
            if "forward" not in program.method_names:
                raise EngineError(f"{pte} has no forward method (methods: {', '.join(sorted(program.method_names))})")
            method = program.load_method("forward")
        except EngineError:
            raise
        except Exception as exc:
            logged = said()
            reason = logged[0] if logged else f"{type(exc).__name__}: {exc}"
            raise EngineError(f"ExecuTorch cannot load {pte}: {reason}") from None
    return program, method


@contextlib.contextmanager
def _captured_stderr() -> Iterator[Any]:
    """Route stderr, both Python's `sys.stderr` (where the runtime's Python bindings log) and
    file descriptor 2 (its C++ code), to temporary sinks; yields a function giving their lines."""
    saved = os.dup(2)
    text = io.StringIO()
    with tempfile.TemporaryFile() as sink, contextlib.redirect_stderr(text):
        os.dup2(sink.fileno(), 2)

        def said() -> list[str]:
            sink.flush()
            sink.seek(0)
            raw = text.getvalue() + sink.read().decode("utf-8", "replace")
            return [ln.strip() for ln in raw.splitlines() if ln.strip()]

        try:
            yield said
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _etrecord(pte: Path, manifest: dict[str, Any] | None) -> Path | None:
    """The ETRecord gate's export wrote beside the program, when its manifest lists it (and so
    hashed it: the build's check re-hashes every listed file); None for an older build."""
    name = ((manifest or {}).get("export") or {}).get("etrecord")
    files = (manifest or {}).get("files") or {}
    if not isinstance(name, str) or name not in files:
        return None
    path = pte.parent / name
    return path if path.is_file() else None


def _source(model: str, *, given_pte: bool) -> Path | None:
    """The Hugging Face folder the program is (or was) exported from: its tokenizer, and what
    gate exports when no `pte` is given. None: a given `.pte` with no model folder."""
    if model == DEFAULT_MODEL:
        return materialize_default()
    folder = Path(resolve_model_path(model)).expanduser()
    if (folder / "config.json").is_file():
        if not given_pte:
            refuse_recurrent(
                "executorch",
                folder,
                "gate's ExecuTorch export (gate.engines.executorch.export) keeps a static KV cache only, with no "
                "Gated DeltaNet recurrent or conv state; export the program elsewhere and give it with "
                "--engine-opt pte=PATH",
            )
        return folder
    if given_pte:
        return None
    raise InputError(
        f"engine 'executorch' exports a local model: {model!r} is not a Hugging Face folder "
        "(or give a program with --engine-opt pte=PATH)"
    )


def _set_threads(threads: int) -> None:
    try:
        from executorch.extension.pybindings.portable_lib import _unsafe_reset_threadpool
    except ImportError:
        raise InputError("--engine-opt threads: this ExecuTorch cannot set its threadpool size") from None
    with _captured_stderr():  # the runtime logs "Resetting threadpool to N threads."
        _unsafe_reset_threadpool(threads)


def _tokenizer(source: Path | None) -> Any | None:
    if source is None:
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(source))
    except (OSError, ValueError, TypeError):
        return None


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None
