"""HF engines with one planted bug each, as plugins ship them: subclasses of HFEngine that change
the model (or the decode path) after loading. `gate diagnose` must see each change and locate
it at its layer, part and path. Options come as strings from `--engine-opt`."""

from __future__ import annotations

from typing import Any

import torch

from gate.engines.hf.engine import HFEngine
from gate.engines.hf.layers import decoder_layers


class AttentionBug(HFEngine):
    """One layer's attention output projection loaded transposed (a weight-layout bug; o_proj
    is square in the models tested)."""

    name = "planted-attention-o-proj"

    def __init__(self, model: str, *, layer: str | int = 1, **options: Any) -> None:
        super().__init__(model, **options)
        o_proj = decoder_layers(self.model)[int(layer)].self_attn.o_proj
        with torch.no_grad():
            o_proj.weight.copy_(o_proj.weight.t().contiguous())


class MLPSwapBug(HFEngine):
    """One layer's MLP with gate_proj and up_proj swapped (a weight-loading bug)."""

    name = "planted-mlp-swap"

    def __init__(self, model: str, *, layer: str | int = 1, **options: Any) -> None:
        super().__init__(model, **options)
        mlp = decoder_layers(self.model)[int(layer)].mlp
        mlp.gate_proj, mlp.up_proj = mlp.up_proj, mlp.gate_proj


class EmbeddingScaleBug(HFEngine):
    """The embedding output multiplied by 1 + 1/16 (a stray normaliser)."""

    name = "planted-embedding-scale"

    def __init__(self, model: str, **options: Any) -> None:
        super().__init__(model, **options)
        self.model.get_input_embeddings().register_forward_hook(lambda m, a, out: out * 1.0625)


class WrongActivationBug(HFEngine):
    """Every MLP uses GELU (tanh) instead of the model's SiLU."""

    name = "planted-wrong-activation"

    def __init__(self, model: str, **options: Any) -> None:
        super().__init__(model, **options)
        for layer in decoder_layers(self.model):
            layer.mlp.act_fn = torch.nn.GELU(approximate="tanh")


class DecodePositionBug(HFEngine):
    """Decode steps count positions from the end of the prompt, forgetting its length (position
    i of the generation gets position id i); the prefill is right."""

    name = "planted-decode-position"

    def _prefill(self, prompt_ids: Any) -> tuple[torch.Tensor, Any]:
        self._prompt_length = len(prompt_ids)
        return super()._prefill(prompt_ids)

    def _decode(self, token: int, cache: Any) -> tuple[torch.Tensor, Any]:
        ids = torch.tensor([[token]], dtype=torch.long, device=self.device)
        pos = torch.tensor([[cache.get_seq_length() - self._prompt_length]], dtype=torch.long, device=self.device)
        out = self._forward(ids, input_ids=ids, past_key_values=cache, use_cache=True, position_ids=pos)
        return out.logits[0, -1], out.past_key_values


def fake_quantise(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Symmetric per-vector (last dim) absmax quantisation to `bits`, dequantised."""
    levels = 2 ** (bits - 1) - 1
    scale = x.abs().amax(dim=-1, keepdim=True).clamp_min(1e-8) / levels
    return (torch.round(x / scale).clamp(-levels, levels) * scale).to(x.dtype)


class QuantisedKVCacheBug(HFEngine):
    """A 4-bit KV cache: what the cache holds is quantised before each decode step reads it.
    A prefill attends to its own fresh keys and values, so only the decode path sees it."""

    name = "planted-kv-int4"

    def _decode(self, token: int, cache: Any) -> tuple[torch.Tensor, Any]:
        for layer in cache.layers:
            layer.keys = fake_quantise(layer.keys, 4)
            layer.values = fake_quantise(layer.values, 4)
        return super()._decode(token, cache)


class ExpertScaleBug(HFEngine):
    """MoE: one layer's expert `expert` with its down projection x4 (a dequantisation bug)."""

    name = "planted-expert-scale"

    def __init__(self, model: str, *, layer: str | int = 1, expert: str | int = 0, **options: Any) -> None:
        super().__init__(model, **options)
        with torch.no_grad():
            decoder_layers(self.model)[int(layer)].mlp.experts.down_proj[int(expert)].mul_(4.0)


class RouterBug(HFEngine):
    """MoE: one layer's router weights x3 (a wrong router scale: sharper scores, other experts)."""

    name = "planted-router-scale"

    def __init__(self, model: str, *, layer: str | int = 1, **options: Any) -> None:
        super().__init__(model, **options)
        with torch.no_grad():
            decoder_layers(self.model)[int(layer)].mlp.gate.weight.mul_(3.0)
