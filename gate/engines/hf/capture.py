"""Capture for `gate diagnose` on the HF engine and every engine built on it: forward hooks on
the engine's own model, so a subclass's changes (a replaced layer, a wrapped forward, a
patched module) are what is read.

Points (gate.core.diagnosis.capture): the input embedding (layer -1); in each decoder layer
every direct child that is a norm, the attention (self_attn, linear_attn, ...), the MLP or
MoE block (`experts` when the block has experts) and its router's logits, and the layer's
output, the residual stream after it; then the final norm and lm_head (layer = the layer
count). Their forward order is the order the hooks fire in. Every position of the context
is kept: one prefill over it (path `prefill`), or one prefill over the prompt then one
decode step per context token after it through the KV cache (path `decode`), through the
engine's own `_prefill` and `_decode`, as its `force` does. A module that returns fewer
rows than its forward's tokens (lm_head under `logits_to_keep=1`) holds the last ones.
"""

from __future__ import annotations

import bisect
import copy
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from gate.core.diagnosis.capture import (
    DECODE,
    EMBEDDING,
    FINAL_NORM,
    LM_HEAD,
    PATHS,
    PREFILL,
    RESIDUAL,
    ROUTER,
    Capture,
    Point,
    Tensor,
    part_of,
    stack_rows,
)
from gate.engines.hf.layers import decoder_layers
from gate.engines.hf.routing import find_routers
from gate.engines.hf.schedules import croppable, has_recurrent_layers
from gate.engines.hf.subparts import SubParts
from gate.errors import InputError


def capture_points(model: Any, named: Sequence[tuple[str, Any]] | None = None) -> list[tuple[Point, Any]]:
    """(point, module) for every module gate reads, in definition order (not forward order);
    `named`: the model's `named_modules()`, when the caller has them."""
    named = list(model.named_modules()) if named is None else named
    names = {id(m): n for n, m in named}
    layers = decoder_layers(model)
    count = len(layers)
    routers = {r.layer: r.module for r in find_routers(model, named)}
    out: list[tuple[Point, Any]] = []
    embed = model.get_input_embeddings()
    if embed is not None:
        out.append((Point(-1, EMBEDDING, names.get(id(embed), "embed_tokens")), embed))
    for i, layer in enumerate(layers):
        prefix = names.get(id(layer), f"layers.{i}")
        for child_name, child in layer.named_children():
            part = part_of(child_name, child)
            if part is not None:
                out.append((Point(i, part, f"{prefix}.{child_name}"), child))
        if i in routers:
            out.append((Point(i, ROUTER, names.get(id(routers[i]), f"{prefix}.router")), routers[i]))
        out.append((Point(i, RESIDUAL, prefix), layer))
    final = _final_norm(model)
    if final is not None:
        out.append((Point(count, FINAL_NORM, names.get(id(final), "norm")), final))
    head = model.get_output_embeddings()
    if head is not None:
        out.append((Point(count, LM_HEAD, names.get(id(head), "lm_head")), head))
    return out


def _layers_named(model: Any, named: Sequence[tuple[str, Any]]) -> list[tuple[int, str, Any]]:
    names = {id(m): n for n, m in named}
    return [(i, names.get(id(layer), f"layers.{i}"), layer) for i, layer in enumerate(decoder_layers(model))]


def _final_norm(model: Any) -> Any | None:
    inner = getattr(model, "model", None)
    for owner in (inner, getattr(inner, "language_model", None), model):
        norm = getattr(owner, "norm", None) if owner is not None else None
        if isinstance(norm, torch.nn.Module):
            return norm
    return None


def _first_tensor(output: Any) -> torch.Tensor | None:
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)):
        for item in output:
            if isinstance(item, torch.Tensor):
                return item
        return None
    logits = getattr(output, "logits", None)
    return logits if isinstance(logits, torch.Tensor) else None


