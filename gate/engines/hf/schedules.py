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
    `max_tokens`) is fed padding until the longest is done; its record ends where it did.
    On an MoE model each record's routing is its own prompt's (`BatchRouting`): the tokens it
    fed, never the padding nor another row's."""
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
    routing = BatchRouting(engine, len(prompts))
    with torch.inference_mode():
        input_ids = torch.tensor(rows, dtype=torch.long, device=device)
        mask = torch.tensor(mask_rows, dtype=torch.long, device=device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = routing.forward(
            [len(p.prompt_token_ids) for p in prompts],
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
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
            # A row's token counts as its routing only where its own run feeds it on (one
            # prompt at a time, the last chosen token is never fed).
            out = routing.forward(
                [0 if done[b] else 1 for b in range(len(prompts))],
                input_ids=step_ids,
                attention_mask=mask,
                position_ids=position,
                past_key_values=cache,
                use_cache=True,
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
            **routing.extra(b),
        )
        for b, p in enumerate(prompts)
    ]


class BatchRouting:
    """The routing of each row of a batch, split out of the batch's forwards: a router sees
    the batch flattened row by row ([rows x tokens]), so row b's tokens of a forward over T
    tokens are b*T .. b*T+T-1, its real ones the last `counts[b]` of them (left padding first)."""

    def __init__(self, engine: HFEngine, size: int) -> None:
        self.engine = engine
        hooks = engine.router_hooks
        self.hooks = hooks if hooks is not None and engine.options["record_routing"] else None
        self.rows: list[list[Any]] = [[] for _ in range(size)]
        self.tops: list[list[Any]] = [[] for _ in range(size)]

    def forward(self, counts: Sequence[int], **kwargs: Any) -> Any:
        """One forward of the batch; `counts[b]`: how many of row b's last tokens are its own."""
        if self.hooks is None:
            return self.engine.model(**kwargs)
        self.hooks.begin(0)
        out = self.engine.model(**kwargs)
        rows, tops = self.hooks.take()
        width = int(kwargs["input_ids"].shape[1])
        for b, n in enumerate(counts):
            end = (b + 1) * width
            self.rows[b].extend(rows[end - n : end])
            self.tops[b].extend(tops[end - n : end])
        return out

    def extra(self, b: int) -> dict[str, Any]:
        if self.hooks is None or not self.rows[b]:
            return {}
        return {"routed_experts": self.rows[b], "router_top": self.tops[b]}


def prefill_chunked(engine: HFEngine, ids: torch.Tensor) -> tuple[torch.Tensor, Any]:
    """The prompt `ids` ([1, n]) prefilled `engine.prefill_chunk` tokens per forward through
    the KV cache. Returns (the last position's [vocab] logits, the cache)."""
    size = engine.prefill_chunk
    cache: Any = None
    out: Any = None
    for start in range(0, int(ids.shape[1]), size):
        part = ids[:, start : start + size]
        out = engine._forward(part, **_through(part, cache))
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
        # On an MoE model with routing recorded: each kept prompt's routing, a row per token
        # (experts, router top), as its forwards chose it; a reused prefix's rows are these.
        self.routing: dict[tuple[int, ...], tuple[list[Any], list[Any]]] = {}
        self.reused_tokens = 0  # prompt tokens taken from the cache, all prompts together
        self.hits = 0
        # The model's cache holds recurrent state (a hybrid such as Qwen3.5/3.6): set on the
        # first prompt, it reuses entries by snapshot (`prefill_cached`).
        self.recurrent = False

    @classmethod
    def for_options(cls, opts: Mapping[str, Any], batch_size: int, routed: bool) -> PrefixCache | None:
        """The engine's prefix cache (None when off). Also where a schedule that serves prompts
        together is refused with the pin's experts replayed: they are each prompt's own."""
        if routed and batch_size != 1 and str(opts["routing"]).lower() == "oracle":
            raise InputError(
                "--engine-opt batch_size with routing=oracle: the pin's experts are replayed one prompt at a "
                "time (batch_size 1)"
            )
        if not opts["prefix_cache"]:
            return None
        if batch_size != 1:
            raise InputError("--engine-opt prefix_cache: the cache is reused one prompt at a time (batch_size 1)")
        if routed and str(opts["routing"]).lower() == "oracle":
            raise InputError(
                "--engine-opt prefix_cache with routing=oracle: a cached prefix ran with the experts the pin "
                "recorded for another prompt, not this one's (drop one of the two)"
            )
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

    def exact(self, prompt: tuple[int, ...]) -> tuple[int, Any]:
        """(tokens, the cache after them): the longest kept prompt that is itself a prefix of
        `prompt`, short of the whole prompt; (0, None) when none is."""
        best, held = 0, None
        for kept, cache in self.entries:
            if best < len(kept) < len(prompt) and prompt[: len(kept)] == kept:
                best, held = len(kept), cache
        return best, held

    def keep(self, prompt: tuple[int, ...], cache: Any, engine: HFEngine | None = None) -> None:
        """Keep `cache` as the state after `prompt`; with `engine` recording routing, its rows
        so far (one per token of `prompt`) with it."""
        others = [e for e in self.entries if e[0] != prompt]
        self.entries = [*others[max(0, len(others) - (self.size - 1)) :], (prompt, cache)]
        if engine is not None and engine.router_hooks is not None and engine.options["record_routing"]:
            if len(engine._rows) != len(prompt):
                raise AssertionError(f"prefix cache: {len(engine._rows)} routing rows for {len(prompt)} tokens")
            self.routing[prompt] = (list(engine._rows), list(engine._tops))
        kept = {e[0] for e in self.entries}
        self.routing = {k: v for k, v in self.routing.items() if k in kept}

    def reuse(self, engine: HFEngine, held: Any, n: int) -> None:
        """The engine continues after the first `n` tokens of the kept entry `held`: its next
        forward starts at position n, and its routing so far is the entry's first n rows."""
        engine._seq = n
        if engine.router_hooks is None or not engine.options["record_routing"]:
            return
        kept = next(k for k, c in self.entries if c is held)
        rows, tops = self.routing[kept]
        engine._rows, engine._tops = list(rows[:n]), list(tops[:n])


RECURRENT_LAYER_TYPES = ("linear_attention",)


def has_recurrent_layers(config: Any) -> bool:
    """Whether a transformers config (a multimodal one through its `text_config`) declares
    layers with recurrent state (`layer_types` naming a linear-attention layer)."""
    text = getattr(config, "text_config", None) or config
    types = getattr(text, "layer_types", None) or ()
    return any(str(t) in RECURRENT_LAYER_TYPES for t in types)


def croppable(cache: Any) -> bool:
    """A cache whose every layer is a full-attention DynamicLayer: cropping it leaves exactly
    the keys and values of the positions kept. A recurrent layer (transformers'
    `LinearAttentionLayer`: a Gated DeltaNet's conv and recurrent state) holds the state after
    its last token only, which no crop puts back to an earlier position (its crop, where
    allowed at all, cuts the conv window and leaves the recurrent state as it was)."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    if type(cache) is not DynamicCache or not cache.layers:
        return False
    return all(type(layer) is DynamicLayer for layer in cache.layers)


def prefill_cached(engine: HFEngine, ids: torch.Tensor) -> tuple[torch.Tensor, Any]:
    """The prompt `ids` ([1, n]) prefilled through the engine's prefix cache: a copy of the
    cache holding its longest kept prefix, cropped to that prefix, and one forward over the
    rest of the prompt through it. A cache with recurrent layers cannot be cropped: it is
    reused by snapshot instead (`_prefill_recurrent`). Returns (the last position's [vocab]
    logits, the cache)."""
    store: PrefixCache = engine.prefix_store
    prompt = tuple(int(t) for t in ids[0].tolist())
    if store.recurrent:
        return _prefill_recurrent(engine, store, ids, prompt)
    n, held = store.longest(prompt)
    if held is None:
        out = engine._forward(ids, input_ids=ids, use_cache=True, logits_to_keep=1)
        store.recurrent = not croppable(out.past_key_values)
    else:
        cache = copy.deepcopy(held)
        cache.crop(n - cache.get_seq_length())  # negative: the tokens after the common prefix
        store.reuse(engine, held, n)
        rest = ids[:, n:]
        out = engine._forward(rest, input_ids=rest, past_key_values=cache, use_cache=True, logits_to_keep=1)
        store.hits += 1
        store.reused_tokens += n
    store.keep(prompt, copy.deepcopy(out.past_key_values), engine)
    return out.logits[0, -1], out.past_key_values


def _prefill_recurrent(
    engine: HFEngine, store: PrefixCache, ids: torch.Tensor, prompt: tuple[int, ...]
) -> tuple[torch.Tensor, Any]:
    """A prefix cache over recurrent state, by snapshot: a kept entry is the whole cache (KV
    and recurrent state) after exactly its tokens, so only an entry that is a prefix of the
    prompt is reused, as it is (never cropped). Where the prompt shares more with another
    kept prompt than any such entry holds, the shared part is computed once and its state
    kept as an entry of its own (the snapshot at the branch point), so the next prompt that
    branches there starts from it. The prompt's last token is always computed."""
    n, held = store.exact(prompt)
    shared, _ = store.longest(prompt)
    cache: Any = copy.deepcopy(held) if held is not None else None
    if held is not None:
        store.hits += 1
        store.reused_tokens += n
        store.reuse(engine, held, n)
    if shared > n:
        part = ids[:, n:shared]
        out = engine._forward(part, **_through(part, cache))
        cache = out.past_key_values
        store.keep(prompt[:shared], copy.deepcopy(cache), engine)
        n = shared
    rest = ids[:, n:]
    out = engine._forward(rest, **_through(rest, cache))
    store.keep(prompt, copy.deepcopy(out.past_key_values), engine)
    return out.logits[0, -1], out.past_key_values


def _through(part: torch.Tensor, cache: Any) -> dict[str, Any]:
    """A forward's arguments over `part` ([1, m]), continuing `cache` (None: from scratch)."""
    kwargs: dict[str, Any] = {"input_ids": part, "use_cache": True, "logits_to_keep": 1}
    if cache is not None:
        kwargs["past_key_values"] = cache
    return kwargs
