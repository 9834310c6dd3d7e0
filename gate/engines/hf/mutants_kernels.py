"""Borderline kernel shortcuts: HF engines that compute one step of the reference model
with less precision or another constant, as fast kernels sometimes do. Where each lands
against the honest floor is a finding of the separation study (docs/studies/
separation-study.md), not an expectation of the self-test:

- `rmsnorm-bf16`: every RMSNorm computed in bfloat16 (the reference: float32, cast back);
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
}


def borderline_mutations(model: str, options: Mapping[str, str]) -> list[Mutation]:
    """The shortcuts as mutations (the study reports where they land; nothing is expected)."""
    opts: dict[str, Any] = {**dict(options), "tie_break": "lowest"}

    def loader(name: str) -> Callable[[], Engine]:
        return lambda: KernelShortcutHFEngine(model, shortcut=name, **opts)

    return [Mutation(name, what, EXPECT_NO_DEFECT, loader(name)) for name, what in SHORTCUTS.items()]
