"""The decoder layers of a transformers model: where `gate diagnose` hooks its capture points
and where the self-test's mutants plant their faults."""

from __future__ import annotations

from typing import Any

import torch

from gate.errors import InputError


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