class CaptureHooks:
    """Forward hooks on every capture point of one model; `begin(start, n)` before each forward
    says which context positions its n input tokens are."""

    def __init__(self, model: Any) -> None:
        named = list(model.named_modules())  # one walk of the model for all three
        self.points = capture_points(model, named)
        self.start = 0
        self.tokens = 0
        self.order: list[int] = []  # point indexes in the order they first fired
        self.rows: dict[int, list[tuple[int, np.ndarray]]] = {}
        self.handles = [m.register_forward_hook(self._hook(i)) for i, (_, m) in enumerate(self.points)]
        self.subparts = SubParts(_layers_named(model, named), len(self.points), self._emit)
        self.points += [(p, None) for p in self.subparts.points]

    def begin(self, start: int, tokens: int) -> None:
        self.start, self.tokens = start, tokens

    def take(self, path: str, context_length: int) -> Capture:
        """The capture of the rows kept so far, which are then dropped (the hooks stay)."""
        out = self.capture(path, context_length)
        self.order, self.rows = [], {}
        return out

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []
        self.subparts.remove()

    def watching(self) -> Any:
        """What the sub-part reads need around the forwards (gate.engines.hf.subparts)."""
        return self.subparts.watching()

    def _hook(self, index: int) -> Any:
        def hook(module: Any, args: Any, output: Any) -> None:
            t = _first_tensor(output)
            if t is not None and t.ndim > 0:
                self._emit(index, t)

        return hook

    def _emit(self, index: int, t: torch.Tensor) -> None:
        """Keep `t`'s rows (its last dimension the features) as point `index`'s at this forward's positions."""
        flat = t.detach().reshape(-1, t.shape[-1]) if t.ndim > 1 else t.detach().reshape(1, -1)
        k = int(flat.shape[0])
        if k > self.tokens:  # a module called over more rows than tokens: not per position
            return
        if index not in self.rows:
            self.order.append(index)
            self.rows[index] = []
        self.rows[index].append((self.start + self.tokens - k, flat.float().cpu().numpy()))

    def capture(self, path: str, context_length: int) -> Capture:
        tensors = []
        for index in self.order:
            positions, values = stack_rows(self.rows[index])
            tensors.append(Tensor(self.points[index][0], positions, values))
        return Capture(path=path, context_length=context_length, tensors=tuple(tensors))


def capture_hf(
    engine: Any,
    prompt_ids: Sequence[int],
    context_ids: Sequence[int],
    path: str,
    *,
    logits_from: int | None = None,
) -> Capture:
    """The engine's capture over `context_ids` (which starts with `prompt_ids`) through `path`.
    With `logits_from` N, the prefill path keeps lm_head's rows at every position from N on
    (0: all; the engine's own prefill keeps the last), so one prefill capture can stand for
    either path: the decode path's lm_head rows are those of its prefill's last position and
    its steps."""
    if path not in PATHS:
        raise InputError(f"path {path!r}: expected prefill or decode")
    if list(context_ids[: len(prompt_ids)]) != list(prompt_ids) or not prompt_ids:
        raise InputError("the context must start with the (non-empty) prompt")
    hooks = CaptureHooks(_begin_prompt(engine, prompt_ids))
    try:
        with torch.inference_mode(), hooks.watching():
            if path == PREFILL and logits_from is not None:
                hooks.begin(0, len(context_ids))
                ids = torch.tensor([list(context_ids)], dtype=torch.long, device=engine.device)
                engine._seq = 0
                engine._forward(ids, input_ids=ids, use_cache=True, logits_to_keep=_keep(logits_from, len(context_ids)))
            elif path == PREFILL:
                hooks.begin(0, len(context_ids))
                engine._prefill(list(context_ids))
            else:
                hooks.begin(0, len(prompt_ids))
                _, cache = engine._prefill(list(prompt_ids))
                for i in range(len(prompt_ids), len(context_ids)):
                    hooks.begin(i, 1)
                    _, cache = engine._decode(int(context_ids[i]), cache)
    finally:
        hooks.remove()
    return _with_meta(engine, hooks.capture(path, len(context_ids)))


