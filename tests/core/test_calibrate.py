"""Calibration from two traces: drift figures, top-2 gaps, the recommended doctrine.

The core tests build traces in memory (no torch); the slow test at the end calibrates the
HF engine against the embedded default's pin through `gate calibrate`.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from gate.cli.main import app, main
from gate.core.calibration.calibrate import attach_calibration, calibrate
from gate.core.calibration.recommend import Pairs, contender_bound, recommend
from gate.core.calibration.stats import CALIBRATION_META_KEY, Distribution, Histogram
from gate.core.traces.trace import PromptRecord, Trace, TraceHeader, write_trace
from gate.core.verdict.adjudicate import compare
from gate.errors import InputError

Top = list[list[Any]]


def _sorted(pairs: dict[int, float]) -> Top:
    return [[t, lp] for t, lp in sorted(pairs.items(), key=lambda kv: (-kv[1], kv[0]))]


def _oracle(
    prompts: Sequence[tuple[str, Sequence[dict[int, float]]]], logits: bool | Sequence[float] = False, **hdr: Any
) -> Trace:
    """An oracle trace; `logits=True` records a top logit of 20 (bf16 step 125 mnats) everywhere."""
    records = []
    for pid, positions in prompts:
        tops = [_sorted(p) for p in positions]
        values = [20.0] * len(tops) if logits is True else list(logits) if logits else None
        extra = {"token_logits": values} if values is not None else {}
        records.append(
            PromptRecord(
                id=pid,
                prompt_token_ids=(1, 2, 3),
                token_ids=tuple(int(t[0][0]) for t in tops),
                top_logprobs=tops,
                extra=extra,
            )
        )
    header = TraceHeader(role="oracle", model="m/x", top_k=4, engine={"name": "vllm", "version": "0"}, extra=hdr)
    return Trace(header, tuple(records), "oracle.jsonl")


def _candidate(
    prompts: Sequence[tuple[str, Sequence[dict[int, float]]]],
    tokens: dict[str, Sequence[int]] | None = None,
    forced: dict[str, Sequence[int]] | None = None,
) -> Trace:
    records = []
    for pid, positions in prompts:
        tops = [_sorted(p) for p in positions]
        ids = tuple(tokens[pid]) if tokens and pid in tokens else tuple(int(t[0][0]) for t in tops)
        records.append(
            PromptRecord(
                id=pid,
                prompt_token_ids=(1, 2, 3),
                token_ids=ids,
                top_logprobs=tops if len(tops) == len(ids) else None,
                forced_token_ids=tuple(forced[pid]) if forced and pid in forced else None,
            )
        )
    header = TraceHeader(role="candidate", model="m/x", top_k=4, engine={"name": "hf", "version": "0"})
    return Trace(header, tuple(records), "candidate.jsonl")


POS_A = {10: -0.25, 11: -1.5, 12: -2.0, 13: -4.0}
POS_B = {20: -0.125, 21: -2.5, 22: -3.0, 23: -3.5}
POS_TIE = {30: -0.6875, 31: -0.6875, 32: -3.0, 33: -5.0}


def test_an_identical_candidate_has_no_drift_and_calls_for_exact_ties_only() -> None:
    prompts = [("p0", [POS_A, POS_B]), ("p1", [POS_B, POS_TIE])]
    cal = calibrate(_oracle(prompts), _candidate(prompts))
    assert cal.positions == cal.positions_matched == 4
    for dist in (cal.chosen_abs_delta, cal.shared_abs_delta, cal.gap_drift, cal.kl):
        assert dist.max == 0.0
    assert cal.shared_abs_delta.count == 16 and cal.gap_drift.count == 12
    assert cal.top1_agreement == 1.0
    assert cal.recommendation.near_tie_mnats == 0.0
    assert cal.verdicts is not None and cal.verdicts.recommended == "strict_pass"


def test_a_shift_of_the_normaliser_is_token_drift_but_no_gap_drift() -> None:
    # Every candidate logprob 30 mnats lower: each token drifts, no gap moves, nothing can flip.
    prompts = [("p0", [POS_A, POS_B])]
    shifted = [("p0", [{t: lp - 0.03125 for t, lp in POS_A.items()}, {t: lp - 0.03125 for t, lp in POS_B.items()}])]
    cal = calibrate(_oracle(prompts), _candidate(shifted))
    assert cal.chosen_abs_delta.max == cal.chosen_abs_delta.median == 31.25
    assert cal.shared_abs_delta.max == 31.25
    assert cal.gap_drift.max == 0.0
    assert cal.kl.max == pytest.approx(0.0, abs=1e-9)
    assert cal.recommendation.near_tie_mnats == 0.0


def test_gap_drift_measures_how_far_the_gap_to_each_rival_moved() -> None:
    prompts = [("p0", [POS_A])]
    cand = dict(POS_A)
    cand[11] += 0.0625  # the runner-up 62.5 mnats closer
    cand[13] -= 0.125  # the last one 125 mnats further
    cal = calibrate(_oracle(prompts), _candidate([("p0", [cand])]))
    assert cal.gap_drift.count == 3
    assert cal.gap_drift.max == 125.0
    assert cal.gap_drift.median == 62.5
    assert cal.chosen_abs_delta.max == 0.0


def test_only_rivals_near_enough_to_flip_set_the_threshold() -> None:
    # The runner-up (gap 100) moved by 150: near enough to be overturned. A rival 2.5 nats
    # down moved by a full nat, but no drift seen could overturn a gap that wide.
    o = {1: -0.5, 2: -0.6, 3: -3.0}
    c = {1: -0.5, 2: -0.75, 3: -2.0}
    cal = calibrate(_oracle([("p0", [o])]), _candidate([("p0", [c])]))
    assert cal.gap_drift.max == pytest.approx(1000.0)
    rec = cal.recommendation
    assert rec.contender_bound_mnats == pytest.approx(150.0) and rec.contender_pairs == 1
    assert cal.contender_gap_drift.max == pytest.approx(150.0)
    assert rec.near_tie_mnats == 150.0 and rec.near_tie_ulps is None
    assert rec.flags == "--near-tie-mnats 150"
    assert rec.confidence == "low"
    assert any("moved more (at most 1000.0 mnats) but never by more than their own gap" in r for r in rec.reasons)


def test_contender_bound_is_the_fixed_point_from_above() -> None:
    gaps = np.array([100.0, 300.0, 900.0, 5000.0])
    drifts = np.array([20.0, 250.0, 400.0, 800.0])
    # 800 -> rivals within 800 drift at most 250 -> within 250 at most 20 -> within 20: none.
    assert contender_bound(gaps, drifts) == 0.0
    gaps = np.array([100.0, 200.0, 900.0, 5000.0])
    drifts = np.array([20.0, 250.0, 400.0, 800.0])
    # 800 -> 250 -> within 250 the 200-gap rival drifted 250 (it could flip): stays 250.
    assert contender_bound(gaps, drifts) == 250.0
    assert contender_bound(np.array([]), np.array([])) == 0.0


def test_kl_over_the_shared_support_is_renormalised() -> None:
    o = {1: math.log(0.5), 2: math.log(0.25), 3: math.log(0.125)}
    c = {1: math.log(0.25), 2: math.log(0.25), 4: math.log(0.25)}
    prompts_o = [("p0", [o])]
    cal = calibrate(_oracle(prompts_o), _candidate([("p0", [c])]))
    # Shared {1, 2}: P = (2/3, 1/3), Q = (1/2, 1/2).
    p = np.array([2 / 3, 1 / 3])
    q = np.array([0.5, 0.5])
    assert cal.kl.max == pytest.approx(1000 * float(np.sum(p * np.log(p / q))), rel=1e-12)
    assert cal.shared_support.max == 2.0
    assert cal.shared_mass.max == pytest.approx(0.75)


def test_only_positions_with_the_oracles_context_are_measured() -> None:
    # The candidate leaves the oracle's path at position 1: position 2 has the same token
    # but another context, so its (wildly different) logprobs are not drift.
    o_pos = [POS_A, POS_B, POS_A]
    c_pos = [POS_A, {21: -0.1, 20: -2.0, 22: -3.0, 23: -3.5}, {10: -3.0, 11: -0.01, 12: -9.0, 13: -9.5}]
    cal = calibrate(_oracle([("p0", o_pos)]), _candidate([("p0", c_pos)], tokens={"p0": [10, 21, 10]}))
    assert cal.positions == 3 and cal.positions_matched == 1
    assert cal.gap_drift.max == 0.0
    # Top-1 agreement without forced data: the prefix and the first divergence.
    assert (cal.top1_compared, cal.top1_agreed, cal.top1_source) == (2, 1, "free_run")


def test_top1_agreement_uses_forced_data_where_there_is_some() -> None:
    o_pos = [POS_A, POS_B, POS_A]
    c_pos = [POS_A, {21: -0.1, 20: -2.0, 22: -3.0, 23: -3.5}, POS_A]
    cand = _candidate([("p0", c_pos)], tokens={"p0": [10, 21, 10]}, forced={"p0": [10, 21, 10]})
    cal = calibrate(_oracle([("p0", o_pos)]), cand)
    assert (cal.top1_compared, cal.top1_agreed, cal.top1_source) == (3, 2, "forced")


def test_the_oracles_top2_gaps_in_mnats_and_grid_steps() -> None:
    # Top logit 20 (bf16 step 125 mnats): gaps 0, 125, 250, 500, 1250 mnats.
    positions = [
        {1: -0.5, 2: -0.5},
        {1: -0.5, 2: -0.625},
        {1: -0.5, 2: -0.75},
        {1: -0.5, 2: -1.0},
        {1: -0.25, 2: -1.5},
    ]
    oracle = _oracle([("p0", positions)], logits=True, dtype="bfloat16")
    gaps = calibrate(oracle, _candidate([("p0", positions)])).top_gaps
    assert (gaps.positions, gaps.exact_ties, gaps.smallest_positive_mnats) == (5, 1, 125.0)
    assert gaps.within_steps == {1: 1, 2: 2, 4: 3}
    assert gaps.positions_with_logits == 5
    assert gaps.histogram.zero == 1 and sum(gaps.histogram.counts) == 5
    # float16's grid is 8 times finer at 20: only exact ties are within 4 of its steps.
    oracle16 = _oracle([("p0", positions)], logits=True, dtype="float16")
    assert calibrate(oracle16, _candidate([("p0", positions)])).top_gaps.within_steps == {1: 0, 2: 0, 4: 0}
    # Without raw logits there are no grid figures.
    plain = calibrate(_oracle([("p0", positions)]), _candidate([("p0", positions)]))
    assert plain.top_gaps.within_steps is None
    assert plain.recommendation.near_tie_ulps is None
    assert any("no raw logits" in n for n in plain.notes)


# Position 0 at a top logit of 20 (step 125 mnats): the runner-up, one step down, moves
# 1.5 steps. Position 1 at a top logit of 3 (step 15.625): a 100-mnat gap, 6.4 steps.
GRID_O = [{1: -0.5, 2: -0.625, 3: -2.0}, {1: -0.5, 2: -0.6, 3: -2.0}]
GRID_C = [{1: -0.5, 2: -0.8125, 3: -2.0}, {1: -0.5, 2: -0.6, 3: -2.0}]


def test_the_grid_allowance_is_recommended_when_it_sees_more() -> None:
    cal = calibrate(_oracle([("p0", GRID_O)], logits=[20.0, 3.0]), _candidate([("p0", GRID_C)]))
    assert cal.gap_drift_ulps.max == 1.5  # 187.5 mnats at a 125-mnat step
    rec = cal.recommendation
    # 190 mnats would put both positions inside the allowance; 2 steps only the first.
    assert (rec.near_tie_mnats, rec.near_tie_ulps) == (0.0, 2.0)
    assert rec.flags == "--near-tie-mnats 0 --near-tie-ulps 2"
    assert rec.doctrine.near_tie_ulps == 2.0
    assert any("--near-tie-ulps 2 would ratify the same flips, with 1 positions" in r for r in rec.reasons)
    assert any("set one allowance, not both" in r for r in rec.reasons)


def test_the_fixed_threshold_stays_when_the_grid_sees_less() -> None:
    # At a top logit of 20 everywhere, 2 steps is 250 mnats: wider than 190.
    cal = calibrate(_oracle([("p0", GRID_O)], logits=True), _candidate([("p0", GRID_C)]))
    rec = cal.recommendation
    assert (rec.near_tie_mnats, rec.near_tie_ulps) == (190.0, None)
    assert any("the fixed threshold stays the recommendation" in r for r in rec.reasons)


def test_the_recommended_doctrine_ratifies_the_honest_flip_the_default_fails() -> None:
    # The candidate drifts by 150 mnats on one gap (over the default 125) and flips there.
    o_pos = [{1: -0.5, 2: -0.6}, {1: -0.5, 2: -3.0}]
    c_pos = [{1: -0.5, 2: -0.65}, {1: -0.5, 2: -2.85}]
    o_pos2 = [{1: -0.6, 2: -0.7}]
    c_pos2 = [{2: -0.55, 1: -0.6}]
    oracle = _oracle([("p0", o_pos), ("p1", o_pos2)])
    cand = _candidate([("p0", c_pos), ("p1", c_pos2)], tokens={"p1": [2]})
    cal = calibrate(oracle, cand)
    assert cal.gap_drift.max == pytest.approx(150.0)
    # No rival drifted past its gap; the candidate's own flip at a 100-mnat gap sets it.
    assert cal.recommendation.contender_bound_mnats == 0.0
    assert cal.flip_gaps.max == pytest.approx(100.0)
    assert cal.recommendation.near_tie_mnats == 100.0
    assert cal.verdicts is not None
    assert cal.verdicts.default == "ratified_pass"
    o_far = _oracle([("p0", o_pos), ("p1", [{1: -0.5, 2: -0.64}])])
    cand_far = _candidate([("p0", c_pos), ("p1", [{2: -0.5, 1: -0.5}])], tokens={"p1": [2]})
    cal = calibrate(o_far, cand_far)
    assert cal.recommendation.near_tie_mnats == 140.0
    assert cal.verdicts is not None
    assert (cal.verdicts.default, cal.verdicts.recommended) == ("fail", "ratified_pass")


def test_a_candidate_without_logprobs_cannot_be_calibrated() -> None:
    prompts = [("p0", [POS_A])]
    cand = _candidate([("p0", [])], tokens={"p0": [10]})
    with pytest.raises(InputError, match="no top_logprobs"):
        calibrate(_oracle(prompts), cand)


def test_mismatched_inputs_are_input_errors() -> None:
    prompts = [("p0", [POS_A]), ("p1", [POS_B])]
    with pytest.raises(InputError, match="missing prompt"):
        calibrate(_oracle(prompts), _candidate(prompts[:1]))
    with pytest.raises(InputError, match="expected an oracle"):
        calibrate(_candidate(prompts), _candidate(prompts))


def test_distribution_quantiles_are_observed_values() -> None:
    d = Distribution.of([float(x) for x in range(1, 101)])
    assert (d.count, d.median, d.p90, d.p99, d.max) == (100, 50.0, 90.0, 99.0, 100.0)
    assert Distribution.of([]).to_dict()["max"] is None
    h = Histogram.of([0.0, 0.5, 1.0, 4.9, 150.0, 5000.0])
    assert h.counts[:4] == (2, 1, 1, 0) and h.counts[-1] == 1 and h.zero == 1


def test_recommend_without_a_sample_keeps_the_default() -> None:
    rec = recommend(Pairs.from_lists([], []), top2_mnats=[])
    assert (rec.near_tie_mnats, rec.confidence) == (125.0, "none")


def test_attach_calibration_puts_the_figures_under_the_documented_key() -> None:
    prompts = [("p0", [POS_A, POS_B])]
    oracle, cand = _oracle(prompts), _candidate(prompts)
    result = attach_calibration(compare(oracle, cand), oracle, cand)
    figures = result.meta[CALIBRATION_META_KEY]
    assert figures["gate_calibration"] == 1 and figures["positions_matched"] == 2
    assert figures["drift"]["gap_drift_mnats"]["max"] == 0.0
    bare = _candidate([("p0", [])], tokens={"p0": [10, 20]})
    assert CALIBRATION_META_KEY not in attach_calibration(compare(oracle, bare), oracle, bare).meta


def test_the_drift_figures_draw_in_the_html_report() -> None:
    oracle, cand = _oracle([("p0", GRID_O)], logits=True), _candidate([("p0", GRID_C)])
    result = attach_calibration(compare(oracle, cand), oracle, cand)
    figures = result.meta["figures"]
    assert [len(f["values"]) for f in figures] == [4, 2, 2]
    assert figures[0]["markers"][0] == {"at": 190.0, "label": "recommended 190"}
    from gate.reports import render

    page = render(result, "html")
    assert "Gap drift: how far the gap" in page and "recommended 190" in page
    assert "skipped" not in page


# --------------------------------------------------------------------------- the CLI on trace files


def test_calibrate_cli_on_two_traces(tmp_path: Path) -> None:
    write_trace(tmp_path / "o.jsonl", _oracle([("p0", GRID_O)], logits=[20.0, 3.0]))
    write_trace(tmp_path / "c.jsonl", _candidate([("p0", GRID_C)]))
    runner = CliRunner()
    r = runner.invoke(app, ["calibrate", str(tmp_path / "o.jsonl"), str(tmp_path / "c.jsonl"), "--format", "json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["recommendation"]["flags"] == "--near-tie-mnats 0 --near-tie-ulps 2"
    assert out["drift"]["gap_drift_mnats"]["max"] == 187.5
    assert out["drift"]["contender_gap_drift_mnats"]["max"] == 187.5
    assert out["kl_shared_topk_mnats"]["note"].startswith("KL(oracle || candidate)")
    r = runner.invoke(app, ["calibrate", str(tmp_path / "o.jsonl"), str(tmp_path / "c.jsonl")])
    assert r.exit_code == 0, r.output
    for words in ("gap drift", "187.5", "--near-tie-mnats 0 --near-tie-ulps 2", "top-2 gaps", "KL"):
        assert words in r.stdout, words


def _main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Run `gate` as the console script does (errors mapped to exit codes); (code, stderr)."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    code = exc.value.code
    return code if isinstance(code, int) else 0, capsys.readouterr().err


def test_calibrate_cli_input_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    o = str(tmp_path / "o.jsonl")
    write_trace(o, _oracle([("p0", [POS_A])]))
    write_trace(tmp_path / "c.jsonl", _candidate([("p0", [])], tokens={"p0": [10]}))
    code, err = _main(["calibrate", o], capsys)
    assert code == 2 and "two trace files" in err, err
    code, err = _main(["calibrate", o, str(tmp_path / "nope.jsonl")], capsys)
    assert code == 2 and "nope.jsonl" in err, err
    code, err = _main(["calibrate", o, str(tmp_path / "c.jsonl")], capsys)
    assert code == 2 and "no top_logprobs" in err, err
    code, err = _main(["calibrate", o, o, "--format", "xml"], capsys)
    assert code == 2 and "--format" in err, err
    code, err = _main(["calibrate", o, o, "--engine", "hf"], capsys)
    assert code == 2 and "--engine" in err, err


# --------------------------------------------------------------------------- engine mode, a real model


@pytest.mark.slow
def test_calibrate_runs_the_candidate_over_the_pin(
    tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """`gate calibrate` without trace files: the HF engine in float32 against a bf16 pin of a
    tiny model; the figures must equal those of calibrating the saved trace afterwards."""
    pytest.importorskip("transformers")
    sys.path.insert(0, str(Path(__file__).parents[1]))
    from helpers.tiny_pin import MODEL, build_tiny_pin, one_thread

    root = tmp_path_factory.mktemp("calibrate")
    with one_thread():
        weights, pins = build_tiny_pin(root)
        saved = root / "candidate.jsonl"
        argv = [
            "calibrate",
            "--model",
            MODEL,
            "--model-path",
            str(weights),
            "--pins-dir",
            str(pins),
            "--engine-opt",
            "dtype=float32",
            "--save-trace",
            str(saved),
            "--format",
            "json",
        ]
        with pytest.raises(SystemExit) as exc:
            main(argv)
    out = capsys.readouterr()
    assert exc.value.code == 0, out.err
    live = json.loads(out.out)
    assert live["candidate_engine"].startswith("hf") and live["positions_matched"] > 0
    assert live["drift"]["chosen_abs_delta_mnats"]["max"] > 0.0  # float32 is not bf16
    assert live["oracle_top2_gaps"]["within_steps"] is not None  # the HF pin records raw logits
    assert "recommended doctrine: --near-tie-mnats" in out.err
    from gate.core.pins.pin import load_pin

    pin_path = load_pin(MODEL, pins).folder.pin_path
    with pytest.raises(SystemExit) as exc:
        main(["calibrate", str(pin_path), str(saved), "--format", "json"])
    again = json.loads(capsys.readouterr().out)
    assert exc.value.code == 0
    assert again == live
