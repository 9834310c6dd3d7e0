"""The HF engine's other schedules (`gate invariance`): batched decoding with left padding,
a chunked prefill, a forced decode in one prefill pass, and a prefix cache reused across prompts.

Each runs the engine's own step function (`HFEngine._step`: the logits hook, the greedy pick,
the top-k), so a schedule changes only which kernels compute the logits, never how they are
read. The default schedule (one prompt at a time, the whole prompt in one forward, a decode
step per forced token) is `gate.engines.hf.engine` itself and does not come here.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from gate.core.engine import ForcedDecode, PromptInput
from gate.core.traces.trace import PromptRecord
from gate.engines._common import Pairs, check_prompt_ids, greedy_record
from gate.errors import InputError

# `engine` below is a `gate.engines.hf.engine.HFEngine` (typed Any: that module imports this one).
HFEngine = Any


def pad_id(engine: HFEngine) -> int:
    """The id left padding writes (masked out, so any id in the vocabulary does): the
    tokenizer's pad token, else its eos, else 0."""
    tok = engine.tokenizer
    for attr in ("pad_token_id", "eos_token_id"):
        value = getattr(tok, attr, None) if tok is not None else None
        if isinstance(value, int) and value >= 0:
            return value
    return 0


def generate_batch(engine: HFEngine, prompts: Sequence[PromptInput], top_k: int) -> list[PromptRecord]:
    """Greedy free runs of `prompts` decoded together: the prompts left-padded to the longest,
    an attention mask over the padding, position ids counted from each prompt's first real
    token, one forward per step for the whole batch. A prompt that stopped (eos, or its
    `max_tokens`) is fed padding until the longest is done; its record ends where it did."""
    for p in prompts:
        check_prompt_ids(p.id, p.prompt_token_ids, engine.vocab_size)
    pad = pad_id(engine)
    longest = max(len(p.prompt_token_ids) for p in prompts)
    rows = [[pad] * (longest - len(p.prompt_token_ids)) + list(p.prompt_token_ids) for p in prompts]
    mask_rows = [[0] * (longest - len(p.prompt_token_ids)) + [1] * len(p.prompt_token_ids) for p in prompts]
    ids: list[list[int]] = [[] for _ in prompts]
    tops: list[list[Pairs]] = [[] for _ in prompts]
    logits_out: list[list[float]] = [[] for _ in prompts]
    finish = ["length" for _ in prompts]
    done = [p.max_tokens <= 0 for p in prompts]
    device = engine.device
    with torch.inference_mode():
        input_ids = torch.tensor(rows, dtype=torch.long, device=device)
        mask = torch.tensor(mask_rows, dtype=torch.long, device=device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = engine.model(
            input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1
        )
        logits, cache = out.logits[:, -1], out.past_key_values
        position = positions[:, -1:]
        step_index = 0
        while not all(done):
            fed: list[int] = []
            for b, p in enumerate(prompts):
                if done[b]:
                    fed.append(pad)
                    continue
                step = engine._step(logits[b], step_index, top_k)
                ids[b].append(step.chosen)
                logits_out[b].append(step.logit)
                if step.top is not None:
                    tops[b].append(step.top)
                if step.chosen in engine.stop_ids:
                    finish[b], done[b] = "stop", True
                elif len(ids[b]) >= p.max_tokens:
                    done[b] = True
                fed.append(step.chosen)
            if all(done):
                break
            mask = torch.cat([mask, torch.ones((len(prompts), 1), dtype=mask.dtype, device=device)], dim=1)
            position = position + 1
            step_ids = torch.tensor([[t] for t in fed], dtype=torch.long, device=device)
            out = engine.model(
                input_ids=step_ids, attention_mask=mask, position_ids=position, past_key_values=cache, use_cache=True
            )
            logits, cache = out.logits[:, -1], out.past_key_values
            step_index += 1
    return [
        greedy_record(
            p,
            ids[b],
            tops[b] if top_k > 0 else None,
            finish[b],
            engine.decode_tokens(ids[b]),
            {"token_logits": logits_out[b]},
        )
        for b, p in enumerate(prompts)
    ]


def prefill_chunked(engine: HFEngine, ids: torch.Tensor) -> tuple[torch.Tensor, Any]:
    """The prompt `ids` ([1, n]) prefilled `engine.prefill_chunk` tokens per forward through
    the KV cache. Returns (the last position's [vocab] logits, the cache)."""
    size = engine.prefill_chunk
    cache: Any = None
    out: Any = None
    for start in range(0, int(ids.shape[1]), size):
        part = ids[:, start : start + size]
        kwargs: dict[str, Any] = {"input_ids": part, "use_cache": True, "logits_to_keep": 1}
        if cache is not None:
            kwargs["past_key_values"] = cache
        out = engine._forward(part, **kwargs)
        cache = out.past_key_values
    return out.logits[0, -1], cache


def force_prefill(engine: HFEngine, prompt_ids: Sequence[int], token_ids: Sequence[int], top_k: int) -> ForcedDecode:
    """A forced decode in one forward over the prompt and the fed tokens: position i's
    logits are those after the prompt and `token_ids[:i]`, read by the engine's step."""
    n = len(token_ids)
    seq = [*prompt_ids, *(int(t) for t in token_ids[:-1])]
    chosen: list[int] = []
    tops: list[Pairs] = []
    logits_out: list[float] = []
    engine._start_routing(prompt_ids)
    with torch.inference_mode():
        ids = torch.tensor([seq], dtype=torch.long, device=engine.device)
        engine._seq = 0
        out = engine._forward(ids, input_ids=ids, use_cache=False, logits_to_keep=n)
        logits = out.logits[0, -n:]
        for i in range(n):
            step = engine._step(logits[i], i, top_k)
            chosen.append(step.chosen)
            logits_out.append(step.logit)
            if step.top is not None:
                tops.append(step.top)
    return ForcedDecode(
        token_ids=tuple(chosen),
        top_logprobs=tops if top_k > 0 else None,
        mode="prefill",
        extra={"token_logits": logits_out, **engine._routing_extra("forced_")},
    )


class PrefixCache:
    """The KV caches of the last `size` prompts the engine prefilled (each as it stood after
    its prompt, before any decode step), so a new prompt's longest cached prefix is reused
    rather than computed again: the prefix cache of a serving engine, in transformers."""

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self.entries: list[tuple[tuple[int, ...], Any]] = []
        self.reused_tokens = 0  # prompt tokens taken from the cache, all prompts together
        self.hits = 0

    @classmethod
    def for_options(cls, opts: Mapping[str, Any], batch_size: int, routed: bool) -> PrefixCache | None:
        if not opts["prefix_cache"]:
            return None
        if batch_size != 1:
            raise InputError("--engine-opt prefix_cache: the cache is reused one prompt at a time (batch_size 1)")
        if routed:
            raise InputError("--engine-opt prefix_cache: an MoE model's routing is recorded over whole prompts")
        return cls()

    def longest(self, prompt: tuple[int, ...]) -> tuple[int, Any]:
        """(tokens reusable, the cache they are in): the longest common prefix with a kept
        prompt, short of the whole prompt (its last position's logits are computed)."""
        best, held = 0, None
        for kept, cache in self.entries:
            n = 0
            limit = min(len(kept), len(prompt) - 1)
            while n < limit and kept[n] == prompt[n]:
                n += 1
            if n > best:
                best, held = n, cache
        return best, held

    def keep(self, prompt: tuple[int, ...], cache: Any) -> None:
        others = [e for e in self.entries if e[0] != prompt]
        self.entries = [*others[len(others) - (self.size - 1) :], (prompt, cache)]


def prefill_cached(engine: HFEngine, ids: torch.Tensor) -> tuple[torch.Tensor, Any]:
    """The prompt `ids` ([1, n]) prefilled through the engine's prefix cache: a copy of the
    cache holding its longest kept prefix, cropped to that prefix, and one forward over the
    rest of the prompt through it. Returns (the last position's [vocab] logits, the cache)."""
    store: PrefixCache = engine.prefix_store
    prompt = tuple(int(t) for t in ids[0].tolist())
    n, held = store.longest(prompt)
    if held is None:
        out = engine._forward(ids, input_ids=ids, use_cache=True, logits_to_keep=1)
    else:
        cache = copy.deepcopy(held)
        cache.crop(n)
        rest = ids[:, n:]
        out = engine._forward(rest, input_ids=rest, past_key_values=cache, use_cache=True, logits_to_keep=1)
        store.hits += 1
        store.reused_tokens += n
    store.keep(prompt, copy.deepcopy(out.past_key_values))
    return out.logits[0, -1], out.past_key_values
