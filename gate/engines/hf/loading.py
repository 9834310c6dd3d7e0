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
