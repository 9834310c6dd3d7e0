"""`gate selftest` on a tiny random Llama with a pin recorded by the HF engine
(tests/helpers/tiny_pin.py): its suite has exact top-2 ties (the tie-break fault needs some) and
top-2 gaps of a few grid steps. The doctrine is the grid alone (`--near-tie-mnats 0
--near-tie-ulps 1`): at |logit| 8-16, 125 mnats is two steps and would hide part of the
four-step fault.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from gate.core.calibration.selftest import (
    CAUGHT,
    EXPECT_DEFECT,
    UNCHANGED,
    SelfTestResult,
    changed_positions,
    judge,
)
from gate.core.pins.diff import exact_top2_ties
from gate.core.pins.pin import load_pin
from gate.core.verdict.adjudicate import compare
from gate.core.verdict.doctrine import Doctrine
from gate.errors import InputError
from gate.workflows.calibration.selftest import run_selftest

sys.path.insert(0, str(Path(__file__).parents[1]))
from helpers.tiny_pin import MODEL, build_tiny_pin, one_thread

pytestmark = pytest.mark.slow

GRID_DOCTRINE = Doctrine(near_tie_mnats=0.0, near_tie_ulps=1.0)


@pytest.fixture(scope="module")
def tiny_pin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """(weights folder, pins root) with a pin of the tiny model recorded by the HF engine."""
    with one_thread():
        yield build_tiny_pin(tmp_path_factory.mktemp("selftest"))


@pytest.fixture(scope="module")
def selftest(tiny_pin: tuple[Path, Path]) -> SelfTestResult:
    from gate.engines.hf.mutants import baseline_loader, mutations

    weights, pins = tiny_pin
    pin = load_pin(MODEL, pins)
    with one_thread():
        return run_selftest(pin, baseline_loader(str(weights), {}), mutations(str(weights), {}), GRID_DOCTRINE)


def _by_name(result: SelfTestResult) -> dict[str, Any]:
    return {m.name: m for m in result.mutants}


def test_every_mutant_is_caught_and_classified_as_expected(selftest: SelfTestResult) -> None:
    assert selftest.ok, selftest.summary + "\n" + "\n".join(f"{m.name}: {m.why}" for m in selftest.mutants)
    assert selftest.exit_code == 0
    assert selftest.reference_exact_ties > 0  # the suite exercises the tie-break fault
    assert selftest.baseline_against_pin.verdict == "strict_pass"  # the pin was recorded by this engine
    m = _by_name(selftest)
    assert set(m) == {"tie-break-highest", "runner-up+1-step", "runner-up+4-steps", "float16", "skip-layer-1"}
    for name in ("tie-break-highest", "runner-up+1-step", "runner-up+4-steps", "skip-layer-1"):
        assert m[name].status == CAUGHT, (name, m[name].why)
        assert m[name].reported_positions == m[name].changed_positions > 0


def test_the_tie_break_fault_is_exact_ties_broken_to_the_higher_id(selftest: SelfTestResult) -> None:
    tie = _by_name(selftest)["tie-break-highest"]
    counts = tie.against_reference.counts
    assert counts["exact_ties"] == tie.changed_positions and counts["near_ties"] == counts["defects"] == 0
    assert dict(tie.against_reference.tie_breaks) == {"higher_id": tie.changed_positions}
    # Every exact tie in the reference where the rival has the higher id flips, and only those.
    assert tie.changed_positions <= selftest.reference_exact_ties


def test_one_step_is_ratified_and_four_steps_are_defects(selftest: SelfTestResult) -> None:
    m = _by_name(selftest)
    one, four = m["runner-up+1-step"], m["runner-up+4-steps"]
    assert one.against_reference.counts["defects"] == 0
    assert one.against_reference.max_gap_ulps is not None and one.against_reference.max_gap_ulps <= 1.0 + 1e-6
    assert one.against_reference.verdict == "ratified_pass"
    assert four.against_reference.counts["defects"] > 0
    assert four.against_reference.max_gap_ulps is not None and 1.0 < four.against_reference.max_gap_ulps <= 4.0 + 1e-6
    assert four.against_reference.verdict == "fail"
    # Four steps flip everything one step does, and more.
    assert four.changed_positions > one.changed_positions


def test_skipping_a_layer_is_a_defect(selftest: SelfTestResult) -> None:
    skip = _by_name(selftest)["skip-layer-1"]
    assert skip.against_reference.counts["defects"] > 0
    assert skip.against_pin.verdict == "fail"


def test_selftest_reports_render(selftest: SelfTestResult) -> None:
    from gate.reports.selftest import render_selftest_json, render_selftest_text

    data = json.loads(render_selftest_json(selftest))
    assert data["gate_selftest"] == 1 and data["ok"] is True
    assert data["mutants"][0]["name"] == "tie-break-highest"
    text = render_selftest_text(selftest, width=400)
    for words in ("tie-break-highest", "exact ties broken to the higher id", "selftest passed", "skip-layer-1"):
        assert words in text, words


def test_a_gate_that_ignored_forced_data_would_be_missed(selftest: SelfTestResult) -> None:
    """The self-test must be able to fail: drop the forced decode (a gate bug that lets a
    change early in a prompt hide every later one) and it reports the fault as missed."""
    four = _by_name(selftest)["runner-up+4-steps"]
    reference = selftest.reference
    assert four.candidate is not None and reference is not None
    _, changed = changed_positions(reference, four.candidate)
    assert changed == four.changed_positions
    # The forced decode dropped whole: its ids and its lists (lists alone are refused).
    free_only = replace(
        four.candidate,
        records=tuple(replace(r, forced_token_ids=None, forced_top_logprobs=None) for r in four.candidate.records),
    )
    blind = compare(reference, free_only, GRID_DOCTRINE)  # later positions go unadjudicated
    assert len(blind.divergences) < changed
    status, met, why = judge(EXPECT_DEFECT, changed, blind)
    assert (status, met) == ("missed", False), why


def test_judge_without_changes() -> None:
    from gate.core.verdict.result import GateResult

    empty = GateResult(doctrine=GRID_DOCTRINE, prompts=(), divergences=())
    assert judge("caught", 0, empty)[:2] == (UNCHANGED, True)
    assert judge("exact_ties", 0, empty)[:2] == (UNCHANGED, False)


def _beyond_the_floor() -> Any:
    """A run's distribution judged beyond a floor (KL far past the floor's mean)."""
    from gate.core.verdict.distribution import MIN_POSITIONS, Figures, Point, RunDistribution
    from gate.core.verdict.floor import Floor

    pts = [Point("p", i, "match", 50.0, True, 0.0, 5) for i in range(MIN_POSITIONS)]
    floor = Floor(kl_mean_mnats=1.0, kl_p99_mnats=5.0, same_top_rate=0.9, margin=1.5, measured_by="a test")
    return RunDistribution(overall=Figures.of(pts), by_class=(), floor=floor, beyond_figures=("mean KL 50 > 1.5",))


def test_a_mutant_caught_by_the_floor_alone_is_caught_not_missed() -> None:
    """A mutant that changes no token but whose numerics are beyond the floor: the gate
    failed it by the distribution verdict, and no divergence was reported."""
    from gate.core.verdict.result import GateResult

    failed = GateResult(doctrine=GRID_DOCTRINE, prompts=(), divergences=(), distribution=_beyond_the_floor())
    assert failed.verdict == "fail"
    status, met, why = judge("caught", 0, failed)
    assert (status, met) == ("caught", True), why
    assert "reported divergences" not in why and "distribution" in why
    status, met, why = judge("exact_ties", 0, failed)
    assert (status, met) == (UNCHANGED, False), why
    assert "reported divergences" not in why


def test_a_mutant_within_the_token_rule_but_beyond_the_floor_says_both() -> None:
    """The one-step mutant's expectation is about its token classes (no defect); a
    systematic one-step bias can also be beyond the honest floor, and the why says so."""
    from gate.core.verdict.result import GateResult

    failed = GateResult(doctrine=GRID_DOCTRINE, prompts=(), divergences=(), distribution=_beyond_the_floor())
    _, met, why = judge("no_defect", 0, failed)
    assert not met and "distribution" in why  # nothing changed: the expectation was not exercised


def test_exact_top2_ties_counts_bit_equal_pairs(tiny_pin: tuple[Path, Path]) -> None:
    _, pins = tiny_pin
    pin = load_pin(MODEL, pins)
    ties = len(exact_top2_ties(pin.trace))
    manual = sum(1 for r in pin.trace.records for t in r.top_logprobs or () if t[0][1] == t[1][1])
    assert ties == manual > 0


def test_unknown_mutant_name_is_an_input_error(tiny_pin: tuple[Path, Path]) -> None:
    from gate.engines.hf.mutants import mutations

    weights, _ = tiny_pin
    with pytest.raises(InputError, match="'nope': unknown mutant"):
        mutations(str(weights), {}, only=["nope"])
    assert [m.name for m in mutations(str(weights), {}, only=["float16"])] == ["float16"]


def test_selftest_cli_on_the_tiny_pin(tiny_pin: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    from gate.cli.main import main

    weights, pins = tiny_pin
    argv = [
        "selftest",
        "--model",
        MODEL,
        "--model-path",
        str(weights),
        "--pins-dir",
        str(pins),
        "--near-tie-mnats",
        "0",
        "--only",
        "tie-break-highest",
        "--only",
        "runner-up+4-steps",
        "--format",
        "json",
    ]
    with one_thread(), pytest.raises(SystemExit) as exc:
        main(argv)
    out = capsys.readouterr()
    assert exc.value.code == 0, out.err
    data = json.loads(out.out)
    assert [m["name"] for m in data["mutants"]] == ["tie-break-highest", "runner-up+4-steps"]
    assert data["doctrine"] == {"near_tie_mnats": 0.0, "strict": False, "near_tie_ulps": 1.0, "dtype": "bfloat16"}
    # With the default 125 mnats the four-step fault hides under the millinat allowance
    # (four 62.5-mnat steps at most 250, most flips far less): the self-test says so, exit 1.
    with one_thread(), pytest.raises(SystemExit) as exc:
        main([*argv[:7], "--only", "runner-up+4-steps", "--near-tie-mnats", "1000", "--format", "json"])
    out = capsys.readouterr()
    assert exc.value.code == 1, out.err
    assert json.loads(out.out)["mutants"][0]["met"] is False


# --------------------------------------------------------------------------- the faults themselves


def test_runner_up_is_argmax_order_without_the_top() -> None:
    import torch

    from gate.engines.hf.mutants import runner_up

    assert runner_up(torch.tensor([1.0, 3.0, 3.0, 2.0])) == 2  # a tied runner-up: the next id
    assert runner_up(torch.tensor([5.0, 3.0, 4.0, 4.0])) == 2


def test_raise_by_steps_walks_the_dtype_grid_across_a_power_of_two() -> None:
    import torch

    from gate.engines.hf.mutants import raise_by_steps

    x = torch.tensor(15.9375)  # the last bf16 number below 16 (step 1/16)
    assert float(raise_by_steps(x, 1, torch.bfloat16)) == 16.0
    assert float(raise_by_steps(x, 2, torch.bfloat16)) == 16.125  # step 1/8 above 16
    assert float(raise_by_steps(torch.tensor(-3.0), 1, torch.bfloat16)) == -3.0 + 2.0**-6
    assert float(raise_by_steps(torch.tensor(16.0), 4, torch.float16)) == 16.0 + 4 * 2.0**-6
    assert raise_by_steps(x, 1, torch.bfloat16).dtype == torch.float32


def test_the_layer_skip_and_its_bounds(tiny_pin: tuple[Path, Path]) -> None:
    from gate.core.engine import PromptInput
    from gate.engines.hf.engine import HFEngine
    from gate.engines.hf.mutants import LayerSkippedHFEngine

    weights, _ = tiny_pin
    with one_thread():
        skipped = LayerSkippedHFEngine(str(weights), layer=0)
        plain = HFEngine(str(weights))
        prompt = [PromptInput(id="p", prompt_token_ids=(72, 101, 108, 108, 111), max_tokens=4)]
        a, b = skipped.generate(prompt, 5)[0], plain.generate(prompt, 5)[0]
    assert skipped.info()["mutation"] == "decoder layer 0 skipped"
    assert a.top_logprobs != b.top_logprobs
    assert type(skipped.model.model.layers[0]).__name__ == "_PassThrough"
    with pytest.raises(InputError, match="the model has 2 decoder layers"):
        LayerSkippedHFEngine(str(weights), layer=2)
