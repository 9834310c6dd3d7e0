"""Loading the HF engine's parts: the torch device an option names, and the model's tokenizer."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from gate.errors import InputError


def device_of(name: str) -> torch.device:
    kind = name.split(":", 1)[0].lower()
    available = {
        "cpu": lambda: True,
        "cuda": torch.cuda.is_available,
        "mps": lambda: bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()),
        "xpu": lambda: bool(getattr(torch, "xpu", None) and torch.xpu.is_available()),
    }
    if kind not in available:
        raise InputError(f"--engine-opt device={name}: expected cpu, cuda, cuda:N, mps or xpu")
    if not available[kind]():
        raise InputError(f"--engine-opt device={name}: this torch ({torch.__version__}) sees no {kind} device")
    return torch.device(name)


def on_device(model: torch.nn.Module, device: torch.device) -> bool:
    """Whether every parameter and buffer of `model` is on `device` (the same type and index:
    `cuda` is not taken for `cuda:0`)."""
    for module in model.modules():  # one walk; a module's own tensors are its two dicts
        for tensors in (module._parameters, module._buffers):
            for t in tensors.values():
                if t is not None and t.device != device:
                    return False
    return True


def to_device(model: Any, device: torch.device) -> Any:
    """`model` on `device`: moved (`Module.to`, a walk of every module) only when some tensor of
    it is elsewhere; a model built on the device (every CPU load, a build on lent weights) is
    taken as it is."""
    return model if on_device(model, device) else model.to(device)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return str(torch.cuda.get_device_name(device))
    return device.type


def load_tokenizer(path: str, kwargs: Mapping[str, Any]) -> Any | None:
    """The model's tokenizer, or None when the folder has none (ids-only models)."""
    from transformers import AutoTokenizer

    extra = {k: v for k, v in kwargs.items() if k in ("trust_remote_code", "revision")}
    try:
        return AutoTokenizer.from_pretrained(path, **extra)
    except (OSError, ValueError, TypeError):
        return None
