"""gate diagnose's reference from the honest engine's own load: float32 by widening the
loaded weights in place, where that is exactly what loading them in float32 gives.

Loading a model's weights in float32 reads every stored value and widens it; when every
stored floating tensor is in the honest engine's dtype (a bf16 checkpoint and a bf16 honest
engine, the usual case), the honest engine's loaded parameters hold those very values, and
widening them in place gives the float32 load bit for bit: bf16 and fp16 widen to float32
exactly. What must hold, checked here, else the reference is loaded on its own:
- every floating tensor of every `*.safetensors` file is stored in the honest dtype (a
  float32 checkpoint loaded in bf16 has lost bits no widening restores);
- every floating parameter is in the honest dtype or already float32 (a module transformers
  keeps in float32 was loaded from the same stored values);
- every floating buffer is already float32 (buffers are computed at init: one computed in
  the honest dtype would widen from rounded values).
tests/workflows/test_diagnose_reference_upcast.py checks the result against a float32 load,
logits bit for bit, on each architecture of the tests (Llama, Qwen3 MoE, the hybrid Qwen3.5
MoE).
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import orjson
import torch

# safetensors' dtype names of floating tensors, by torch dtype.
STORED = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}
FLOATING = {"BF16", "F16", "F32", "F64", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F4"}
HEADER_LIMIT = 100 << 20  # safetensors' own bound on a header


def stored_dtypes(folder: str | Path) -> set[str] | None:
    """The safetensors dtype names of every floating tensor in `folder`'s `*.safetensors`
    files, read from their headers; None when there are none or a header cannot be read."""
    files = sorted(Path(folder).glob("*.safetensors")) if Path(folder).is_dir() else []
    if not files:
        return None
    found: set[str] = set()
    for f in files:
        try:
            with open(f, "rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                if n > HEADER_LIMIT:
                    return None
                header = orjson.loads(fh.read(n))
        except (OSError, struct.error, orjson.JSONDecodeError):
            return None
        if not isinstance(header, dict):
            return None
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            dtype = entry.get("dtype") if isinstance(entry, dict) else None
            if not isinstance(dtype, str):
                return None
            if dtype in FLOATING:
                found.add(dtype)
    return found


def widens_exactly(engine: Any) -> bool:
    """Whether widening `engine`'s loaded model to float32 in place gives its float32 load."""
    dtype = getattr(engine, "dtype", None)
    model = getattr(engine, "model", None)
    if model is None or dtype not in STORED or dtype == torch.float32:
        return False
    if stored_dtypes(getattr(engine, "model_path", "")) != {STORED[dtype]}:
        return False
    params = all(p.dtype in (dtype, torch.float32) for p in model.parameters() if p.is_floating_point())
    buffers = all(b.dtype == torch.float32 for b in model.buffers() if b.is_floating_point())
    return params and buffers


def widen(engine: Any) -> None:
    """Widen `engine`'s model to float32 in place (after `widens_exactly`); it is then the
    reference engine, described as float32."""
    engine.model = engine.model.to(torch.float32)
    engine.model.config.dtype = torch.float32
    engine.dtype = torch.float32
    engine.options = {**engine.options, "dtype": "float32"}
