"""Fault-injecting HF engines for `gate selftest`: each one is a bug an engine could ship.

- `tie-break-highest`: exact ties go to the highest token id instead of the lowest
  (`torch.argmax`'s rule, which the oracle follows); the gate must call every change an
  exact tie with tie_break "higher_id".
- `runner-up+1-step` / `runner-up+4-steps`: at every position the runner-up's logit is
  raised by one (four) steps of the model dtype's grid, the worst perturbation of that
  size: it flips every position whose top-2 gap is at most that many steps. One step is
  what honest engines drift by, so the gate must ratify it (ties and near ties); four steps
  is a real numerical fault and must show up as defects.
- `float16`: the model run in float16 instead of bfloat16; every change must be reported.
- `skip-layer-N`: decoder layer N (the middle one by default) is skipped, its input passed
  through; must show up as defects.

All are subclasses of `HFEngine` that override only its fault-injection points
(`_logits_hook`) or its options, so the decode loop under test is the real one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from gate.core.calibration.selftest import (
    EXPECT_CAUGHT,
    EXPECT_DEFECT,
    EXPECT_EXACT_TIES,
    EXPECT_NO_DEFECT,
    Mutation,
)
from gate.core.engine import Engine
from gate.engines.hf import HFEngine
from gate.errors import InputError

SEVERAL_STEPS = 4


def runner_up(logits: torch.Tensor) -> int:
    """The token `torch.argmax` would pick if the top one were gone: ties to the lowest id."""
    top = int(torch.argmax(logits))
    masked = logits.clone()
    masked[top] = float("-inf")
    return int(torch.argmax(masked))


def raise_by_steps(value: torch.Tensor, steps: int, dtype: torch.dtype) -> torch.Tensor:
    """`value` moved `steps` representable numbers of `dtype` towards +inf (crossing a power
    of two, the step size changes with it, as the grid does)."""
    x = value.to(dtype)
    up = torch.full_like(x, float("inf"))
    for _ in range(steps):
        x = torch.nextafter(x, up)
    return x.to(value.dtype)


class RunnerUpNudgedHFEngine(HFEngine):
    """The runner-up's logit raised by `steps` steps of the model dtype's grid."""

    name = "hf-runner-up-nudged"

    def __init__(self, model: str, *, steps: int, **options: Any) -> None:
        super().__init__(model, **options)
        if steps < 1:
            raise InputError(f"runner-up nudge: steps must be >= 1, found {steps}")
        self.steps = steps

    def _logits_hook(self, logits: torch.Tensor, position: int) -> torch.Tensor:
        logits = super()._logits_hook(logits, position)
        r = runner_up(logits)
        out = logits.clone()
        out[r] = raise_by_steps(logits[r], self.steps, self.dtype)
        return out

    def info(self) -> dict[str, Any]:
        return {**super().info(), "mutation": f"runner-up +{self.steps} {self.dtype} steps"}


class _PassThrough(torch.nn.Module):
    """A decoder layer that returns its input hidden states untouched."""

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return hidden_states


def decoder_layers(model: Any) -> torch.nn.ModuleList:
    """The model's list of decoder layers (`model.model.layers` for Llama-style models)."""
    n = getattr(model.config, "num_hidden_layers", None)
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if isinstance(layers, torch.nn.ModuleList):
        return layers
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == n:
            return module
    raise InputError(f"cannot find the decoder layers of {type(model).__name__} to skip one")


class LayerSkippedHFEngine(HFEngine):
    """One decoder layer skipped: its input goes straight to the next layer."""

    name = "hf-layer-skipped"

    def __init__(self, model: str, *, layer: int | None = None, **options: Any) -> None:
        super().__init__(model, **options)
        layers = decoder_layers(self.model)
        index = len(layers) // 2 if layer is None else layer
        if not 0 <= index < len(layers):
            raise InputError(f"skip layer {index}: the model has {len(layers)} decoder layers")
        layers[index] = _PassThrough()
        self.skipped = index

    def info(self) -> dict[str, Any]:
        return {**super().info(), "mutation": f"decoder layer {self.skipped} skipped"}


def _with(options: Mapping[str, str], **override: str) -> dict[str, str]:
    return {**options, **override}


def baseline_loader(model: str, options: Mapping[str, str]) -> Callable[[], Engine]:
    """The unmutated HF engine, ties to the lowest id whatever the options say."""
    opts = _with(options, tie_break="lowest")
    return lambda: HFEngine(model, **opts)


def mutations(model: str, options: Mapping[str, str], *, only: Sequence[str] | None = None) -> list[Mutation]:
    """The self-test's faults for the HF engine on `model`, with the user's engine options."""
    opts = _with(options, tie_break="lowest")
    dtype = str(options.get("dtype", "bfloat16"))
    n_layers = _layer_count(model)
    middle = n_layers // 2 if n_layers else None
    skip_name = f"skip-layer-{middle}" if middle is not None else "skip-layer"
    all_mutations = [
        Mutation(
            "tie-break-highest",
            "exact ties broken to the highest token id instead of the lowest",
            EXPECT_EXACT_TIES,
            lambda: HFEngine(model, **_with(opts, tie_break="highest")),
        ),
        Mutation(
            "runner-up+1-step",
            f"the runner-up's logit raised by one {dtype} step at every position",
            EXPECT_NO_DEFECT,
            lambda: RunnerUpNudgedHFEngine(model, steps=1, **opts),
        ),
        Mutation(
            f"runner-up+{SEVERAL_STEPS}-steps",
            f"the runner-up's logit raised by {SEVERAL_STEPS} {dtype} steps at every position",
            EXPECT_DEFECT,
            lambda: RunnerUpNudgedHFEngine(model, steps=SEVERAL_STEPS, **opts),
        ),
        Mutation(
            "float16",
            "the model run in float16 instead of bfloat16",
            EXPECT_CAUGHT,
            lambda: HFEngine(model, **_with(opts, dtype="float16")),
        ),
        Mutation(
            skip_name,
            f"decoder layer {middle if middle is not None else '(middle)'} skipped, its input passed through",
            EXPECT_DEFECT,
            lambda: LayerSkippedHFEngine(model, layer=middle, **opts),
        ),
    ]
    if not only:
        return all_mutations
    names = {m.name for m in all_mutations}
    unknown = [n for n in only if n not in names]
    if unknown:
        raise InputError(f"--only {unknown[0]!r}: unknown mutant (known: {', '.join(sorted(names))})")
    return [m for m in all_mutations if m.name in set(only)]


def _layer_count(model: str) -> int | None:
    """The model's decoder layer count from its config, without loading weights."""
    from transformers import AutoConfig

    from gate.models.default import resolve_model_path

    try:
        config = AutoConfig.from_pretrained(resolve_model_path(model))
    except (OSError, ValueError):
        return None
    n = getattr(config, "num_hidden_layers", None)
    return int(n) if isinstance(n, int) else None
