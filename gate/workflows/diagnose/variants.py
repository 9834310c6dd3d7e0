"""Honest variants of the HF engine for `gate diagnose`'s margin: the same weights under other
kernel paths (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA: read once when torch loads, so each
runs in its own process), thread counts and attention implementations.

`capture_in_subprocess` runs one variant in a child process (`python -m
gate.workflows.diagnose.variants`, a JSON spec on stdin) that writes its captures as .npz
files (no pickles) for the parent to compare against its own reference and band.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from gate.core.diagnosis.capture import Capture, capture_from_arrays, capture_to_arrays
from gate.errors import EngineError

# name -> (environment, engine options)
HONEST_VARIANTS: dict[str, tuple[dict[str, str], dict[str, str]]] = {
    "aten-default": ({"ATEN_CPU_CAPABILITY": "default"}, {}),
    "aten-avx2": ({"ATEN_CPU_CAPABILITY": "avx2"}, {}),
    "aten-avx512": ({"ATEN_CPU_CAPABILITY": "avx512"}, {}),
    "onednn-avx2": ({"ONEDNN_MAX_CPU_ISA": "AVX2"}, {}),
    "threads-2": ({}, {"threads": "2"}),
    "eager-attention": ({}, {"attn_implementation": "eager"}),
}

# ATen's CPU capabilities, each needing the instructions of those before it.
ATEN_CAPABILITIES = ("default", "avx2", "avx512")


def supported_aten_capabilities() -> tuple[str, ...]:
    """The ATen capabilities this CPU can run: torch forced to one the CPU lacks dies of an
    illegal instruction (SIGILL) at its first kernel, so a variant is only run where its
    instructions are there."""
    import torch

    probes = {name: getattr(torch.cpu, f"_is_{name}_supported", None) for name in ATEN_CAPABILITIES[1:]}
    if all(callable(has) for has in probes.values()):
        return ("default", *(name for name, has in probes.items() if callable(has) and has()))
    # No probe in this torch: the capability it chose itself is the highest the CPU has.
    native = torch.backends.cpu.get_cpu_capability().lower()
    return ATEN_CAPABILITIES[: ATEN_CAPABILITIES.index(native) + 1] if native in ATEN_CAPABILITIES else ("default",)


def runnable_variants() -> dict[str, tuple[dict[str, str], dict[str, str]]]:
    """`HONEST_VARIANTS` less those forcing an ATen capability this CPU lacks (an AVX2-only
    machine runs no `aten-avx512`). `ONEDNN_MAX_CPU_ISA` is a ceiling: oneDNN never goes
    above what the CPU has, so its variants run everywhere."""
    supported = supported_aten_capabilities()
    return {
        name: (env, opts)
        for name, (env, opts) in HONEST_VARIANTS.items()
        if env.get("ATEN_CPU_CAPABILITY", "default") in supported
    }


def capture_in_subprocess(
    model_path: str,
    options: Mapping[str, str],
    env: Mapping[str, str],
    prompt_ids: Sequence[int],
    context_ids: Sequence[int],
    paths: Sequence[str],
    *,
    timeout: float = 900,
) -> dict[str, Capture]:
    """The HF engine's captures (one per path) from a child process with `env` added."""
    with tempfile.TemporaryDirectory(prefix="gate-diagnose-") as tmp:
        spec = {
            "model": model_path,
            "options": dict(options),
            "prompt": list(prompt_ids),
            "context": list(context_ids),
            "paths": list(paths),
            "out": tmp,
        }
        child_env = {**os.environ, **env}
        child_env.setdefault("OMP_NUM_THREADS", "1")
        proc = subprocess.run(
            [sys.executable, "-m", "gate.workflows.diagnose.variants"],
            input=json.dumps(spec),
            capture_output=True,
            text=True,
            env=child_env,
            timeout=timeout,
            check=False,
        )
        if proc.returncode != 0:
            raise EngineError(f"honest variant {dict(env)} {dict(options)} failed: {proc.stderr.strip()[-800:]}")
        out = {}
        for path in paths:
            with np.load(Path(tmp) / f"{path}.npz", allow_pickle=False) as arrays:
                out[path] = capture_from_arrays({k: arrays[k] for k in arrays.files})
        return out


def _child() -> None:
    import torch

    from gate.engines.registry import load_reference

    spec = json.loads(sys.stdin.read())
    opts = dict(spec["options"])
    if "threads" not in opts:
        torch.set_num_threads(1)
    engine = load_reference(spec["model"], **opts)
    for path in spec["paths"]:
        capture = engine.capture_path(spec["prompt"], spec["context"], path)
        np.savez(Path(spec["out"]) / f"{path}.npz", **capture_to_arrays(capture))  # type: ignore[arg-type]
    print(json.dumps({"capability": torch.backends.cpu.get_cpu_capability()}))


if __name__ == "__main__":
    _child()
