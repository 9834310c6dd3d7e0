"""Pieces the HF and vLLM engines share: top-k ordering, tokenization, stop tokens.

Nothing here imports torch or vllm; the engines pass their tokenizer and config objects in.
"""

from __future__ import annotations

import platform
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gate.core.engine import PromptInput
from gate.core.traces.trace import PromptRecord
from gate.errors import InputError
from gate.models.default import DEFAULT_MODEL, find_gguf
from gate.models.qwen_tiny import QWEN_TINY
from gate.models.qwen_tiny import gguf_path as qwen_tiny_gguf

# One top-k list as the trace stores it: [token_id, logprob] pairs.
Pairs = list[list[Any]]


def sort_top(pairs: Iterable[tuple[int, float]]) -> Pairs:
    """`[[id, logprob], ...]` in the trace's order: logprob descending, then token id
    ascending, which is the order `torch.argmax` prefers among equal values."""
    return [[int(t), float(lp)] for t, lp in sorted(pairs, key=lambda p: (-p[1], p[0]))]


def encode_prompt(
    tokenizer: Any, text: str | None = None, messages: Sequence[Mapping[str, str]] | None = None
) -> tuple[int, ...]:
    """The token ids a prompt becomes, the way vLLM makes them.

    Text: `tokenizer(text)` with the tokenizer's own special tokens (vLLM's `LLM.generate`
    on a string does the same). Messages: the chat template rendered with
    `add_generation_prompt=True`, then tokenized without adding special tokens again, as
    vLLM's `LLM.chat` does (the template already wrote them).
    """
    if (text is None) == (messages is None):
        raise InputError("a prompt needs exactly one of text or messages")
    if messages is not None:
        if getattr(tokenizer, "chat_template", None) is None:
            raise InputError("this model's tokenizer has no chat template; give the prompt as text")
        rendered = tokenizer.apply_chat_template(
            [dict(m) for m in messages], add_generation_prompt=True, tokenize=False
        )
        return tuple(int(t) for t in tokenizer(rendered, add_special_tokens=False)["input_ids"])
    return tuple(int(t) for t in tokenizer(text)["input_ids"])


def decode_each(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """The text of each token id on its own (a partial UTF-8 byte shows as U+FFFD)."""
    return [tokenizer.decode([int(t)]) for t in ids]


class TokenizerMethods:
    """`encode` and `decode_tokens` of the engine contract for an engine that holds a
    transformers tokenizer in `self.tokenizer` (None when it has none)."""

    tokenizer: Any

    def encode(
        self, text: str | None = None, messages: Sequence[Mapping[str, str]] | None = None
    ) -> tuple[int, ...] | None:
        if self.tokenizer is None:
            return None
        return encode_prompt(self.tokenizer, text, messages)

    def decode_tokens(self, ids: Sequence[int]) -> list[str] | None:
        if self.tokenizer is None:
            return None
        return decode_each(self.tokenizer, ids)


def stop_token_ids(tokenizer: Any | None, generation_config: Any | None) -> frozenset[int]:
    """The ids that end generation: the generation config's eos ids and the tokenizer's eos,
    the union vLLM stops on (`SamplingParams` adds the generation config's to the tokenizer's)."""
    ids: set[int] = set()
    eos = getattr(generation_config, "eos_token_id", None) if generation_config is not None else None
    if isinstance(eos, int):
        ids.add(eos)
    elif isinstance(eos, (list, tuple)):
        ids.update(int(t) for t in eos)
    tok_eos = getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None
    if isinstance(tok_eos, int):
        ids.add(tok_eos)
    return frozenset(ids)


def check_prompt_ids(prompt_id: str, ids: Sequence[int], vocab_size: int | None) -> None:
    """Refuse what no engine can run: an empty prompt, or an id outside the vocabulary."""
    if not ids:
        raise InputError(f"prompt {prompt_id!r}: no prompt tokens")
    if vocab_size is not None:
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise InputError(f"prompt {prompt_id!r}: token id {bad[0]} is outside the vocabulary (size {vocab_size})")


def check_forced_ids(ids: Sequence[int], vocab_size: int | None) -> None:
    """Refuse oracle tokens outside the vocabulary before they reach the model."""
    if vocab_size is not None:
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise InputError(f"forced decode: oracle token id {bad[0]} is outside the vocabulary (size {vocab_size})")


def host_platform() -> dict[str, str]:
    """Where the engine ran, for trace headers."""
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
    }


