"""The honest engine's two paths from one prefill (gate.engines.hf.capture.capture_hf_shared):
the decode path's rows before its steps are the prefill's, its steps run through the
prefill's KV cache cropped to the decode path's prompt. It must hold what the engine's own
decode path holds (the same points, the same positions: lm_head only at the prefill's last
row and at each step), with values within honest rounding of it, at one forward fewer; a
model with recurrent layers prefills the decode path's prompt, not the context."""

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


def forward_lengths(eng: Any) -> list[int]:
    """Each model forward's token count, into the returned list."""
    lengths: list[int] = []

    def hook(_module: Any, _args: Any, kwargs: dict[str, Any]) -> None:
        lengths.append(int(kwargs["input_ids"].shape[1]))

    eng.model.register_forward_pre_hook(hook, with_kwargs=True)
    return lengths


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
    lengths = forward_lengths(eng)
    shared = capture_hf_shared(eng, decode_ids, CONTEXT)
    assert len(lengths) == 1 + len(CONTEXT) - before  # one prefill, then the steps: no second prefill
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


@pytest.mark.parametrize("before", [len(CONTEXT) - 1, len(PROMPT), len(CONTEXT)])
def test_a_recurrent_model_prefills_the_decode_paths_prompt_once_and_chunks_the_rest(
    tiny_models_dir: Path, threads: None, before: int
) -> None:
    """Gated DeltaNet layers keep a recurrent state, not one row per position: no crop of a
    prefill over the context gives the state after the decode path's prompt. So the one
    prefill is the decode path's own (bit for bit, its steps through its cache), and the
    prefill path's rows after it come from a chunked forward through a copy of that cache:
    within honest rounding of the engine's own prefill over the context, at the same points
    and positions. A lone rest token goes with a copy of itself (a one-token forward through
    a cache takes the decode kernels), whose rows are not kept."""
    from helpers.tiny_models import build_tiny_qwen3_5_moe

    from gate.engines.hf.capture import capture_hf, capture_hf_shared

    folder = build_tiny_qwen3_5_moe(tiny_models_dir / "shared-qwen35", seed=5)
    eng = engine(folder, "bfloat16")
    decode_ids = CONTEXT[:before]
    lengths = forward_lengths(eng)
    shared = capture_hf_shared(eng, decode_ids, CONTEXT, logits_from=before - 1)
    rest = len(CONTEXT) - before
    chunked = [] if rest == 0 else [max(rest, 2)]
    assert lengths == [before, *chunked, *[1] * rest]  # no prefill over the whole context
    own_decode = capture_hf(eng, decode_ids, CONTEXT, DECODE)
    for a, b in zip(shared[DECODE].tensors, own_decode.tensors, strict=True):
        assert a.point == b.point and a.positions == b.positions and (a.values == b.values).all()
    own_prefill = capture_hf(eng, PROMPT, CONTEXT, PREFILL, logits_from=before - 1)
    assert [t.point for t in shared[PREFILL].tensors] == [t.point for t in own_prefill.tensors]
    for a, b in zip(shared[PREFILL].tensors, own_prefill.tensors, strict=True):
        assert a.positions == b.positions, a.point.module
        first = before - 1 if a.point.part == LM_HEAD else 0
        assert a.positions == tuple(range(first, len(CONTEXT))), a.point.module
        assert relative_errors(b.values, a.values).max() <= 2.0**-5, a.point.module
    assert shared[PREFILL].path == PREFILL and shared[PREFILL].context_length == len(CONTEXT)


def test_the_decode_paths_prompt_must_begin_the_context(tiny_models_dir: Path, threads: None) -> None:
    from helpers.tiny_models import build_tiny_llama

    from gate.engines.hf.capture import capture_hf_shared
    from gate.errors import InputError

    eng = engine(build_tiny_llama(tiny_models_dir / "shared-llama", seed=5, lm_head_scale=20.0), "float32")
    with pytest.raises(InputError):
        capture_hf_shared(eng, (1, 2), CONTEXT)
    with pytest.raises(InputError):
        capture_hf_shared(eng, (), CONTEXT)
