"""Borderline kernel shortcuts: HF engines that compute one step of the reference model
with less precision or another constant, as fast kernels sometimes do. Where each lands
against the honest floor is a finding of the separation study (docs/studies/
separation-study.md), not an expectation of the self-test:

- `rmsnorm-bf16`: every RMSNorm computed in bfloat16 (the reference: float32, cast back);
- `softmax-bf16`: the attention softmax computed in bfloat16 (the reference: float32),
  through eager attention;
- `rmsnorm-eps-1e-6`: every RMSNorm with epsilon 1e-6 instead of the model's own.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping
from typing import Any

import torch

from gate.core.calibration.selftest import EXPECT_NO_DEFECT, Mutation
from gate.core.engine import Engine
from gate.engines.hf.engine import HFEngine

BF16_SOFTMAX = "gate_softmax_bf16"
OTHER_EPS = 1e-6


def _norms(model: Any) -> list[torch.nn.Module]:
    return [m for m in model.modules() if hasattr(m, "variance_epsilon") and hasattr(m, "weight")]


def _rmsnorm_bf16(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    x = hidden_states.to(torch.bfloat16)
    variance = x.pow(2).mean(-1, keepdim=True)
    return self.weight * (x * torch.rsqrt(variance + self.variance_epsilon))


class KernelShortcutHFEngine(HFEngine):
    """The HF engine with one kernel shortcut (`shortcut`: a key of `SHORTCUTS`)."""

    name = "hf-kernel-shortcut"

    def __init__(self, model: str, *, shortcut: str, **options: Any) -> None:
        if shortcut == "softmax-bf16":
            _register_bf16_softmax()
            options = {**options, "attn_implementation": BF16_SOFTMAX}
        super().__init__(model, **options)
        self.shortcut = shortcut
        for norm in _norms(self.model):
            if shortcut == "rmsnorm-bf16":
                norm.forward = types.MethodType(_rmsnorm_bf16, norm)
            elif shortcut == "rmsnorm-eps-1e-6":
                setattr(norm, "variance_epsilon", OTHER_EPS)  # noqa: B010 (a float attribute nn.Module types as a tensor)

    def info(self) -> dict[str, Any]:
        return {**super().info(), "mutation": SHORTCUTS[self.shortcut]}


SHORTCUTS = {
    "rmsnorm-bf16": "every RMSNorm computed in bfloat16",
    "softmax-bf16": "the attention softmax computed in bfloat16 (eager attention)",
    "rmsnorm-eps-1e-6": f"every RMSNorm with epsilon {OTHER_EPS:g} instead of the model's",
}


def _register_bf16_softmax() -> None:
    from transformers import AttentionInterface
    from transformers.models.llama.modeling_llama import repeat_kv

    def attention(
        module: Any,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        scaling: float,
        dropout: float = 0.0,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        k = repeat_kv(key, module.num_key_value_groups)
        v = repeat_kv(value, module.num_key_value_groups)
        w = (torch.matmul(query, k.transpose(2, 3)) * scaling).to(torch.bfloat16)
        if attention_mask is not None:
            w = w + attention_mask.to(torch.bfloat16)
        e = (w - w.amax(dim=-1, keepdim=True)).exp()
        w = (e / e.sum(dim=-1, keepdim=True)).to(query.dtype)
        out = torch.matmul(w, v).transpose(1, 2).contiguous()
        return out, w

    AttentionInterface.register(BF16_SOFTMAX, attention)


def borderline_mutations(model: str, options: Mapping[str, str]) -> list[Mutation]:
    """The shortcuts as mutations (the study reports where they land; nothing is expected)."""
    opts: dict[str, Any] = {**dict(options), "tie_break": "lowest"}

    def loader(name: str) -> Callable[[], Engine]:
        return lambda: KernelShortcutHFEngine(model, shortcut=name, **opts)

    return [Mutation(name, what, EXPECT_NO_DEFECT, loader(name)) for name, what in SHORTCUTS.items()]
