"""Borderline kernel shortcuts: HF engines that compute one step of the reference model
with less precision or another constant, as fast kernels sometimes do. Where each lands
against the honest floor is a finding of the separation study (docs/studies/
separation-study.md), not an expectation of the self-test:

- `rmsnorm-bf16`: every RMSNorm computed in bfloat16 (the reference: float32, cast back);
- `rmsnorm-eps-1e-6`: every RMSNorm with epsilon 1e-6 instead of the model's own;
- `softmax-bf16`: attention's softmax in bfloat16 (the reference: float32, cast back): the
  exponentials, their sum and the quotient each rounded to bfloat16. It is registered as its
  own attention implementation with the eager one's mask (an implementation transformers does
  not know gets no mask at all: the first version of this shortcut attended to the future).
"""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping
from typing import Any

import torch

from gate.core.calibration.selftest import EXPECT_NO_DEFECT, Mutation
from gate.core.engine import Engine
from gate.engines.hf.engine import HFEngine

OTHER_EPS = 1e-6


def _norms(model: Any) -> list[torch.nn.Module]:
    return [m for m in model.modules() if hasattr(m, "variance_epsilon") and hasattr(m, "weight")]


def _rmsnorm_bf16(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    x = hidden_states.to(torch.bfloat16)
    variance = x.pow(2).mean(-1, keepdim=True)
    return self.weight * (x * torch.rsqrt(variance + self.variance_epsilon))


SOFTMAX_BF16 = "gate_softmax_bf16"


def _attention_softmax_bf16(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' eager attention with the softmax in the activations' dtype (bf16)."""
    groups = int(getattr(module, "num_key_value_groups", 1))
    key = key.repeat_interleave(groups, dim=1)
    value = value.repeat_interleave(groups, dim=1)
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask
    exps = (scores - scores.amax(dim=-1, keepdim=True)).exp()
    weights = exps / exps.sum(dim=-1, keepdim=True)
    out = torch.matmul(weights.to(value.dtype), value).transpose(1, 2).contiguous()
    return out, weights


def _register_softmax_bf16() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask

    AttentionInterface.register(SOFTMAX_BF16, _attention_softmax_bf16)
    ALL_MASK_ATTENTION_FUNCTIONS.register(SOFTMAX_BF16, eager_mask)


class KernelShortcutHFEngine(HFEngine):
    """The HF engine with one kernel shortcut (`shortcut`: a key of `SHORTCUTS`)."""

    name = "hf-kernel-shortcut"

    def __init__(self, model: str, *, shortcut: str, **options: Any) -> None:
        if shortcut == "softmax-bf16":
            _register_softmax_bf16()
            options = {**options, "attn_implementation": SOFTMAX_BF16}
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
    "rmsnorm-eps-1e-6": f"every RMSNorm with epsilon {OTHER_EPS:g} instead of the model's",
    "softmax-bf16": "attention's softmax in bfloat16 (exponentials, sum and quotient rounded)",
}


def borderline_mutations(model: str, options: Mapping[str, str]) -> list[Mutation]:
    """The shortcuts as mutations (the study reports where they land; nothing is expected)."""
    opts: dict[str, Any] = {**dict(options), "tie_break": "lowest"}

    def loader(name: str) -> Callable[[], Engine]:
        return lambda: KernelShortcutHFEngine(model, shortcut=name, **opts)

    return [Mutation(name, what, EXPECT_NO_DEFECT, loader(name)) for name, what in SHORTCUTS.items()]
