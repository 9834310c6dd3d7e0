"""The honest band taken once from the honest engine's capture (`honest_band`) locates exactly
what the capture itself does, and survives its JSON round trip (the diagnosis cache keeps it)."""

from __future__ import annotations

import math

import numpy as np
import orjson
import pytest
from test_diagnosis_metric_and_rule import capture

from gate.core.diagnosis.capture import Capture, Tensor
from gate.core.diagnosis.locate import HonestBand, HonestPoint, compare_path, honest_band


def fewer_rows(c: Capture, module: str, keep: int) -> Capture:
    """`c` with `module` holding only its last `keep` rows (lm_head under logits_to_keep=1)."""
    out = []
    for t in c.tensors:
        if t.point.module == module:
            t = Tensor(t.point, t.positions[-keep:], t.values[-keep:])
        out.append(t)
    return Capture(c.path, c.context_length, tuple(out))


@pytest.mark.parametrize(
    "candidate",
    [
        capture(0.001, seed=2),
        capture(0.001, seed=3, bug=("model.layers.1.self_attn", 5, 0.5)),
        capture(0.001, seed=4, bug=("lm_head", 11, 0.5)),
    ],
)
def test_the_band_locates_what_the_honest_capture_does(candidate: Capture) -> None:
    reference = capture(0.0)
    honest = fewer_rows(capture(0.001, seed=9), "lm_head", 1)
    band = honest_band(reference, honest)
    assert band.points["lm_head"].positions == (11,)
    assert compare_path(reference, band, candidate) == compare_path(reference, honest, candidate)
    back = HonestBand.from_dict(orjson.loads(orjson.dumps(band.to_dict())))
    assert back == band
    assert compare_path(reference, back, candidate) == compare_path(reference, honest, candidate)


def test_an_infinite_honest_error_round_trips() -> None:
    band = HonestBand("decode", {"m": HonestPoint((0, 1), math.inf), "n": HonestPoint((1,), 0.25)})
    back = HonestBand.from_dict(orjson.loads(orjson.dumps(band.to_dict())))
    assert back == band and np.isinf(back.points["m"].error)


def test_a_band_of_another_path_is_refused() -> None:
    reference = capture(0.0)
    band = honest_band(reference, capture(0.001, seed=9))
    with pytest.raises(ValueError, match="paths differ"):
        compare_path(capture(0.0, path="prefill"), band, capture(0.001, path="prefill"))