def capture_hf_shared(
    engine: Any, decode_prompt_ids: Sequence[int], context_ids: Sequence[int], *, logits_from: int = 0
) -> dict[str, Capture]:
    """Both paths of an engine that stands for honest arithmetic (gate diagnose's honest
    engine, never a candidate), from one prefill: the prefill path is a prefill over the
    context with the logits of every position from `logits_from` on (at most the decode
    path's last prompt position: its lm_head row is one of them); the decode path's rows
    before its decode steps are that prefill's rows (lm_head's last one only, as the
    engine's own prefill keeps), and its decode steps run through that prefill's KV cache
    cropped to `decode_prompt_ids`. Causal
    attention makes those rows the same computation as a prefill over `decode_prompt_ids`
    alone, up to the rounding of a matrix product of other rows: both are honest arithmetic,
    which is all a band needs. A model with recurrent layers (Gated DeltaNet: a state no crop
    puts back) goes the other way round (`_shared_recurrent`); any other cache that cannot be
    cropped exactly (sliding-window layers) gets the decode path's own prefill (`capture_hf`)."""
    k = len(decode_prompt_ids)
    if list(context_ids[:k]) != list(decode_prompt_ids) or not 0 < k <= len(context_ids):
        raise InputError("the context must start with the decode path's (non-empty) prompt")
    if not 0 <= logits_from < k:
        raise InputError(f"logits_from {logits_from}: the decode path's prompt ends at position {k - 1}")
    hooks = CaptureHooks(_begin_prompt(engine, decode_prompt_ids))
    if has_recurrent_layers(engine.model.config):
        try:
            with torch.inference_mode(), hooks.watching():
                return _shared_recurrent(engine, hooks, k, context_ids, logits_from)
        finally:
            hooks.remove()
    try:
        with torch.inference_mode(), hooks.watching():
            hooks.begin(0, len(context_ids))
            ids = torch.tensor([list(context_ids)], dtype=torch.long, device=engine.device)
            engine._seq = 0
            keep = _keep(logits_from, len(context_ids))
            out = engine._forward(ids, input_ids=ids, use_cache=True, logits_to_keep=keep)
            cache = out.past_key_values
            del out
            full = hooks.take(PREFILL, len(context_ids))
            if not croppable(cache):
                hooks.remove()
                return {
                    PREFILL: _with_meta(engine, full),
                    DECODE: capture_hf(engine, decode_prompt_ids, context_ids, DECODE),
                }
            if k < len(context_ids):
                cache.crop(k - len(context_ids))
            engine._seq = k
            for i in range(k, len(context_ids)):
                hooks.begin(i, 1)
                _, cache = engine._decode(int(context_ids[i]), cache)
    finally:
        hooks.remove()
    stepped = hooks.take(DECODE, len(context_ids))
    decode = _joined(DECODE, full, stepped, k, len(context_ids))
    return {PREFILL: _with_meta(engine, full), DECODE: _with_meta(engine, decode)}


