"""`gate invariance`: the candidate against itself under schedules.

Negative controls use fake engines (tests/helpers/fake_schedules.py): logits that depend on a
prompt's place in the batch, and logits that move a little on every call, must be reported
as varying (exit 1); the honest toy model is bit-identical in every cell it can run, and a
cell whose knob the engine does not state is listed as not run, with why. The real HF
engine's cells are in tests/workflows/test_invariance_hf.py (slow).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.gate_cli import TOY_MODEL, invoke, register_fake
from helpers.requirements import require_module
from typer.testing import Result

from gate.core.engine import SCHEDULE_KNOBS, HasScheduleKnobs, schedule_knobs
from gate.core.traces.trace import PromptRecord, Trace, TraceHeader
from gate.core.verdict.doctrine import Doctrine
from gate.core.verdict.invariance import (
    BITWISE_INVARIANT,
    INVARIANT_WITHIN_NOISE,
    VARIES,
    InvarianceResult,
    Schedule,
    compare_runs,
    forced_record,
    not_run,
)
from gate.engines.registry import resolve
from gate.errors import EngineError
from gate.reports import render

FAKES = "helpers.fake_schedules"


@pytest.fixture(autouse=True)
def _fake(monkeypatch: pytest.MonkeyPatch) -> None:
    register_fake(monkeypatch)


def invariance(pins: Path, engine: str, *args: str) -> Result:
    return invoke(
        ["invariance", "--model", TOY_MODEL, "--pins-dir", str(pins), "--engine", engine, "--format", "json", *args]
    )


def cells(r: Result) -> dict[str, dict]:
    return {c["schedule"]["cell"]: c for c in json.loads(r.stdout)["cells"]}


# --------------------------------------------------------------------------- negative controls


def test_logits_that_depend_on_the_place_in_the_batch_vary(pins: Path) -> None:
    r = invariance(pins, f"{FAKES}:PlaceFake")
    assert r.exit_code == 1, r.output
    report = json.loads(r.stdout)
    assert report["verdict"] == VARIES
    by = cells(r)
    assert by["batch"]["verdict"] == VARIES
    assert by["batch"]["token_flips"]["defect"] > 0
    assert by["batch"]["bitwise_identical"] is False
    assert by["needle"]["verdict"] == VARIES  # the needle sits in the middle of its batch
    # Cells that keep every prompt first in its call stay bit-identical: the matrix says where.
    for name in ("repeat", "shuffle", "threads", "forced_decode"):
        assert by[name]["verdict"] == BITWISE_INVARIANT, (name, by[name])


def test_logits_that_move_on_every_call_vary(pins: Path) -> None:
    r = invariance(pins, f"{FAKES}:JitterFake")
    assert r.exit_code == 1, r.output
    by = cells(r)
    assert by["repeat"]["verdict"] == VARIES
    assert by["repeat"]["token_flips"]["defect"] > 0
    assert by["repeat"]["max_abs_delta_mnats"] > 0


def test_the_honest_toy_model_is_bit_identical_in_every_cell_it_runs(pins: Path) -> None:
    r = invariance(pins, f"{FAKES}:KnobbedFake", "--strict")
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["gate_invariance"] == 1
    assert report["verdict"] == BITWISE_INVARIANT
    by = cells(r)
    for name in ("repeat", "batch", "needle", "shuffle", "threads", "forced_decode"):
        cell = by[name]
        assert cell["bitwise_identical"] is True, (name, cell)
        assert cell["token_flips"] == {"exact_tie": 0, "near_tie": 0, "defect": 0}
        assert cell["max_abs_delta_mnats"] == 0.0
        assert cell["positions"] > 0
    assert by["batch"]["schedule"]["batch_size"] == 6  # the baseline runs 1 at a time; 6 prompts
    assert by["threads"]["schedule"]["threads"] == 2
    assert report["baseline"]["threads"] == "1"
    assert report["baseline"]["pin"]["verdict"] == "strict_pass"
    assert by["forced_decode"]["positions"] == 6 * 12  # every position of every prompt
    # No knob, no cell: each says which it lacks.
    for name, knob in (
        ("max_num_seqs", "max_num_seqs"),
        ("chunked_prefill", "chunked_prefill"),
        ("prefill", "force_mode"),
    ):
        assert by[name]["ran"] is False and by[name]["verdict"] == "not_run"
        assert knob in by[name]["reason"]


def test_a_server_runs_one_request_at_a_time_against_many_in_flight(pins: Path) -> None:
    r = invariance(pins, f"{FAKES}:ServerFake")
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["baseline"]["concurrency"] == "1"
    by = cells(r)
    cell = by["concurrency"]
    assert cell["ran"] is True and cell["schedule"]["concurrency"] == 6  # 6 prompts, at most --batch 8
    assert cell["bitwise_identical"] is True and cell["positions"] > 0
    assert by["batch"]["ran"] is False  # a server has no batch_size: its batch is what is in flight


def test_a_server_whose_numbers_move_with_the_requests_in_flight_varies(pins: Path) -> None:
    r = invariance(pins, f"{FAKES}:ServerFake", "--engine-opt", "crowd=true")
    assert r.exit_code == 1, r.output
    by = cells(r)
    assert by["concurrency"]["verdict"] == VARIES and by["concurrency"]["token_flips"]["defect"] > 0
    assert by["repeat"]["verdict"] == BITWISE_INVARIANT  # one at a time, twice: the same


def test_logprobs_that_move_without_a_flip_are_within_noise_and_strict_fails(pins: Path) -> None:
    # The toy engine's `nondeterministic=logprob` shifts one logprob by 1e-6 nats on a repeat.
    r = invariance(pins, f"{FAKES}:KnobbedFake", "--schedules", "repeat", "--engine-opt", "nondeterministic=logprob")
    assert r.exit_code == 0, r.output
    repeat = cells(r)["repeat"]
    assert repeat["verdict"] == INVARIANT_WITHIN_NOISE
    assert repeat["bitwise_identical"] is False
    assert repeat["token_flips"] == {"exact_tie": 0, "near_tie": 0, "defect": 0}
    assert repeat["max_abs_delta_mnats"] == pytest.approx(1e-3, rel=1e-3)
    strict = invariance(
        pins, f"{FAKES}:KnobbedFake", "--schedules", "repeat", "--engine-opt", "nondeterministic=logprob", "--strict"
    )
    assert strict.exit_code == 1, strict.output


def test_an_engine_without_knobs_runs_only_the_cells_that_need_none(pins: Path) -> None:
    r = invariance(pins, "fake")
    assert r.exit_code == 0, r.output
    by = cells(r)
    assert {n for n, c in by.items() if c["ran"]} == {"repeat", "shuffle", "forced_decode"}
    assert "batch_size" in by["batch"]["reason"] and "threads" in by["threads"]["reason"]


def test_schedules_choose_the_cells(pins: Path) -> None:
    r = invariance(pins, f"{FAKES}:KnobbedFake", "--schedules", "shuffle,repeat")
    assert r.exit_code == 0, r.output
    assert [c["schedule"]["cell"] for c in json.loads(r.stdout)["cells"]] == ["repeat", "shuffle"]


def test_an_unknown_schedule_is_bad_input(pins: Path) -> None:
    r = invariance(pins, f"{FAKES}:KnobbedFake", "--schedules", "repeat,warp")
    assert r.exit_code == 2, r.output
    assert "unknown cell(s) warp" in r.stderr


def test_only_cells_that_cannot_run_is_not_a_pass(pins: Path) -> None:
    r = invariance(pins, "fake", "--schedules", "threads")
    assert r.exit_code == 2, r.output
    assert "no cell ran" in r.stderr


def test_a_knob_outside_the_vocabulary_is_an_engine_error(pins: Path) -> None:
    r = invariance(pins, f"{FAKES}:BadKnobFake")
    assert r.exit_code == 3, r.output
    assert "'warp_speed' is not one gate knows" in r.stderr


@pytest.mark.parametrize(
    ("name", "runtime"),
    [("hf", "transformers"), ("vllm", "vllm"), ("llamacpp", "llama_cpp"), ("ortgenai", "onnxruntime_genai")],
)
def test_every_built_in_engine_states_knobs_from_the_vocabulary(name: str, runtime: str) -> None:
    require_module(runtime)  # only a runtime that is not installed skips; a failing import fails
    cls = resolve(name)
    assert isinstance(cls, HasScheduleKnobs), name
    knobs = schedule_knobs(cls)
    assert knobs and set(knobs) <= set(SCHEDULE_KNOBS), name


def test_a_knob_that_names_no_option_is_an_engine_error() -> None:
    with pytest.raises(EngineError, match="names no option"):
        schedule_knobs(type("Odd", (), {"schedule_knobs": {"batch_size": ""}}))


# --------------------------------------------------------------------------- the core


def _rec(pid: str, tokens: tuple[int, ...], tops: list[list[list[float]]]) -> PromptRecord:
    return PromptRecord(id=pid, prompt_token_ids=(1, 2), token_ids=tokens, top_logprobs=tops, finish_reason="length")


def _trace(*records: PromptRecord) -> Trace:
    return Trace(TraceHeader(role="candidate", model="m", top_k=2, engine={"name": "x", "version": "1"}), records)


REF = _rec("a", (5, 6), [[[5, -0.1], [7, -0.2]], [[6, -0.01], [8, -3.0]]])


def test_identical_runs_are_bitwise_invariant() -> None:
    cell = compare_runs(_trace(REF), _trace(REF), Doctrine(), Schedule("repeat"))
    assert cell.verdict == BITWISE_INVARIANT and cell.positions == 2 and cell.max_abs_delta_mnats == 0.0


def test_a_flip_by_the_references_gap_is_a_defect_and_a_small_one_a_near_tie() -> None:
    # The cell takes 7 at position 0: the reference had it 100 mnats behind (a near tie at 125).
    near = _rec("a", (7, 9), [[[7, -0.1], [5, -0.15]], [[9, -0.1]]])
    cell = compare_runs(_trace(REF), _trace(near), Doctrine(), Schedule("batch"))
    assert cell.token_flips == {"exact_tie": 0, "near_tie": 1, "defect": 0}
    assert cell.verdict == INVARIANT_WITHIN_NOISE
    assert cell.positions == 1  # the contexts part after the flip
    assert cell.max_abs_delta_mnats == pytest.approx(100.0)
    strict = compare_runs(_trace(REF), _trace(near), Doctrine(near_tie_mnats=50), Schedule("batch"))
    assert strict.verdict == VARIES and strict.token_flips["defect"] == 1


def test_a_forced_cell_is_compared_at_every_position() -> None:
    tops = [[[5, -0.1], [7, -0.2]], [[8, -0.5], [6, -0.6]]]
    cell = compare_runs(_trace(REF), _trace(forced_record(REF, (5, 8), tops)), Doctrine(), Schedule("forced_decode"))
    assert cell.positions == 2
    assert cell.token_flips["defect"] == 1  # 6 -> 8 where the reference had 8 2.99 nats behind
    assert cell.max_abs_delta_mnats == pytest.approx(2500.0)  # token 8: -3.0 against -0.5


def test_the_matrix_renders_in_every_format(pins: Path) -> None:
    r = invariance(pins, f"{FAKES}:PlaceFake", "--format", "markdown")
    assert r.exit_code == 1, r.output
    assert "| batch | batch\\_size=6 | varies |" in r.stdout
    html = invariance(pins, f"{FAKES}:PlaceFake", "--format", "html")
    assert html.stdout.startswith("<!doctype html>") and 'class="tile"' in html.stdout
    assert "<script" not in html.stdout and "http" not in html.stdout.split("</title>", 1)[1]
    rich = invariance(pins, f"{FAKES}:PlaceFake", "--format", "rich")
    assert "batch_size=6" in rich.stdout and "varies" in rich.stdout


def test_a_result_with_no_cell_run_refuses_a_verdict() -> None:
    result = InvarianceResult(
        engine="x",
        model="m",
        baseline=Schedule("baseline"),
        cells=(not_run(Schedule("threads"), "no knob"),),
        doctrine=Doctrine(),
    )
    with pytest.raises(Exception, match="no cell ran"):
        _ = result.verdict
    with pytest.raises(Exception, match="no cell ran"):
        render(result, "json")


def test_each_set_of_options_loads_the_engine_once(pins: Path) -> None:
    from helpers.fake_engine import FakeEngine

    FakeEngine.history.clear()
    r = invariance(pins, f"{FAKES}:KnobbedFake")
    assert r.exit_code == 0, r.output
    loads = [opts for call, (_, opts) in ((c, a) for c, a in FakeEngine.history if c == "load")]
    # The baseline's (repeat, shuffle, forced_decode), the batch's (needle too), the threads'.
    assert loads == [{"threads": "1"}, {"threads": "1", "batch_size": "6"}, {"threads": "2"}]
    assert [c for c, _ in FakeEngine.history].count("close") == 3


def test_a_reference_without_raw_logits_is_sized_at_the_evidence_floor() -> None:
    from gate.core.verdict.doctrine import Evidence

    # The reference had 7 250 mnats behind 5; the cell took 7 by 10 mnats of its own.
    ref = _rec("a", (5, 6), [[[5, -0.1], [7, -0.35]], [[6, -0.01]]])
    flip = _rec("a", (7, 6), [[[7, -0.2], [5, -0.21]], [[6, -0.01]]])
    plain = compare_runs(_trace(ref), _trace(flip), Doctrine(), Schedule("batch"))
    assert plain.token_flips["defect"] == 1  # 250 > 125 mnats, no grid to weigh it on
    evidence = Doctrine(evidence=Evidence(oracle_ulps=4, candidate_ulps=2, drift_ulps=2))
    # At the floor (|logit| 16, bf16 step 125 mnats): 2 steps behind, 0.08 ahead: a near tie.
    weighed = compare_runs(_trace(ref), _trace(flip), evidence, Schedule("batch"))
    assert weighed.token_flips == {"exact_tie": 0, "near_tie": 1, "defect": 0}
    tight = Doctrine(evidence=Evidence(oracle_ulps=1, candidate_ulps=2, drift_ulps=2))
    assert compare_runs(_trace(ref), _trace(flip), tight, Schedule("batch")).token_flips["defect"] == 1


@pytest.mark.parametrize("placeholder", ["{title}", "{rows}", "{summary}", "%s", "${head}"])
def test_the_html_page_cannot_be_addressed_by_a_name(placeholder: str) -> None:
    """An engine or model name that looks like a placeholder of the page is shown as text."""
    ref = _rec("a", (5, 6), [[[5, -0.1], [7, -0.35]], [[6, -0.01]]])
    cell = compare_runs(_trace(ref), _trace(ref), Doctrine(), Schedule("batch"))
    result = InvarianceResult(
        engine=placeholder, model=placeholder, baseline=Schedule("baseline"), cells=(cell,), doctrine=Doctrine()
    )
    page = render(result, "html")
    assert f"<title>gate invariance: {placeholder} on {placeholder}</title>" in page
    assert page.count("<table>") == 1 and page.count("<style>") == 1 and page.count("<h1>") == 1
