"""The pure core of `gate diagnose` (numpy, no torch): the metric, the band, the localisation
rule, the record and its lines, and the three renderers."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from gate.core.diagnosis.capture import (
    Capture,
    Point,
    Tensor,
    aligned,
    capture_from_arrays,
    capture_to_arrays,
)
from gate.core.diagnosis.locate import compare_path
from gate.core.diagnosis.metric import (
    BAND_FLOOR,
    MARGIN,
    SHARED_CALL_VALUES,
    point_error,
    point_errors,
    relative_errors,
)
from gate.core.diagnosis.record import Diagnosis, PathFinding

RNG = np.random.default_rng(0)
POINTS = [
    Point(-1, "embedding", "model.embed_tokens"),
    Point(0, "attention", "model.layers.0.self_attn"),
    Point(0, "mlp", "model.layers.0.mlp"),
    Point(0, "residual", "model.layers.0"),
    Point(1, "attention", "model.layers.1.self_attn"),
    Point(1, "mlp", "model.layers.1.mlp"),
    Point(1, "residual", "model.layers.1"),
    Point(2, "final_norm", "model.norm"),
    Point(2, "lm_head", "lm_head"),
]
N = 12


def capture(noise: float, path: str = "decode", bug: tuple[str, int, float] | None = None, seed: int = 1) -> Capture:
    """Reference values plus relative noise; `bug` = (module, first position, relative size)
    from which point on (and downstream) the error grows."""
    base = np.random.default_rng(0)
    rng = np.random.default_rng(seed)
    tensors = []
    hit = False
    for p in POINTS:
        ref = base.standard_normal((N, 8)).astype(np.float32) * 3
        vals = ref + noise * rng.standard_normal(ref.shape).astype(np.float32) * 3 / np.sqrt(8)
        if bug is not None and (hit or p.module == bug[0]):
            hit = True
            vals[bug[1] :] += bug[2] * ref[bug[1] :]
        tensors.append(Tensor(p, tuple(range(N)), vals.astype(np.float32)))
    return Capture(path, N, tuple(tensors))


def test_relative_error_is_per_position_and_scale_free() -> None:
    ref = np.array([[1000.0, 0.0], [1.0, 0.0]], dtype=np.float32)
    other = np.array([[1000.0, 0.0], [1.1, 0.0]], dtype=np.float32)
    rel = relative_errors(ref, other)
    assert rel[0] == 0 and rel[1] == pytest.approx(0.1)
    # The huge first row does not hide the ordinary one: the worst position is position 1.
    e = point_error((5, 6), ref, other)
    assert e.position == 6 and e.error == pytest.approx(0.1)
    assert relative_errors(ref * 2, ref * 4)[0] == pytest.approx(1.0)  # a doubled output: cosine 1, error 1


def test_non_finite_and_zero_rows() -> None:
    ref = np.array([[1.0], [0.0], [0.0]], dtype=np.float32)
    other = np.array([[np.nan], [0.0], [1.0]], dtype=np.float32)
    assert list(relative_errors(ref, other)) == [math.inf, 0.0, math.inf]


def test_point_errors_in_one_call_per_width_are_each_points_own() -> None:
    """Every point of a width in one relative_errors call gives each point the error, position
    and count its own call gives, bit for bit: a non-finite row or a zero reference row in one
    point (the slow path for the whole width) changes no other point's numbers, a point with no
    positions is the empty error, and among equal worst rows the earliest is named."""
    rng = np.random.default_rng(7)

    def rows(n: int, width: int) -> tuple[np.ndarray, np.ndarray]:
        ref = rng.standard_normal((n, width)).astype(np.float32) * rng.uniform(0.1, 300)
        return ref, ref + rng.standard_normal((n, width)).astype(np.float32) * 1e-3

    points: list[tuple[tuple[int, ...], np.ndarray, np.ndarray]] = []
    for k in range(40):
        width = (8, 64, 97, 1024)[k % 4]
        n = 1 + k % 5
        ref, other = rows(n, width)
        points.append((tuple(range(10 + k, 10 + k + n)), ref, other))
    ref, other = rows(3, 64)
    other[1, 5] = np.nan
    points.append(((2, 3, 4), ref, other))  # a NaN in one point of width 64
    ref, other = rows(2, 8)
    ref[0] = 0.0
    points.append(((0, 1), ref, other))  # a zero reference row, unmatched: infinite
    points.append(((), np.zeros((0, 8), np.float32), np.zeros((0, 8), np.float32)))
    ref = np.ones((3, 97), np.float32)
    points.append(((4, 5, 6), ref, ref * 1.5))  # three equal worst rows: the first position
    got = point_errors(points)
    want = [point_error(*p) for p in points]
    assert [(g.error, g.position, g.positions) for g in got] == [(w.error, w.position, w.positions) for w in want]
    assert math.isinf(got[40].error) and got[40].position == 3 and math.isinf(got[41].error)
    assert (got[42].position, got[42].positions) == (-1, 0) and got[43].position == 4
    assert point_errors([]) == []


def test_only_small_points_share_a_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """Small points of a width are joined into one call; a point above SHARED_CALL_VALUES is
    never copied into a joined array (the default model's 69 x 576 rows a point, joined, made
    its comparison 5 times slower in fresh pages), and its numbers are still its own."""
    rng = np.random.default_rng(3)
    joined: list[int] = []
    real = np.concatenate

    def watched(arrays: Any, *args: Any, **kwargs: Any) -> Any:
        arrays = list(arrays)
        joined.extend(int(a.size) for a in arrays)
        return real(arrays, *args, **kwargs)

    monkeypatch.setattr(np, "concatenate", watched)

    def point(n: int, width: int) -> tuple[tuple[int, ...], np.ndarray, np.ndarray]:
        ref = rng.standard_normal((n, width)).astype(np.float32)
        return tuple(range(n)), ref, ref + rng.standard_normal((n, width)).astype(np.float32) * 1e-3

    big = [point(69, 576) for _ in range(4)]
    assert big[0][1].size > SHARED_CALL_VALUES
    got = point_errors(big)
    assert joined == [] and got == [point_error(*p) for p in big]
    small = [point(20, 32) for _ in range(4)]
    got = point_errors(small + big)
    assert joined and max(joined) <= SHARED_CALL_VALUES
    assert got == [point_error(*p) for p in small + big]


def test_honest_candidate_is_located_nowhere_and_a_bug_where_it_enters() -> None:
    ref, hon = capture(0.0), capture(0.01, seed=2)
    assert compare_path(ref, hon, capture(0.01, seed=3)).first is None
    f = compare_path(ref, hon, capture(0.01, bug=("model.layers.1.self_attn", 7, 0.3), seed=3))
    assert f.first is not None
    assert (f.first.layer, f.first.part) == (1, "attention") and f.first.position >= 7
    assert f.first.ratio > MARGIN
    # A bug just inside the margin is not located.
    small = compare_path(ref, hon, capture(0.0, bug=("model.layers.1.self_attn", 0, 0.008)))
    assert small.first is None


def test_band_floor_applies_where_the_honest_engine_is_exact() -> None:
    ref = capture(0.0)
    f = compare_path(ref, ref, capture(BAND_FLOOR * 0.5))
    assert f.first is None and all(e.honest_band == BAND_FLOOR for e in f.layers)
    f = compare_path(ref, ref, capture(0.0, bug=("model.embed_tokens", 0, 0.0625)))
    assert f.first is not None and (f.first.layer, f.first.part) == (-1, "embedding")


def test_a_point_the_candidate_lacks_is_missing_not_compared() -> None:
    ref = capture(0.0)
    cand = capture(0.0, bug=("model.layers.1.self_attn", 0, 1.0))
    cand = Capture(cand.path, N, tuple(t for t in cand.tensors if t.point.module != "model.layers.1.self_attn"))
    f = compare_path(ref, ref, cand)
    assert f.missing == ("model.layers.1.self_attn",)
    assert f.first is not None and (f.first.layer, f.first.part) == (1, "mlp")


def test_rows_align_by_position() -> None:
    a = Tensor(POINTS[0], (0, 1, 2), np.arange(6, dtype=np.float32).reshape(3, 2))
    b = Tensor(POINTS[0], (2,), np.array([[4.0, 5.0]], dtype=np.float32))
    pos, ra, rb = aligned(a, b)
    assert pos == (2,) and (ra == rb).all()


def test_paths_must_agree() -> None:
    with pytest.raises(ValueError, match="paths differ"):
        compare_path(capture(0.0, "decode"), capture(0.0, "prefill"), capture(0.0, "decode"))


def test_capture_round_trips_through_arrays() -> None:
    c = capture(0.01)
    back = capture_from_arrays(capture_to_arrays(c))
    assert back.path == c.path and [t.point for t in back.tensors] == POINTS
    assert all(
        (x.values == y.values).all() and x.positions == y.positions
        for x, y in zip(back.tensors, c.tensors, strict=True)
    )


def test_a_captures_arrays_are_seven_whatever_its_tensor_count() -> None:
    # One member per tensor made the diagnosis cache's write most of its cost.
    arrays = capture_to_arrays(capture(0.01))
    assert sorted(arrays) == sorted(["path", "context_length", "points", "rows", "widths", "positions", "values"])
    assert len(capture(0.01).tensors) > 1 and arrays["values"].ndim == 1


@pytest.mark.parametrize(
    "change",
    [
        lambda a: a.update(values=a["values"][:-1]),
        lambda a: a.update(positions=a["positions"][1:]),
        lambda a: a.update(rows=a["rows"][:-1]),
        lambda a: a.update(widths=-a["widths"]),
        lambda a: a.update(points=a["points"][:, :2]),
    ],
    ids=["a value short", "a position short", "a row count missing", "negative widths", "a point's field missing"],
)
def test_capture_arrays_that_do_not_add_up_are_refused(change: Any) -> None:
    arrays = capture_to_arrays(capture(0.01))
    change(arrays)
    with pytest.raises(ValueError, match="a capture's arrays"):
        capture_from_arrays(arrays)


def diagnosis(main: PathFinding, other: PathFinding | None) -> Diagnosis:
    return Diagnosis(
        prompt_id="p07",
        position=5,
        source="free_run",
        path="decode",
        finding=main,
        other=other,
        margin=MARGIN,
        metric="relative_l2",
        prompt_length=20,
        context_length=25,
        layer_count=2,
        divergence_class="defect",
        model="tiny",
    )


def test_record_schema_and_the_one_line() -> None:
    ref, hon = capture(0.0), capture(0.01, seed=2)
    bug = compare_path(ref, hon, capture(0.01, bug=("model.layers.1.self_attn", 7, 0.4), seed=3))
    clean = compare_path(capture(0.0, "prefill"), capture(0.01, "prefill", seed=2), capture(0.01, "prefill", seed=3))
    d = diagnosis(bug, clean)
    data = d.to_dict()
    assert data["gate_diagnosis"] == 1
    assert {k: data[k] for k in ("prompt_id", "position", "source", "path")} == {
        "prompt_id": "p07",
        "position": 5,
        "source": "free_run",
        "path": "decode",
    }
    assert (data["first_divergent_layer"], data["first_divergent_part"]) == (1, "attention")
    assert set(data["layers"][0]) >= {"layer", "part", "error", "honest_band", "ratio"}
    assert data["layers"][0]["layer"] == -1 and data["layers"][-1]["part"] == "lm_head"
    assert d.summary.startswith("enters at layer 1, attention, decode path: ")
    assert "× the honest band" in d.summary and "only the decode path shows it" in d.summary
    assert d.exit_code == 1
    none = diagnosis(clean, clean).to_dict()
    assert none["first_divergent_layer"] is None and none["first_divergent_part"] is None
    assert diagnosis(clean, clean).exit_code == 0
    assert "nothing leaves the honest band" in diagnosis(clean, clean).summary


def test_reports_render_what_the_record_says() -> None:
    from gate.reports import render

    ref, hon = capture(0.0), capture(0.01, seed=2)
    bug = compare_path(ref, hon, capture(0.01, bug=("model.embed_tokens", 3, 1.0), seed=3))
    d = diagnosis(bug, None)
    assert orjson.loads(render(d, "json"))["first_divergent_part"] == "embedding"
    text = render(d, "rich")
    assert "enters at the embedding, decode path" in text and "model.embed_tokens" in text
    page = render(d, "html")
    assert page.count("<svg") == 1 and "enters: the embedding" in page and "<script" not in page


def test_gate_runs_hint_names_the_first_defect_and_its_path(tmp_path: Path) -> None:
    from dataclasses import replace

    from helpers.trace_builders import mixed_result

    from gate.cli.diagnose import diagnose_hint
    from gate.core.verdict.result import DEFECT

    result = mixed_result(tmp_path)
    defects = [d for d in result.divergences if d.cls == DEFECT]
    assert result.verdict == "fail" and defects
    order = [p.id for p in result.prompts]
    first = min(defects, key=lambda d: (order.index(d.prompt_id), d.position))
    hint = diagnose_hint(result, model="m/x", engine="hf", engine_opts=["dtype=bfloat16"])
    assert hint is not None
    assert f"the first defect is prompt {first.prompt_id}, position {first.position}" in hint
    assert f"--engine-opt dtype=bfloat16 --prompt {first.prompt_id} --position {first.position}" in hint
    assert "--path" not in hint or first.forced_mode == "prefill"
    # A defect read from a prefill is diagnosed on the prefill path.
    moved = tuple(replace(d, source="forced", forced_mode="prefill") if d is first else d for d in result.divergences)
    hint = diagnose_hint(replace(result, divergences=moved), model="m/x", engine="vllm", engine_opts=None)
    assert hint is not None and hint.endswith("--path prefill")
    # A pass prints no hint.
    passing = replace(result, divergences=(), prompts=tuple(replace(p, strict=True) for p in result.prompts))
    assert diagnose_hint(passing, model="m/x", engine="hf", engine_opts=None) is None


def test_the_candidate_is_judged_at_the_rows_its_band_covers() -> None:
    """A dump holds lm_head at every position; the honest engine's own prefill keeps the
    last: the candidate's worst row must not be set against a band of one row."""
    import numpy as np

    from gate.core.diagnosis.capture import LM_HEAD, PREFILL, Capture, Point, Tensor
    from gate.core.diagnosis.locate import compare_path

    rng = np.random.default_rng(0)
    ref = rng.normal(size=(6, 16)).astype(np.float32)
    noisy = (ref * (1 + rng.normal(scale=1e-2, size=ref.shape))).astype(np.float32)
    noisy[:5] *= 2  # rows the band does not cover: not judged against it
    point = Point(2, LM_HEAD, "lm_head")
    reference = Capture(PREFILL, 6, (Tensor(point, tuple(range(6)), ref),))
    honest = Capture(PREFILL, 6, (Tensor(point, (5,), ref[5:] * np.float32(1 + 2**-7)),))
    candidate = Capture(PREFILL, 6, (Tensor(point, tuple(range(6)), noisy),))
    row = compare_path(reference, honest, candidate).layers[0]
    assert row.position == 5 and row.error < 0.05
