"""The engine contract: what gate needs from anything it gates.

An engine is built as `EngineClass(model, **options)` where `options` are the strings of
`--engine-opt key=value` (convert them with `parse_options`). Built-in engines and plugins
(entry-point group `gate.engines`, or `module:Class`) follow the same contract.

Optional capabilities are small protocols declared here, beside `Engine`, and found with
`isinstance` (never by class name), so a plugin that implements one is treated exactly as a
built-in engine that does:

- `ForcesDecode`: teacher-forced decode over the oracle's tokens (`force`); without it (or
  when `force` raises `ForcedDecodeUnavailable`) the positions after a prompt's first
  divergence count as unadjudicated.
- `HasScheduleKnobs`: the schedule knobs `gate invariance` may turn (`schedule_knobs`, a
  class attribute, so nothing is loaded to learn it), e.g.

      class LlamaCppEngine:
          schedule_knobs: ClassVar[Mapping[str, str]] = {
              "threads": "threads", "n_batch": "n_batch", "n_ubatch": "n_ubatch"}

  mapping a knob name from the fixed vocabulary `SCHEDULE_KNOBS` to the `--engine-opt` key
  that sets it. Declaring a knob promises that setting the option changes only the
  schedule, never the arithmetic the engine means to do: the model, its dtype and its
  greedy rule stay as they are. Cells whose knob the engine does not name are listed as not run.
- `BatchesPrompts` / `KeepsRequestsInFlight`: `batch_size` (prompts per `generate` call, 0:
  all at once) or `concurrency` (a server client's requests in flight): how many prompts
  the runner hands to one `generate` call.
- `ReplaysRouting`: an MoE engine that can route as the oracle did (`replay_routing`,
  docs/guides/moe-routing.md). The routing an engine records travels in its records.
- `CapturesActivations`: `gate diagnose` reads the engine's activations over a context, one
  pass over it, and compares them with transformers' on the same weights.
- `CapturesPaths`: the same through either path (one prefill, or a prefill then one decode
  step per token through the KV cache), as gate's built-in hf, llamacpp and vllm engines do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Final, Protocol, runtime_checkable

from gate.core.traces.trace import PromptRecord, TopList
from gate.errors import EngineError, InputError

if TYPE_CHECKING:
    import numpy

    from gate.core.diagnosis.capture import Capture

# The schedule knobs an engine may declare (`schedule_knobs`), and what each one means.
# The value the invariance workflow sets is an integer, given as the option's string, except
# `force_mode`'s, which is "prefill", and `prefix_cache`'s, "1" (on) or "0" (off).
SCHEDULE_KNOBS: Final[Mapping[str, str]] = {
    "batch_size": "prompts decoded together in one generate call (1: one at a time; 0: all at once)",
    "max_num_seqs": "the most sequences the engine's scheduler runs in one step",
    "threads": "CPU threads the engine's kernels use",
    "n_batch": "llama.cpp's logical batch: the most prompt tokens submitted to one decode call",
    "n_ubatch": "llama.cpp's physical micro-batch: the most tokens one compute graph holds",
    "chunked_prefill": "the most prompt tokens one prefill step computes (a long prompt is split)",
    "concurrency": "requests a client keeps in flight at once to a server",
    "force_mode": "how force computes fed positions: decode (a step per token) or prefill (one pass over them)",
    "prefix_cache": "a prompt prefix cached by an earlier request is reused (1) or computed again (0)",
    "cache_block": "tokens per block of the prefix cache (a prefix is reused in whole blocks only)",
}


def schedule_knobs(engine_class: object) -> dict[str, str]:
    """The engine class's declared schedule knobs (knob name -> `--engine-opt` key), each
    name checked against `SCHEDULE_KNOBS`: a name outside it is an EngineError naming it."""
    declared = (engine_class.schedule_knobs if isinstance(engine_class, HasScheduleKnobs) else None) or {}
    who = getattr(engine_class, "__name__", engine_class)
    if not isinstance(declared, Mapping):
        raise EngineError(f"{who!r}: schedule_knobs is not a mapping")
    out: dict[str, str] = {}
    for knob, key in declared.items():
        if knob not in SCHEDULE_KNOBS:
            known = ", ".join(SCHEDULE_KNOBS)
            raise EngineError(f"{who!r}: schedule knob {knob!r} is not one gate knows (known: {known})")
        if not isinstance(key, str) or not key:
            raise EngineError(f"{who!r}: schedule knob {knob!r} names no option")
        out[str(knob)] = key
    return out


@dataclass(frozen=True, slots=True)
class PromptInput:
    """One prompt to run: its id, the exact token ids, and how many tokens to generate."""

    id: str
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    prompt: str | None = None


@dataclass(frozen=True, slots=True)
class ForcedDecode:
    """The result of a teacher-forced decode over n oracle tokens.

    `token_ids[i]` is the engine's greedy choice at position i given the prompt plus the
    oracle's `token_ids[:i]`; `top_logprobs[i]` is its top-k list there (or None when the
    engine has none). `mode` is "decode" (step by step through the KV-cache decode path)
    or "prefill" (one pass over the whole sequence, e.g. a server's prompt logprobs).
    """

    token_ids: tuple[int, ...]
    top_logprobs: Sequence[TopList] | None = None
    mode: str = "decode"
    extra: Mapping[str, Any] = field(default_factory=dict)


class ForcedDecodeUnavailable(EngineError):
    """The engine cannot give forced data (e.g. a server with no prompt logprobs).

    The runner then counts the positions after a prompt's first divergence as
    unadjudicated instead of failing the run.
    """


@runtime_checkable
class Engine(Protocol):
    """A greedy text generator gate can run.

    Shapes:
    - `generate(prompts, top_k)` returns one `PromptRecord` per prompt, in order, with
      `id` and `prompt_token_ids` copied from the input, `token_ids` of length at most
      `prompt.max_tokens` (shorter only if the engine stopped: `finish_reason="stop"`),
      and `top_logprobs` (one list per generated position, `[token_id, logprob]` sorted
      by logprob descending then token id ascending, containing the chosen token) when
      `top_k > 0` and the engine can give them, else None.
    - `info()` returns provenance for trace headers: at least `name` and `version`.
    - `encode(text=None, messages=None)` returns the prompt token ids the engine would
      see (chat messages through the model's chat template), or None when the engine
      cannot tokenize (then the pinned ids are used as they are).
    - `decode_tokens(ids)` returns the text of each id, or None.
    - `close()` frees the engine's resources.
    """

    name: str

    def info(self) -> dict[str, Any]: ...

    def generate(self, prompts: Sequence[PromptInput], top_k: int) -> list[PromptRecord]: ...

    def encode(
        self, text: str | None = None, messages: Sequence[Mapping[str, str]] | None = None
    ) -> tuple[int, ...] | None: ...

    def decode_tokens(self, ids: Sequence[int]) -> list[str] | None: ...

    def close(self) -> None: ...


# The methods every engine has (`Engine`), checked by name when an engine object reaches gate.
CONTRACT_METHODS: Final = ("info", "generate", "encode", "decode_tokens", "close")


def lacking_methods(engine: object) -> list[str]:
    """The contract methods `engine` does not have as callables, in the contract's order."""
    return [m for m in CONTRACT_METHODS if not callable(getattr(engine, m, None))]


def check_contract(engine: object, label: str) -> None:
    """Refuse an engine object that lacks part of the contract, naming what it lacks, before
    any call into it: a missing method must never fail later in gate's own code (a missing
    close() at the end of a run, hiding the run's own outcome). EngineError (exit 3)."""
    lacking = lacking_methods(engine)
    if lacking:
        raise EngineError(
            f"engine {label} ({type(engine).__module__}.{type(engine).__qualname__}) lacks "
            f"{', '.join(m + '()' for m in lacking)} of the plugin contract (gate.engine.Engine: "
            f"{', '.join(m + '()' for m in CONTRACT_METHODS)})"
        )


@runtime_checkable
class ForcesDecode(Protocol):
    """Teacher-forced decode: `force(prompt_token_ids, token_ids, top_k)` returns a
    `ForcedDecode` with exactly `len(token_ids)` greedy choices, or raises
    `ForcedDecodeUnavailable` when this engine (this server, this prompt) cannot."""

    def force(self, prompt_token_ids: Sequence[int], token_ids: Sequence[int], top_k: int) -> ForcedDecode: ...


@runtime_checkable
class HasScheduleKnobs(Protocol):
    """Schedule knobs `gate invariance` may turn: knob name (`SCHEDULE_KNOBS`) -> the
    `--engine-opt` key that sets it. A class attribute: checked on the class, unloaded."""

    schedule_knobs: ClassVar[Mapping[str, str]]


@runtime_checkable
class ReportsPrefixReuse(Protocol):
    """An engine that counts what its prefix cache served: (requests served with a cached
    prefix, prompt tokens taken from the cache), both since the engine was built; None where
    it cannot say (a server client whose server does not report it, or sent a count it could
    not take), which is "does not report", never "served nothing"."""

    def prefix_reuse(self) -> tuple[int, int] | None: ...


@runtime_checkable
class BatchesPrompts(Protocol):
    """`batch_size` prompts go to one `generate` call (0: all at once)."""

    batch_size: int


@runtime_checkable
class KeepsRequestsInFlight(Protocol):
    """A server client that keeps `concurrency` requests in flight: as many prompts go to one
    `generate` call."""

    concurrency: int


@runtime_checkable
class ReplaysRouting(Protocol):
    """An MoE engine that can use the oracle's recorded experts instead of its router's
    choice (its own option says whether it does): `oracle` maps a prompt's token ids to
    the pin's routing rows (`gate.core.verdict.routing.oracle_routing`)."""

    def replay_routing(self, oracle: Mapping[tuple[int, ...], Any]) -> None: ...


@runtime_checkable
class CapturesActivations(Protocol):
    """What `gate diagnose` needs to locate a bug in an engine: its activations over a context."""

    def capture_activations(
        self, context_token_ids: Sequence[int], names: Sequence[str] | None = None
    ) -> Mapping[str, numpy.ndarray]:
        """Each module name (as `gate diagnose` prints them: model.layers.9.self_attn,
        model.layers.9.mlp, model.layers.9.input_layernorm, model.layers.9 for the residual
        stream after layer 9, ...) -> its output at every position of the context, shape
        [positions, hidden], float32."""
        ...


@runtime_checkable
class CapturesPaths(Protocol):
    """`gate diagnose`'s capture through a chosen path: "prefill" (one pass over the context)
    or "decode" (a prefill over the prompt, then one step per context token after it through
    the KV cache), as the engine computes each. `context_token_ids` starts with the prompt's."""

    def capture_path(self, prompt_token_ids: Sequence[int], context_token_ids: Sequence[int], path: str) -> Capture: ...


@runtime_checkable
class CapturesReference(Protocol):
    """What `gate diagnose` needs of its reference and honest engine (the registry's
    `REFERENCE`): a path's capture that can keep lm_head's rows from position `logits_from` on
    (so one prefill stands for both paths), both paths from one prefill, and widening its
    loaded weights to float32 in place where that equals a float32 load."""

    def capture_path(
        self,
        prompt_token_ids: Sequence[int],
        context_token_ids: Sequence[int],
        path: str,
        logits_from: int | None = None,
    ) -> Capture: ...

    def capture_paths_shared(
        self, decode_prompt_token_ids: Sequence[int], context_token_ids: Sequence[int], logits_from: int = 0
    ) -> dict[str, Capture]: ...

    def widens_exactly(self) -> bool: ...

    def widen(self) -> None: ...


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def parse_options(engine: str, options: Mapping[str, Any], schema: Mapping[str, tuple[type, Any]]) -> dict[str, Any]:
    """Convert `--engine-opt` strings to typed values.

    `schema` maps option name to (type, default). An unknown key or a value of the wrong
    type is an InputError naming the option and what it expects.
    """
    out = {k: default for k, (_, default) in schema.items()}
    for key, raw in options.items():
        if key not in schema:
            known = ", ".join(sorted(schema)) or "none"
            raise InputError(f"--engine-opt {key}: unknown option for engine {engine!r} (known: {known})")
        typ, _ = schema[key]
        if not isinstance(raw, str):
            out[key] = raw
            continue
        try:
            if typ is bool:
                low = raw.strip().lower()
                if low not in _TRUE | _FALSE:
                    raise ValueError
                out[key] = low in _TRUE
            elif typ is int:
                out[key] = int(raw)
            elif typ is float:
                value = float(raw)
                if value != value:
                    raise ValueError
                out[key] = value
            else:
                out[key] = raw
        except ValueError:
            raise InputError(f"--engine-opt {key}={raw}: expected {typ.__name__} for engine {engine!r}") from None
    return out
