"""Four planted bugs in Qwen3.6's parts, as engine plugins on the HF engine (the weights on disk,
and so their hash, stay the pin's), each in one layer (`layer=N`):

- `DecayInBF16`: a Gated DeltaNet's decay `g` computed in bfloat16, and cumulated in bfloat16
  within each chunk of the chunked prefill (as a kernel that keeps g in bf16 does); both paths;
- `ConvStateShifted`: a DeltaNet's conv state shifted by one token at each decode step (the
  prefill's conv is right): the decode path only;
- `SharedGateDropped`: a MoE block adds its shared expert without the sigmoid gate; both paths;
- `QueryPositionPlusOne`: the full-attention layer's queries rotated at position + 1 (the keys
  at their own): an off-by-one in the rotary position; both paths.

`--engine helpers.planted_qwen36:DecayInBF16`. A bug that swaps a function the layer's forward
calls by name (the delta rule, the rotary embedding) swaps it for that module's own forward
only, and puts it back after.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from gate.engines.hf.engine import HFEngine
from gate.engines.hf.layers import decoder_layers


@contextmanager
def swapped(module: Any, name: str, wrap: Callable[[Any], Any]) -> Iterator[None]:
    """The global `name` of `module`'s source module replaced by `wrap(original)` meanwhile."""
    source = sys.modules[type(module).__module__]
    original = getattr(source, name)
    setattr(source, name, wrap(original))
    try:
        yield
    finally:
        setattr(source, name, original)


def during_forward(module: Any, name: str, wrap: Callable[[Any], Any]) -> None:
    """`module`'s forward runs with its source module's `name` swapped for `wrap(original)`."""
    forward = module.forward

    def planted(*args: Any, **kwargs: Any) -> Any:
        with swapped(module, name, wrap):
            return forward(*args, **kwargs)

    module.forward = planted


class _OneLayer(HFEngine):
    default_layer = 0

    def __init__(self, model: str, layer: str | int | None = None, **options: Any) -> None:
        super().__init__(model, **options)
        self.layer = int(self.default_layer if layer is None else layer)
        self.plant(decoder_layers(self.model)[self.layer])

    def plant(self, layer: Any) -> None:
        raise NotImplementedError


def bf16_cumulated(g: torch.Tensor, chunk: int) -> torch.Tensor:
    """`g` [batch, tokens, heads] in bfloat16, whose float32 cumulative sum within each chunk of
    `chunk` tokens is the bfloat16 one (each partial sum rounded to bfloat16)."""
    g16 = g.to(torch.bfloat16)
    out = torch.empty_like(g, dtype=torch.float32)
    for start in range(0, g.shape[1], chunk):
        total = torch.zeros_like(g16[:, 0])
        previous = torch.zeros_like(g16[:, 0], dtype=torch.float32)
        for t in range(start, min(start + chunk, g.shape[1])):
            total = (total + g16[:, t]).to(torch.bfloat16)
            out[:, t] = total.float() - previous
            previous = total.float()
    return out


class DecayInBF16(_OneLayer):
    name = "planted-qwen36-decay-bf16"
    default_layer = 0

    def plant(self, layer: Any) -> None:
        def chunked(rule: Any) -> Any:
            def planted(*args: Any, g: torch.Tensor, chunk_size: int = 64, **kwargs: Any) -> Any:
                return rule(*args, g=bf16_cumulated(g, chunk_size), chunk_size=chunk_size, **kwargs)

            return planted

        def stepped(rule: Any) -> Any:
            def planted(*args: Any, g: torch.Tensor, **kwargs: Any) -> Any:
                return rule(*args, g=g.to(torch.bfloat16).float(), **kwargs)

            return planted

        net = layer.linear_attn
        during_forward(net, "torch_chunk_gated_delta_rule", chunked)
        during_forward(net, "torch_recurrent_gated_delta_rule", stepped)


class ConvStateShifted(_OneLayer):
    name = "planted-qwen36-conv-state-shifted"
    default_layer = 2

    def plant(self, layer: Any) -> None:
        net = layer.linear_attn

        def shift(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
            cache = kwargs.get("cache_params")
            hidden = kwargs.get("hidden_states", args[0] if args else None)
            if cache is None or hidden is None or hidden.shape[1] != 1:
                return
            if not cache.has_previous_state(net.layer_idx, state_idx=0):
                return
            state = cache.layers[net.layer_idx].conv_states[0]
            state[..., 1:] = state[..., :-1].clone()  # each token one place later: the newest dropped
            state[..., 0] = 0

        net.register_forward_pre_hook(shift, with_kwargs=True)


class SharedGateDropped(_OneLayer):
    name = "planted-qwen36-shared-gate-dropped"
    default_layer = 1

    def plant(self, layer: Any) -> None:
        block = layer.mlp

        def forward(hidden_states: torch.Tensor) -> torch.Tensor:
            batch, length, width = hidden_states.shape
            x = hidden_states.view(-1, width)
            shared = block.shared_expert(x)
            _, weights, chosen = block.gate(x)
            out = block.experts(x, chosen, weights) + shared  # sigmoid(shared_expert_gate(x)) * shared, dropped
            return out.reshape(batch, length, width)

        block.forward = forward


class QueryPositionPlusOne(_OneLayer):
    name = "planted-qwen36-query-position-plus-one"
    default_layer = 3

    def plant(self, layer: Any) -> None:
        attn = layer.self_attn
        rotary = next(m for n, m in self.model.named_modules() if n.endswith("rotary_emb") and "visual" not in n)
        shifted: dict[str, Any] = {}

        def positions(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
            hidden: torch.Tensor = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            cache = kwargs.get("past_key_values")
            past = cache.get_seq_length(attn.layer_idx) if cache is not None else 0
            ids = torch.arange(hidden.shape[1], device=hidden.device) + past + 1
            shifted["cos_sin"] = rotary(hidden, ids.view(1, 1, -1).expand(3, hidden.shape[0], -1))

        def rotate(apply: Any) -> Any:
            def planted(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *a: Any) -> Any:
                cos1, sin1 = shifted["cos_sin"]
                q_embed, _ = apply(q, k, cos1, sin1, *a)
                _, k_embed = apply(q, k, cos, sin, *a)
                return q_embed, k_embed

            return planted

        attn.register_forward_pre_hook(positions, with_kwargs=True)
        during_forward(attn, "apply_rotary_pos_emb", rotate)
