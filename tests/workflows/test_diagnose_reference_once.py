"""The diagnosis captures its float32 reference once, by one prefill over the context with every
position's logits, and lets it stand for both paths. That holds only while float32's own decode
path stays far under the band's floor: measured here on a tiny Llama at every point and position
(slow: loads a model)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gate.core.diagnosis.capture import aligned
from gate.core.diagnosis.metric import BAND_FLOOR, relative_errors

pytestmark = pytest.mark.slow

PROMPT = tuple(range(40, 60))
CONTEXT = PROMPT + tuple(range(90, 102))


def test_float32_decode_path_stays_far_under_the_band_floor_of_its_prefill(llama_path: Path) -> None:
    from helpers.tiny_pin import one_thread

    from gate.engines.hf.capture import capture_hf
    from gate.engines.hf.engine import HFEngine

    with one_thread():
        ref = HFEngine(str(llama_path), dtype="float32")
        once = capture_hf(ref, PROMPT, CONTEXT, "prefill", logits_from=0)
        decode = capture_hf(ref, PROMPT, CONTEXT, "decode")
    by = once.by_module()
    assert by["lm_head"].positions == tuple(range(len(CONTEXT)))  # every position's logits
    worst = 0.0
    for t in decode.tensors:
        positions, a, b = aligned(t, by[t.point.module])
        assert positions == t.positions  # the prefill capture has every row the decode path has
        worst = max(worst, float(relative_errors(b, a).max()))
    assert 0.0 <= worst < BAND_FLOOR / 100, worst
