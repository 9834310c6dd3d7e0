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


class OwnActivationsMLPBug(HFEngine):
    """An engine that hands gate its own activations (`capture_activations`, the plugin
    contract's capture capability) rather than being hooked: one layer's MLP output scaled by
    `factor` (1: honest), its modules read by name over one forward of the whole context."""

    name = "planted-own-activations"

    def __init__(self, model: str, *, layer: str | int = 1, factor: str | float = 2.0, **options: Any) -> None:
        super().__init__(model, **options)
        if float(factor) != 1.0:
            mlp = decoder_layers(self.model)[int(layer)].mlp
            mlp.register_forward_hook(lambda m, a, out: out * float(factor))

    def capture_activations(self, context_token_ids: Any, names: Any = None) -> dict[str, Any]:
        rows: dict[str, Any] = {}
        handles = []
        for name in names or ():

            def keep(m: Any, a: Any, out: Any, name: str = name) -> None:
                t = out[0] if isinstance(out, tuple) else getattr(out, "logits", out)
                rows[name] = t.detach().float().reshape(-1, t.shape[-1]).numpy().copy()

            handles.append(self.model.get_submodule(name).register_forward_hook(keep))
        try:
            with torch.inference_mode():
                self.model(input_ids=torch.tensor([list(context_token_ids)]), logits_to_keep=0)
        finally:
            for h in handles:
                h.remove()
        return rows


class StalePrefixCacheBug(HFEngine):
    """A prefix cache that reuses a kept prompt's KV cache without cutting it back to the
    common prefix: the new prompt's rest is appended after the old prompt's tail (a
    serving engine's classic cache bug). Honest whenever the prefix cache is off."""

    name = "planted-stale-prefix-cache"

    def _prefill(self, prompt_ids: Any) -> Any:
        import copy

        store = self.prefix_store
        if store is None:
            return super()._prefill(prompt_ids)
        prompt = tuple(int(t) for t in prompt_ids)
        n, held = store.longest(prompt)
        ids = torch.tensor([list(prompt)], dtype=torch.long, device=self.device)
        if held is None:
            out = self.model(input_ids=ids, use_cache=True, logits_to_keep=1)
        else:
            rest = ids[:, n:]
            out = self.model(input_ids=rest, past_key_values=copy.deepcopy(held), use_cache=True, logits_to_keep=1)
            store.hits += 1
        store.keep(prompt, copy.deepcopy(out.past_key_values))
        return out.logits[0, -1], out.past_key_values