def _shared_recurrent(
    engine: Any, hooks: CaptureHooks, k: int, context_ids: Sequence[int], logits_from: int
) -> dict[str, Capture]:
    """`capture_hf_shared` on a model with recurrent layers, from one prefill over the decode
    path's prompt (its first `k` context tokens; lm_head's rows from `logits_from`): that
    prefill is the decode path's own, and its rows stand for the prefill path's before `k`
    (causal, as in the cropped case). The cache after it is copied: the decode path's steps
    run through the cache, the prefill path's rows from `k` on come from one forward over the
    rest of the context through the copy, a chunked prefill (the chunked delta rule from the
    prompt's state, the conv over its window). A one-token forward through a cache takes the
    decode kernels (transformers' Gated DeltaNet), so a lone rest token gets a second one
    after it, a copy of it, whose rows are dropped: causal, they change none before them. One
    prefill-sized forward where the fallback (`capture_hf` after a prefill over the context)
    makes two."""
    n = len(context_ids)
    ids = torch.tensor([list(context_ids[:k])], dtype=torch.long, device=engine.device)
    hooks.begin(0, k)
    engine._seq = 0
    out = engine._forward(ids, input_ids=ids, use_cache=True, logits_to_keep=_keep(logits_from, k))
    cache = out.past_key_values
    del out
    before = hooks.take(PREFILL, n)
    if k == n:
        return {PREFILL: _with_meta(engine, before), DECODE: _with_meta(engine, _joined(DECODE, before, None, k, n))}
    rest = [int(t) for t in context_ids[k:]]
    padded = rest + rest[-1:] if len(rest) == 1 else rest
    ids = torch.tensor([padded], dtype=torch.long, device=engine.device)
    hooks.begin(k, len(padded))
    engine._seq = k
    engine._forward(ids, input_ids=ids, past_key_values=copy.deepcopy(cache), use_cache=True, logits_to_keep=0)
    chunked = hooks.take(PREFILL, n)
    engine._seq = k
    for i in range(k, n):
        hooks.begin(i, 1)
        _, cache = engine._decode(int(context_ids[i]), cache)
    stepped = hooks.take(DECODE, n)
    prefill = _joined(PREFILL, before, chunked, k, n, first_logits=logits_from)
    return {PREFILL: _with_meta(engine, prefill), DECODE: _with_meta(engine, _joined(DECODE, before, stepped, k, n))}


def _joined(
    path: str, head: Capture, tail: Capture | None, k: int, n: int, *, first_logits: int | None = None
) -> Capture:
    """`path`'s capture: `head`'s rows before position `k` (lm_head's from `first_logits`,
    else from k - 1: the last prompt row, which the engine's own prefill keeps), then
    `tail`'s rows of the same module before position `n`, in `head`'s order of points."""
    after = tail.by_module() if tail is not None else {}
    tensors = []
    for t in head.tensors:
        first = (k - 1 if first_logits is None else first_logits) if t.point.part == LM_HEAD else 0
        # A capture's rows are its positions in order.
        lo, hi = bisect.bisect_left(t.positions, first), bisect.bisect_left(t.positions, k)
        positions, values = t.positions[lo:hi], t.values[lo:hi]
        more = after.get(t.point.module)
        if more is not None:
            end = bisect.bisect_left(more.positions, n)
            positions = positions + more.positions[:end]
            values = np.concatenate([values, more.values[:end]], axis=0)
        tensors.append(Tensor(t.point, positions, values))
    return Capture(path, n, tuple(tensors))


def _begin_prompt(engine: Any, prompt_ids: Sequence[int]) -> Any:
    """The engine's model, its routing state set for this prompt (the oracle's experts under
    routing=oracle); an engine not built on the HF engine has no capture."""
    model = getattr(engine, "model", None)
    if model is None or not all(hasattr(engine, m) for m in ("_prefill", "_decode", "_forward")):
        raise InputError(f"engine {getattr(engine, 'name', '?')!r} is not built on the HF engine: no capture")
    start_routing = getattr(engine, "_start_routing", None)
    if start_routing is not None:
        start_routing(list(prompt_ids))
    return model


def _keep(logits_from: int, length: int) -> int:
    """transformers' `logits_to_keep` for the rows from `logits_from` on (0 keeps all)."""
    return 0 if logits_from <= 0 else max(1, length - logits_from)


def _with_meta(engine: Any, capture: Capture) -> Capture:
    meta = {"engine": getattr(engine, "name", "hf"), "class": type(engine).__name__}
    return Capture(capture.path, capture.context_length, capture.tensors, meta)
