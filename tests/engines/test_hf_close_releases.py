"""Closing the HF engine releases its model at once. Hooks that live as long as the model
(the routing record, the reference's per-layer widening) and the capture's hooks hold
modules in reference cycles; until they were broken, a closed engine's layers and weights
stayed resident until Python's cyclic collector happened to run: `gate diagnose` loads an
honest engine per diagnosis, and three diagnoses of a 342M model in one process grew its
RSS 2.7 -> 4.0 -> 5.2 GB, each later load faulting fresh memory in."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

CONTEXT = [3, 17, 42, 8, 99, 5]


def test_a_closed_engine_frees_every_layer_without_the_cyclic_collector(tiny_models_dir: Path) -> None:
    from helpers.tiny_models import build_tiny_qwen3_5_moe

    from gate.core.diagnosis.capture import PREFILL
    from gate.workflows.diagnose.core import load_hf

    folder = build_tiny_qwen3_5_moe(tiny_models_dir / "close-releases", seed=3)
    load_hf(str(folder), "bfloat16").close()  # the process's first load (transformers' imports)
    gc.collect()
    was = gc.isenabled()
    gc.disable()  # the collector must not be what frees it
    try:
        # What one diagnosis does with its honest engine, then its reference.
        engine = load_hf(str(folder), "bfloat16")
        engine.capture_paths_shared(CONTEXT, CONTEXT)
        engine.widen()
        engine.capture_path(CONTEXT, CONTEXT, PREFILL)
        alive = [weakref.ref(m) for m in engine.model.modules()]
        alive += [weakref.ref(p) for p in engine.model.parameters()]
        engine.close()
        del engine
        assert [r for r in alive if r() is not None] == []
    finally:
        if was:
            gc.enable()
