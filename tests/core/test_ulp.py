"""The ULP doctrine at the edges of the grid: a gap of exactly N steps of the dtype's grid at
the oracle's top logit is a near tie, a hair above it is a defect. Pure: no torch."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from gate.cli.main import app
from gate.core.traces.trace import PromptRecord, Trace, TraceHeader
from gate.core.verdict.adjudicate import compare
from gate.core.verdict.chain import classify, position_evidence
from gate.core.verdict.doctrine import Doctrine
from gate.core.verdict.grid import grid_step, logprob_slack
from gate.core.verdict.result import DEFECT, EXACT_TIE, NEAR_TIE
from gate.errors import InputError

# dtype -> stored mantissa bits (the step at |x| in [2**e, 2**(e+1)) is 2**(e - bits)).
BITS = {"bfloat16": 7, "float16": 10, "float32": 23}
BOUNDARIES = (2.0, 4.0, 8.0, 16.0, 32.0)


def just_below(boundary: float, dtype: str) -> float:
    """The largest number of `dtype` below a power of two."""
    return boundary - boundary / 2 ** (BITS[dtype] + 1)


def f32(x: float) -> float:
    return float(np.float32(x))


def next_f32_up(x: float) -> float:
    """The next float32 of larger magnitude (x < 0: more negative)."""
    return float(np.nextafter(np.float32(x), np.float32(-np.inf if x < 0 else np.inf)))


# --------------------------------------------------------------------------- the grid


@pytest.mark.parametrize("dtype", sorted(BITS))
@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_grid_step_at_and_below_powers_of_two(dtype: str, boundary: float) -> None:
    e = int(math.log2(boundary))
    # A power of two opens its binade; the number just below it is in the binade before.
    assert grid_step(boundary, dtype) == 2.0 ** (e - BITS[dtype])
    assert grid_step(-boundary, dtype) == 2.0 ** (e - BITS[dtype])
    assert grid_step(just_below(boundary, dtype), dtype) == 2.0 ** (e - 1 - BITS[dtype])
    # ... and just below the boundary is exactly one (smaller) step below it.
    assert boundary - just_below(boundary, dtype) == grid_step(just_below(boundary, dtype), dtype)


def test_grid_step_figures_from_the_issue() -> None:
    # bf16: 15.6 mnats at |logit| 2-4, 62.5 at 8-16, 125 at 16-32.
    assert grid_step(3.0) * 1000 == 15.625
    assert grid_step(9.5) * 1000 == 62.5
    assert grid_step(31.9) * 1000 == 125.0


def test_grid_step_below_the_normal_range() -> None:
    # Subnormals share one step: 2**-24 in float16, 2**-133 in bfloat16, 2**-149 in float32.
    assert grid_step(0.0, "float16") == 2.0**-24
    assert grid_step(1e-6, "float16") == 2.0**-24
    assert grid_step(2.0**-14, "float16") == 2.0**-24
    assert grid_step(2.0**-13, "float16") == 2.0**-23
    assert grid_step(0.0, "bfloat16") == 2.0**-133
    assert grid_step(0.0, "float32") == 2.0**-149


def test_grid_step_names_and_unknown_dtype() -> None:
    assert grid_step(16.0, "torch.bfloat16") == grid_step(16.0, "bf16") == 0.125
    assert grid_step(16.0, "half") == grid_step(16.0, "fp16") == 2.0**-6
    with pytest.raises(InputError, match="unknown dtype 'int8'"):
        grid_step(1.0, "int8")


# --------------------------------------------------------------------------- classify


def _classify(o_lp: float, c_lp: float, top_logit: float | None, doctrine: Doctrine, rival: int = 9) -> Any:
    top = [[5, o_lp], [rival, c_lp]] if o_lp > c_lp or rival > 5 else [[rival, c_lp], [5, o_lp]]
    evidence = position_evidence(
        prompt_id="p",
        position=0,
        source="free_run",
        top=top,
        oracle_token=5,
        candidate_token=rival,
        doctrine=doctrine,
        top_logit=top_logit,
    )
    return classify(evidence, doctrine)


@pytest.mark.parametrize("dtype", sorted(BITS))
@pytest.mark.parametrize("boundary", BOUNDARIES)
@pytest.mark.parametrize("below", [False, True], ids=["exactly", "just_below"])
@pytest.mark.parametrize("n", [1, 2, 4])
def test_exactly_n_steps_is_near_a_hair_above_is_defect(dtype: str, boundary: float, below: bool, n: int) -> None:
    top_logit = just_below(boundary, dtype) if below else boundary
    step = grid_step(top_logit, dtype)
    # No millinat allowance: the grid alone decides.
    doctrine = Doctrine(near_tie_mnats=0.0, near_tie_ulps=n, dtype=dtype)
    o_lp = -0.25
    c_lp = o_lp - n * step
    assert f32(c_lp) == c_lp  # both are float32 values, as engines write them
    d = _classify(o_lp, c_lp, top_logit, doctrine)
    assert d.cls == NEAR_TIE, (top_logit, step, d)
    assert d.gap_ulps == n
    assert d.ulp_mnats == 1000 * step
    assert d.to_dict()["gap_ulps"] == n and d.to_dict()["ulp_mnats"] == 1000 * step

    # A hair above: the next float32 past what float32 rounding of the logprobs allows.
    hair = next_f32_up(f32(o_lp - n * step - logprob_slack(o_lp, c_lp)))
    assert o_lp - hair > n * step + logprob_slack(o_lp, hair)
    d = _classify(o_lp, hair, top_logit, doctrine)
    assert d.cls == DEFECT, (top_logit, step, o_lp - hair, d)
    assert d.gap_ulps is not None and d.gap_ulps > n


@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_the_same_gap_judged_at_each_side_of_a_boundary(boundary: float) -> None:
    # One bf16 step at the boundary is two steps just below it.
    step = grid_step(boundary)
    doctrine = Doctrine(near_tie_mnats=0.0, near_tie_ulps=1)
    assert _classify(-0.5, -0.5 - step, boundary, doctrine).cls == NEAR_TIE
    below = _classify(-0.5, -0.5 - step, just_below(boundary, "bfloat16"), doctrine)
    assert below.cls == DEFECT
    assert below.gap_ulps == 2.0
    # A negative top logit is judged by its magnitude.
    assert _classify(-0.5, -0.5 - step, -boundary, doctrine).cls == NEAR_TIE


def test_grid_and_millinat_allowances_combine() -> None:
    # A gap is a near tie when either allowance holds.
    step = grid_step(20.0)  # 125 mnats
    assert _classify(-0.5, -0.5 - 2 * step, 20.0, Doctrine(near_tie_mnats=250.0)).cls == NEAR_TIE
    assert _classify(-0.5, -0.5 - 2 * step, 20.0, Doctrine(near_tie_mnats=5.0)).cls == DEFECT
    assert _classify(-0.5, -0.5 - 2 * step, 20.0, Doctrine(near_tie_mnats=5.0, near_tie_ulps=2)).cls == NEAR_TIE
    assert _classify(-0.5, -0.5 - 2 * step, 3.0, Doctrine(near_tie_mnats=5.0, near_tie_ulps=2)).cls == DEFECT


def test_without_a_logit_the_grid_allowance_does_not_apply() -> None:
    d = _classify(-0.5, -0.5 - 0.125, None, Doctrine(near_tie_mnats=5.0, near_tie_ulps=100))
    assert d.cls == DEFECT
    assert d.gap_ulps is None and d.ulp_mnats is None


def test_exact_tie_stays_exact_under_the_grid() -> None:
    d = _classify(-0.5, -0.5, 16.0, Doctrine(near_tie_mnats=0.0, near_tie_ulps=1), rival=3)
    assert d.cls == EXACT_TIE and d.gap_ulps == 0.0 and d.tie_break == "lower_id"


def _log_softmax_f32(logits: np.ndarray) -> np.ndarray:
    """log_softmax as engines compute it: in float32, x - max - log(sum(exp(x - max)))."""
    x = logits.astype(np.float32)
    shifted = x - x.max()
    return shifted - np.log(np.exp(shifted).sum(dtype=np.float32))


def test_a_one_step_gap_computed_in_float32_stays_a_near_tie() -> None:
    # Real logprobs carry float32 rounding: a gap of exactly one bf16 step between two bf16
    # logits often reads a float32 step more or less. The doctrine must still call it a
    # near tie, or `--near-tie-ulps 1` would fail honest one-step gaps at random.
    rng = np.random.default_rng(6)
    above = 0
    for _ in range(400):
        top = float(rng.choice([2.0, 3.5, 8.0, 12.25, 16.0, 24.5, 31.875]))
        step = grid_step(top)
        rest = rng.normal(0.0, 4.0, size=30)
        logits = np.concatenate([[top, top - step], np.minimum(rest, top - 2 * step)])
        lp = _log_softmax_f32(logits)
        o_lp, c_lp = float(lp[0]), float(lp[1])
        above += o_lp - c_lp > step
        d = _classify(o_lp, c_lp, top, Doctrine(near_tie_mnats=0.0, near_tie_ulps=1))
        assert d.cls == NEAR_TIE, (top, o_lp - c_lp, step)
    assert above > 0  # the rounding this test is about did happen


# --------------------------------------------------------------------------- compare and the CLI


def _traces(top_logit: float, gap_nats: float, dtype: str | None = "bfloat16") -> tuple[Trace, Trace]:
    extra = {"dtype": dtype} if dtype else {}
    oh = TraceHeader(role="oracle", model="m/x", top_k=2, engine={"name": "vllm", "version": "0"}, extra=extra)
    ch = TraceHeader(role="candidate", model="m/x", top_k=0, engine={"name": "hf", "version": "0"})
    o_lp = -0.25
    o = PromptRecord(
        id="p0",
        prompt_token_ids=(1, 2),
        token_ids=(5, 6),
        top_logprobs=[[[5, o_lp], [9, o_lp - gap_nats]], [[6, -0.1], [7, -3.0]]],
        extra={"token_logits": [top_logit, 10.0]},
    )
    c = PromptRecord(id="p0", prompt_token_ids=(1, 2), token_ids=(9, 6))
    return Trace(oh, (o,), "o.jsonl"), Trace(ch, (c,), "c.jsonl")


def test_compare_takes_the_grid_from_the_oracle_header() -> None:
    # 0.125 nats is one bf16 step at |logit| 16 but 8 float16 steps there.
    o, c = _traces(16.0, 0.125, "bfloat16")
    r = compare(o, c, Doctrine(near_tie_mnats=5.0, near_tie_ulps=1))
    assert r.verdict == "ratified_pass" and r.divergences[0].gap_ulps == 1.0
    assert r.doctrine.dtype == "bfloat16"
    o, c = _traces(16.0, 0.125, "float16")
    r = compare(o, c, Doctrine(near_tie_mnats=5.0, near_tie_ulps=1))
    assert r.verdict == "fail" and r.divergences[0].gap_ulps == 8.0
    assert r.doctrine.to_dict()["dtype"] == "float16"
    # A doctrine that names its dtype keeps it; a header without one means bfloat16.
    r = compare(o, c, Doctrine(near_tie_mnats=5.0, near_tie_ulps=1, dtype="bfloat16"))
    assert r.verdict == "ratified_pass"
    o, c = _traces(16.0, 0.125, None)
    assert compare(o, c, Doctrine(near_tie_mnats=5.0, near_tie_ulps=1)).doctrine.dtype == "bfloat16"


def test_compare_refuses_an_unknown_header_dtype_only_when_the_grid_is_used() -> None:
    o, c = _traces(16.0, 0.125, "auto")
    assert compare(o, c, Doctrine(near_tie_mnats=200.0)).verdict == "ratified_pass"
    with pytest.raises(InputError, match="unknown dtype 'auto'"):
        compare(o, c, Doctrine(near_tie_mnats=5.0, near_tie_ulps=1))


def _write(path: Path, trace: Trace) -> None:
    lines = [trace.header.to_dict(), *(r.to_dict() for r in trace.records)]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_compare_cli_reports_the_gap_in_mnats_and_steps(tmp_path: Path) -> None:
    o, c = _traces(24.0, 0.25)
    _write(tmp_path / "o.jsonl", o)
    _write(tmp_path / "c.jsonl", c)
    runner = CliRunner()
    files = [str(tmp_path / "o.jsonl"), str(tmp_path / "c.jsonl")]
    args = ["compare", *files, "--near-tie-mnats", "5", "--format", "json"]
    r = runner.invoke(app, [*args, "--near-tie-ulps", "2"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    div = report["divergences"][0]
    assert (div["class"], div["top2_gap_mnats"], div["gap_ulps"], div["ulp_mnats"]) == ("near_tie", 250.0, 2.0, 125.0)
    assert report["doctrine"] == {"near_tie_mnats": 5.0, "strict": False, "near_tie_ulps": 2.0, "dtype": "bfloat16"}
    r = runner.invoke(app, [*args, "--near-tie-ulps", "1"])
    assert r.exit_code == 1, r.output
    assert json.loads(r.stdout)["divergences"][0]["class"] == "defect"
