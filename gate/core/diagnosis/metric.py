"""The error of a capture point against the reference, and how far honest noise may take it.

The metric is the relative L2 error of each position's vector, ||candidate - reference|| /
||reference||, and a point's error is its worst position over the whole context. Why:
- relative, so that one number means the same at the embedding (norms near 1), in the
  residual stream (norms in the hundreds at a massive-activation position) and at lm_head;
- per position before the maximum, so that a position with a huge norm (the first token's
  residual stream often has one) cannot hide an error at an ordinary one, and a bug that
  enters at an early position and reaches the diagnosed one through attention is seen where
  it enters;
- not 1 - cosine, which is blind to scale: a norm weight off by a factor, or an MLP output
  doubled, leaves the cosine at 1;
- not NMSE (its square), so that a ratio to the band reads linearly: a bug twice as large
  is twice as far out.

The honest band of a point is the error the honest engine (the same weights in the
candidate's working dtype, e.g. transformers bfloat16) makes at that point against the
reference (transformers float32), never narrower than BAND_FLOOR: where the honest engine
is exact (a bf16 embedding lookup read back in float32 is), one rounding to bfloat16 is
still honest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

METRIC = "relative_l2"
METRIC_TEXT = "relative L2 error per position (||candidate - reference|| / ||reference||), worst position"
# bfloat16's unit roundoff, 2^-8: one rounding of a value to bfloat16 moves it by up to this
# fraction; the band is never narrower.
BAND_FLOOR = 2.0**-8
# How far past its honest band a point's error must be before it is located there, measured
# on honest variants (ISA paths, thread counts, eager vs sdpa attention) against the
# in-process band: docs/results/diagnose-margin.md, scripts/diagnose_margin.py. The largest honest ratio
# measured on the default model is 2.81 (lm_head, prefill, ATEN_CPU_CAPABILITY=default);
# 4 leaves room above it while the planted bugs of the tests sit at 11x and beyond.
MARGIN = 4.0


@dataclass(frozen=True, slots=True)
class PointError:
    """One point's error: its worst position's relative error, that position, and how many
    positions were compared."""

    error: float
    position: int
    positions: int


def relative_errors(reference: np.ndarray, other: np.ndarray) -> np.ndarray:
    """Per row: ||other - reference|| / ||reference||, the sums of squares in float64; a row
    with a non-finite value is infinitely wrong; a zero reference row is 0 when matched, else
    infinite. One pass over float32 rows (a float32 difference is exact to its own rounding,
    far below any band), no float64 copy of the arrays."""
    ref = np.asarray(reference, dtype=np.float32)
    oth = np.asarray(other, dtype=np.float32)
    d = oth - ref
    diff2 = np.einsum("ij,ij->i", d, d, dtype=np.float64)
    scale2 = np.einsum("ij,ij->i", ref, ref, dtype=np.float64)
    # Every row finite and every reference row nonzero (a capture's usual rows): the same
    # numbers as below in fewer numpy calls (a diagnosis computes this some 240 times).
    if np.isfinite(diff2).all() and np.isfinite(scale2).all() and (scale2 > 0).all():
        return np.sqrt(diff2) / np.sqrt(scale2)
    ok = np.isfinite(oth)
    finite = ok.all(axis=1)
    if not finite.all():  # the non-finite values out of the sums (those rows are infinite below)
        d = np.where(ok, oth, np.float32(0.0)) - ref
        diff2 = np.einsum("ij,ij->i", d, d, dtype=np.float64)
    diff, scale = np.sqrt(diff2), np.sqrt(scale2)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(scale > 0, diff / np.where(scale > 0, scale, 1.0), np.where(diff > 0, np.inf, 0.0))
    return np.where(finite, rel, np.inf)


def point_error(positions: tuple[int, ...], reference: np.ndarray, other: np.ndarray) -> PointError:
    """The worst position's relative error (the earliest among equal worst)."""
    if not positions:
        return PointError(0.0, -1, 0)
    return _worst(positions, relative_errors(reference, other))


def _worst(positions: tuple[int, ...], rel: np.ndarray) -> PointError:
    """The worst of a point's relative errors (one per position), the earliest among equal worst."""
    i = int(np.argmax(rel))
    return PointError(float(rel[i]), positions[i], len(positions))


# Points of at most this many values share a relative_errors call with the others of their
# width; a larger point has its own (joining the default model's points, 69 rows of 576 each,
# made 19 MB of fresh arrays a path: its comparison 31 ms to 172 ms).
SHARED_CALL_VALUES = 1 << 14


def point_errors(points: Sequence[tuple[tuple[int, ...], np.ndarray, np.ndarray]]) -> list[PointError]:
    """`point_error` of each (positions, reference rows, other rows): the small points of one
    width (SHARED_CALL_VALUES) in one `relative_errors` call, as the tiny Qwen3.6's 60-odd
    points of a path were as many calls, twice per path in a diagnosis; its numbers are row
    by row, so each point's are the ones its own call gives."""
    out: list[PointError] = [PointError(0.0, -1, 0)] * len(points)
    calls: dict[tuple[int, int], list[int]] = {}  # (width, the point's index if alone else -1) -> points
    for k, (positions, reference, _) in enumerate(points):
        if positions:
            alone = reference.size > SHARED_CALL_VALUES
            calls.setdefault((int(reference.shape[-1]), k if alone else -1), []).append(k)
    for ks in calls.values():
        if len(ks) == 1:
            rel = relative_errors(points[ks[0]][1], points[ks[0]][2])
        else:
            reference = np.concatenate([points[k][1] for k in ks])
            rel = relative_errors(reference, np.concatenate([points[k][2] for k in ks]))
        at = 0
        for k in ks:
            positions = points[k][0]
            out[k] = _worst(positions, rel[at : at + len(positions)])
            at += len(positions)
    return out


def band(honest_error: float) -> float:
    return max(honest_error, BAND_FLOOR)


def ratio(error: float, honest_band: float) -> float:
    return float("inf") if not np.isfinite(error) else error / honest_band