def greedy_record(
    prompt: PromptInput,
    ids: Sequence[int],
    tops: Sequence[Pairs] | None,
    finish: str | None,
    texts: Sequence[str] | None,
    extra: Mapping[str, Any] | None = None,
    *,
    token_logits: Sequence[float] | None = None,
    routed_experts: Sequence[Any] | None = None,
    router_top: Sequence[Any] | None = None,
) -> PromptRecord:
    """The record of one greedy run as every engine that decodes its own tokens writes it
    (`tops` None: the engine gives no top-k; `extra`: fields no verdict reads)."""
    return PromptRecord(
        id=prompt.id,
        prompt_token_ids=tuple(prompt.prompt_token_ids),
        token_ids=tuple(ids),
        top_logprobs=tops,
        finish_reason=finish,
        prompt=prompt.prompt,
        tokens=tuple(texts) if texts is not None else None,
        extra=dict(extra or {}),
        token_logits=token_logits,
        routed_experts=routed_experts,
        router_top=router_top,
    )


def locate_gguf(model: str, model_path: str | None, *, not_a_gguf: str) -> Path:
    """The GGUF file an engine runs: `model_path` when given, the embedded default's own
    Q4_1 GGUF for the default model, the Qwen3.6 test checkpoint's bf16 GGUF for its id,
    else `model` itself when it names a `.gguf` file.
    `not_a_gguf` is the engine's sentence for a model that is none (formatted with `model`)."""
    if model_path:
        path = Path(model_path).expanduser()
    elif model == DEFAULT_MODEL:
        path, _ = find_gguf()
    elif model == QWEN_TINY:
        path = qwen_tiny_gguf()
    else:
        path = Path(model).expanduser()
        if not (path.is_file() and path.suffix == ".gguf"):
            raise InputError(not_a_gguf.format(model=model))
    if not path.is_file():
        raise InputError(f"GGUF file {path} does not exist")
    return path


CONFIG_LIMIT = 1 << 20  # a config.json is a few KB; anything past 1 MiB is not one


def architectures_of(folder: str | Path) -> tuple[str, ...]:
    """The `architectures` a local model folder's config.json declares (empty for a hub id,
    a folder without one, or a config that names none). Read bounded: 1 MiB at most."""
    import orjson

    path = Path(folder).expanduser() / "config.json"
    try:
        with open(path, "rb") as fh:
            raw = fh.read(CONFIG_LIMIT + 1)
    except OSError:
        return ()
    if len(raw) > CONFIG_LIMIT:
        raise InputError(f"{path}: over {CONFIG_LIMIT} bytes, not a model config")
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InputError(f"{path}: bad JSON: {exc}") from None
    archs = obj.get("architectures") if isinstance(obj, dict) else None
    return tuple(a for a in archs if isinstance(a, str)) if isinstance(archs, list) else ()


# Hybrid architectures whose linear-attention layers (Gated DeltaNet) keep a recurrent state:
# Qwen3.5 / Qwen3.6 (dense and MoE, text-only and multimodal checkpoints) and Qwen3-Next.
RECURRENT_ARCHITECTURES = frozenset(
    {
        "Qwen3_5ForCausalLM",
        "Qwen3_5ForConditionalGeneration",
        "Qwen3_5MoeForCausalLM",
        "Qwen3_5MoeForConditionalGeneration",
        "Qwen3NextForCausalLM",
    }
)


def refuse_recurrent(engine: str, folder: str | Path, why: str) -> None:
    """An UnsupportedArchitecture (exit 3) when the folder's checkpoint is one of the hybrid
    recurrent architectures that `engine` cannot run (`why` says what it lacks)."""
    from gate.errors import UnsupportedArchitecture

    for arch in architectures_of(folder):
        if arch in RECURRENT_ARCHITECTURES:
            raise UnsupportedArchitecture(engine, arch, why)
