"""The honest engine's two paths from one prefill (gate.engines.hf.capture.capture_hf_shared):
the decode path's rows before its steps are the prefill's, its steps run through the
prefill's KV cache cropped to the decode path's prompt. It must hold what the engine's own
decode path holds (the same points, the same positions: lm_head only at the prefill's last
row and at each step), with values within honest rounding of it, at one forward fewer; a
cache that cannot be cropped exactly gets the decode path's own prefill."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gate.core.diagnosis.capture import DECODE, LM_HEAD, PREFILL
from gate.core.diagnosis.metric import relative_errors

PROMPT = (3, 17, 42, 8, 99, 5)
CONTEXT = (*PROMPT, 11, 23, 61, 7, 30)


@pytest.fixture(scope="module")
def threads() -> Iterator[None]:
    from helpers.tiny_pin import one_thread

    with one_thread():
        yield


def engine(folder: Path, dtype: str) -> Any:
    from gate.engines.hf.engine import HFEngine

    return HFEngine(str(folder), tokenizer=False, dtype=dtype)


def forwards(eng: Any) -> list[int]:
    """Counts the model's forwards (as many as its calls) into the returned list."""
    calls: list[int] = []
    eng.model.register_forward_pre_hook(lambda *_: calls.append(1))
    return calls


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("before", [len(CONTEXT) - 1, len(PROMPT), len(CONTEXT)])
def test_the_shared_paths_hold_what_the_engines_own_paths_hold(
    tiny_models_dir: Path, threads: None, dtype: str, before: int
) -> None:
    from helpers.tiny_models import build_tiny_llama

    from gate.engines.hf.capture import capture_hf, capture_hf_shared

    folder = build_tiny_llama(tiny_models_dir / "shared-llama", seed=5, lm_head_scale=20.0)
    eng = engine(folder, dtype)
    decode_ids = CONTEXT[:before]
    calls = forwards(eng)
    shared = capture_hf_shared(eng, decode_ids, CONTEXT)
    assert len(calls) == 1 + len(CONTEXT) - before  # one prefill, then the steps: no second prefill
    own = {
        PREFILL: capture_hf(eng, PROMPT, CONTEXT, PREFILL, logits_from=0),
        DECODE: capture_hf(eng, decode_ids, CONTEXT, DECODE),
    }
    # The prefill path is the same forward: bit for bit.
    for a, b in zip(shared[PREFILL].tensors, own[PREFILL].tensors, strict=True):
        assert a.point == b.point and a.positions == b.positions and (a.values == b.values).all()
    tolerance = 2.0**-5 if dtype == "bfloat16" else 1e-5
    for a, b in zip(shared[DECODE].tensors, own[DECODE].tensors, strict=True):
        assert a.point == b.point and a.positions == b.positions, a.point.module
        assert relative_errors(b.values, a.values).max() <= tolerance, a.point.module
        if a.point.part == LM_HEAD:
            assert a.positions == tuple(range(before - 1, len(CONTEXT)))
    assert shared[DECODE].path == DECODE and shared[DECODE].context_length == len(CONTEXT)


def test_a_cache_that_cannot_be_cropped_gets_the_decode_paths_own_prefill(tiny_models_dir: Path, threads: None) -> None:
    """Gated DeltaNet layers keep a recurrent state, not one row per position: cropping it
    would not give the state after the decode path's prompt."""
    from helpers.tiny_models import build_tiny_qwen3_5_moe

    from gate.engines.hf.capture import capture_hf, capture_hf_shared

    folder = build_tiny_qwen3_5_moe(tiny_models_dir / "shared-qwen35", seed=5)
    eng = engine(folder, "bfloat16")
    decode_ids = CONTEXT[:-1]
    calls = forwards(eng)
    shared = capture_hf_shared(eng, decode_ids, CONTEXT)
    assert len(calls) == 3  # the prefill over the context, the decode path's own prefill, its step
    own = capture_hf(eng, decode_ids, CONTEXT, DECODE)
    for a, b in zip(shared[DECODE].tensors, own.tensors, strict=True):
        assert a.point == b.point and a.positions == b.positions and (a.values == b.values).all()


def test_the_decode_paths_prompt_must_begin_the_context(tiny_models_dir: Path, threads: None) -> None:
    from helpers.tiny_models import build_tiny_llama

    from gate.engines.hf.capture import capture_hf_shared
    from gate.errors import InputError

    eng = engine(build_tiny_llama(tiny_models_dir / "shared-llama", seed=5, lm_head_scale=20.0), "float32")
    with pytest.raises(InputError):
        capture_hf_shared(eng, (1, 2), CONTEXT)
    with pytest.raises(InputError):
        capture_hf_shared(eng, (), CONTEXT)
