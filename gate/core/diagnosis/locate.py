"""The localisation rule: compare the candidate's capture and the honest engine's with the
reference's, point by point in forward order, and name the first point whose error leaves
its honest band by more than the margin."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from gate.core.diagnosis.capture import Capture, Tensor, aligned
from gate.core.diagnosis.metric import MARGIN, band, point_errors, ratio
from gate.core.diagnosis.record import LayerError, PathFinding


@dataclass(frozen=True, slots=True)
class HonestPoint:
    """What the locating needs of the honest engine at one point: the positions it holds and
    its error there against the reference (the worst position's)."""

    positions: tuple[int, ...]
    error: float


@dataclass(frozen=True, slots=True)
class HonestBand:
    """The honest engine's errors against the reference on one path, point by point (module
    name -> HonestPoint): all of the honest capture that `compare_path` reads, small enough
    to keep (gate.workflows.diagnose.cache)."""

    path: str
    points: Mapping[str, HonestPoint]

    def to_dict(self) -> dict[str, Any]:
        # JSON has no infinity: a non-finite error is written as the string "inf".
        return {
            "path": self.path,
            "points": {
                m: {"positions": list(p.positions), "error": p.error if math.isfinite(p.error) else "inf"}
                for m, p in self.points.items()
            },
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HonestBand:
        return cls(
            str(data["path"]),
            {
                str(m): HonestPoint(tuple(int(i) for i in p["positions"]), float(p["error"]))
                for m, p in data["points"].items()
            },
        )


def honest_band(reference: Capture, honest: Capture) -> HonestBand:
    """The honest engine's error at each reference point it has with the reference's width."""
    by = honest.by_module()
    kept: list[tuple[str, Tensor]] = []
    rows: list[tuple[tuple[int, ...], np.ndarray, np.ndarray]] = []
    for ref in reference.tensors:
        hon = by.get(ref.point.module)
        if hon is None or hon.values.shape[1] != ref.values.shape[1]:
            continue
        kept.append((ref.point.module, hon))
        rows.append(aligned(ref, hon))
    points = {m: HonestPoint(hon.positions, e.error) for (m, hon), e in zip(kept, point_errors(rows), strict=True)}
    return HonestBand(honest.path, points)


def compare_path(
    reference: Capture, honest: Capture | HonestBand, candidate: Capture, *, margin: float = MARGIN
) -> PathFinding:
    """Each reference point that the candidate also has, in the reference's forward order.

    A point the honest engine lacks gets the band floor; a point the candidate lacks (a
    skipped layer's attention, say) is listed in `missing` and not compared: the layer's
    residual stream still is. Where the honest engine has the point, the candidate is judged
    at the positions it has too, so an error and its band are the worst of the same rows (a
    dump holds lm_head at every position, an engine's own prefill keeps the last). The first
    point past `margin` times its band is the finding.
    """
    if not (reference.path == honest.path == candidate.path):
        raise ValueError(f"paths differ: {reference.path}, {honest.path}, {candidate.path}")
    honest_by = (honest if isinstance(honest, HonestBand) else honest_band(reference, honest)).points
    cand_by = candidate.by_module()
    compared: list[tuple[Tensor, HonestPoint | None]] = []
    pairs: list[tuple[tuple[int, ...], np.ndarray, np.ndarray]] = []
    missing: list[str] = []
    for ref in reference.tensors:
        module = ref.point.module
        cand = cand_by.get(module)
        if cand is None or cand.values.shape[1] != ref.values.shape[1]:
            missing.append(module)
            continue
        hon = honest_by.get(module)
        if hon is not None:
            cand = within(cand, hon.positions)
        pair = aligned(ref, cand)
        if not pair[0]:
            missing.append(module)
            continue
        compared.append((ref, hon))
        pairs.append(pair)
    rows: list[LayerError] = []
    first: LayerError | None = None
    for (ref, hon), err in zip(compared, point_errors(pairs), strict=True):
        b = band(hon.error if hon is not None else 0.0)
        row = LayerError(
            layer=ref.point.layer,
            part=ref.point.part,
            module=ref.point.module,
            error=err.error,
            honest_band=b,
            ratio=ratio(err.error, b),
            position=err.position,
        )
        rows.append(row)
        if first is None and row.ratio > margin:
            first = row
    return PathFinding(path=reference.path, layers=tuple(rows), first=first, missing=tuple(missing))


def within(t: Tensor, positions: tuple[int, ...]) -> Tensor:
    """`t`'s rows at `positions` only (itself when it has no others)."""
    keep = set(positions)
    if all(p in keep for p in t.positions):
        return t
    rows = [i for i, p in enumerate(t.positions) if p in keep]
    return Tensor(t.point, tuple(t.positions[i] for i in rows), t.values[rows])
