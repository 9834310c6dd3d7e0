"""`gate run` and `gate export-prompts` against pins recorded by the toy engine.

The toy model (fake_engine.py) has exact ties at about one position in four, so the
mutation `tie_break=highest` must come out as exact ties with tie_break "higher_id";
a logit bias makes defects; its options make it crash, drift its tokenizer, or report
other weights. The real engines against the real default pin are in test_default_pin.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers.gate_cli import TOY_MODEL, invoke, record_toy_pin, register_fake

from gate.core.pins.diff import exact_top2_ties
from gate.core.pins.pin import load_pin
from gate.core.traces.reader import read_trace
from gate.core.verdict.doctrine import Doctrine
from gate.workflows.common.engine_calls import batch_size_for
from gate.workflows.run.core import Timings, add_token_texts, diverged, force_diverged, gate_against_pin, run_candidate


@pytest.fixture(autouse=True)
def _fake(monkeypatch: pytest.MonkeyPatch) -> None:
    register_fake(monkeypatch)


@pytest.fixture
def pins(tmp_path: Path) -> Path:
    root = tmp_path / "pins"
    record_toy_pin(root)
    return root


def run(pins: Path, *args: str) -> Any:
    return invoke(["run", "--model", TOY_MODEL, "--pins-dir", str(pins), "--engine", "fake", *args])


def report(r: Any) -> dict[str, Any]:
    return dict(json.loads(r.stdout))


# --------------------------------------------------------------------------- verdicts


def test_the_oracles_own_engine_passes_strict(pins: Path) -> None:
    from helpers.fake_engine import FakeEngine

    r = run(pins, "--format", "json")
    assert r.exit_code == 0, r.output
    rep = report(r)
    assert rep["verdict"] == "strict_pass"
    assert rep["counts"]["positions_matched"] == rep["counts"]["positions"] == 72
    assert "6/6 prompts strict 12/12, 72/72 positions" in rep["summary"]
    # Nothing diverged, so nothing was forced; the engine was closed.
    assert not [c for c in FakeEngine.history if c[0] == "force"]
    assert FakeEngine.history[-1] == ("close", None)


def test_highest_id_tie_break_is_caught_as_exact_ties(pins: Path) -> None:
    pin = load_pin(TOY_MODEL, pins)
    r = run(pins, "--engine-opt", "tie_break=highest", "--format", "json")
    assert r.exit_code == 0, r.output  # exact ties are ratified
    rep = report(r)
    assert rep["verdict"] == "ratified_pass"
    divs = rep["divergences"]
    assert divs and {d["class"] for d in divs} == {"exact_tie"}
    assert {d["tie_break"] for d in divs} == {"higher_id"}
    assert all(d["candidate_token"] > d["oracle_token"] for d in divs)
    # Forced decode reaches past each prompt's first divergence: every oracle position
    # with an exact top-2 tie is reported, no more, and nothing is left unadjudicated.
    ties = {(t.prompt_id, t.position) for t in exact_top2_ties(pin.trace)}
    assert {(d["prompt_id"], d["position"]) for d in divs} == ties
    assert {d["source"] for d in divs} == {"free_run", "forced"}
    assert rep["counts"]["unadjudicated_positions"] == 0
    assert rep["counts"]["exact_ties"] == len(ties)
    # The engine's decoded text reaches the report.
    assert all(d["candidate_text"] == f"<t{d['candidate_token']}>" for d in divs)


def test_strict_fails_a_ratified_pass(pins: Path) -> None:
    r = run(pins, "--engine-opt", "tie_break=highest", "--strict", "--format", "json")
    assert r.exit_code == 1, r.output
    assert report(r)["verdict"] == "ratified_pass"


def test_a_biased_logit_is_a_defect(pins: Path) -> None:
    r = run(pins, "--engine-opt", "bias_token=7", "--engine-opt", "bias=4.0", "--format", "json")
    assert r.exit_code == 1, r.output
    rep = report(r)
    assert rep["verdict"] == "fail" and rep["counts"]["defects"] > 0
    assert any(d["class"] == "defect" and d["candidate_token"] == 7 for d in rep["divergences"])


def test_near_tie_threshold_decides_small_gaps(pins: Path) -> None:
    # The runner-up gets 0.3 nats: it takes over wherever it was 0.25 nats behind (250
    # mnats: a defect under the default 125, a near tie under 300) or exactly tied.
    args = ("--engine-opt", "second_bias=0.3", "--format", "json")
    default = run(pins, *args)
    assert default.exit_code == 1, default.output
    gaps = {d["oracle_minus_candidate_mnats"] for d in report(default)["divergences"]}
    assert gaps == {0.0, 250.0}
    loose = run(pins, *args, "--near-tie-mnats", "300")
    assert loose.exit_code == 0, loose.output
    counts = report(loose)["counts"]
    assert counts["near_ties"] > 0 and counts["exact_ties"] > 0 and counts["defects"] == 0


# --------------------------------------------------------------------------- input errors


def test_tokenizer_drift_is_exit_2_naming_the_prompt_and_index(pins: Path) -> None:
    r = run(pins, "--engine-opt", "tokenizer=drift")
    assert r.exit_code == 2, r.output
    err = r.stderr
    assert "prompt 'p00' (" in err and "suite.jsonl:1)" in err
    assert "first difference at index 2: pin " in err
    assert "6 of 6 prompts differ" in err and "re-record the pin" in err
    assert r.stdout == ""


def test_an_engine_that_cannot_tokenize_runs_on_the_pinned_ids(pins: Path) -> None:
    r = run(pins, "--engine-opt", "tokenizer=none")
    assert r.exit_code == 0, r.output


def test_other_weights_are_a_provenance_mismatch(pins: Path) -> None:
    r = run(pins, "--engine-opt", "weights_sha256=other")
    assert r.exit_code == 2, r.output
    assert "provenance mismatch" in r.stderr and "weights hash is other" in r.stderr
    assert "toy-weights-0" in r.stderr


def test_other_tokenizer_files_are_a_provenance_mismatch(pins: Path) -> None:
    r = run(pins, "--engine-opt", "tokenizer_sha256=other")
    assert r.exit_code == 2, r.output
    assert "tokenizer hash is other" in r.stderr


def test_no_pin_folder_is_exit_2_with_the_record_command(tmp_path: Path) -> None:
    r = invoke(["run", "--model", "nobody/none", "--pins-dir", str(tmp_path), "--engine", "fake"])
    assert r.exit_code == 2, r.output
    assert "no pin folder for nobody/none" in r.stderr
    assert f"gate pin record --model nobody/none --pins-dir {tmp_path}" in r.stderr


def test_unknown_engine_and_bad_option(pins: Path) -> None:
    r = invoke(["run", "--model", TOY_MODEL, "--pins-dir", str(pins), "--engine", "fkae"])
    assert r.exit_code == 2, r.output
    assert "unknown engine 'fkae'. Did you mean 'fake'?" in r.stderr
    r = run(pins, "--engine-opt", "seed")
    assert r.exit_code == 2, r.output
    assert "--engine-opt 'seed': expected key=value" in r.stderr
    r = run(pins, "--engine-opt", "colour=red")
    assert r.exit_code == 2, r.output
    assert "--engine-opt colour: unknown option for engine 'fake'" in r.stderr


def test_bad_format_is_refused_before_the_engine_loads(pins: Path) -> None:
    from helpers.fake_engine import FakeEngine

    FakeEngine.history.clear()
    r = run(pins, "--format", "xml")
    assert r.exit_code == 2, r.output
    assert "'--format'" in r.stderr and "'xml' is not one of" in r.stderr
    assert FakeEngine.history == []


# --------------------------------------------------------------------------- engine failures


@pytest.mark.parametrize("where", ["load", "generate", "force"])
def test_engine_crash_is_exit_3(pins: Path, where: str) -> None:
    args = ["--engine-opt", f"fail={where}"]
    if where == "force":
        args += ["--engine-opt", "tie_break=highest"]  # something must diverge to be forced
    r = run(pins, *args)
    assert r.exit_code == 3, r.output
    assert "engine 'fake' failed" in r.stderr and "RuntimeError: toy model" in r.stderr
    assert "Traceback" not in r.output


def test_engine_crash_shows_traceback_with_gate_debug(pins: Path) -> None:
    r = invoke(
        ["run", "--model", TOY_MODEL, "--pins-dir", str(pins), "--engine", "fake", "--engine-opt", "fail=generate"],
        env={"GATE_DEBUG": "1"},
    )
    assert r.exit_code == 3, r.output
    assert "Traceback" in r.stderr


def test_without_forced_data_later_positions_are_unadjudicated(pins: Path) -> None:
    r = run(pins, "--engine-opt", "tie_break=highest", "--engine-opt", "forced=unavailable", "--format", "json")
    assert r.exit_code == 0, r.output
    rep = report(r)
    assert {d["source"] for d in rep["divergences"]} == {"free_run"}
    assert rep["counts"]["unadjudicated_positions"] > 0


def test_a_prompt_that_cannot_be_forced_does_not_stop_the_forcing_of_the_others(pins: Path) -> None:
    from helpers.fake_engine import FakeEngine

    every = report(run(pins, "--engine-opt", "tie_break=highest", "--format", "json"))
    forced_all = {d["prompt_id"] for d in every["divergences"] if d["source"] == "forced"}
    assert len(forced_all) >= 2, "the toy suite needs two forced prompts for this test"
    FakeEngine.history.clear()
    r = run(pins, "--engine-opt", "tie_break=highest", "--engine-opt", "forced=unavailable_first", "--format", "json")
    assert r.exit_code == 0, r.output
    rep = report(r)
    forced_now = {d["prompt_id"] for d in rep["divergences"] if d["source"] == "forced"}
    # Only the one prompt the engine refused to force is left unadjudicated.
    assert forced_now and forced_now < forced_all
    assert len(forced_all - forced_now) <= 1
    assert rep["counts"]["unadjudicated_positions"] > 0


# --------------------------------------------------------------------------- traces


def test_save_trace_then_gate_it_as_a_candidate_trace(pins: Path, tmp_path: Path) -> None:
    saved = tmp_path / "cand.jsonl"
    r = run(pins, "--engine-opt", "tie_break=highest", "--save-trace", str(saved), "--format", "json")
    assert r.exit_code == 0, r.output
    first = report(r)
    trace = read_trace(saved, role="candidate")
    forced = [rec for rec in trace.records if rec.forced_token_ids is not None]
    assert forced and all(rec.forced_mode == "decode" for rec in forced)
    assert trace.header.engine["name"] == "fake" and trace.header.model == TOY_MODEL

    # Saving again refuses to clobber, before any engine runs.
    r = run(pins, "--save-trace", str(saved))
    assert r.exit_code == 2, r.output
    assert "already exists; pass --force" in r.stderr

    # Bring your own trace: the same adjudication without any engine. The pin is the model
    # asked for (the default model unless --model names one), never the trace header's.
    r = invoke(["run", "--candidate-trace", str(saved), "--pins-dir", str(pins), "--format", "json"])
    assert r.exit_code == 2 and "no pin folder for HuggingFaceTB/SmolLM2-135M-Instruct" in r.stderr, r.output
    r = invoke(
        ["run", "--candidate-trace", str(saved), "--pins-dir", str(pins), "--model", TOY_MODEL, "--format", "json"]
    )
    assert r.exit_code == 0, r.output
    again = report(r)
    assert again["counts"] == first["counts"]
    key = ("prompt_id", "position", "source", "oracle_token", "candidate_token", "class", "tie_break")
    assert [[d[k] for k in key] for d in again["divergences"]] == [[d[k] for k in key] for d in first["divergences"]]


def test_candidate_trace_refuses_engine_options(pins: Path, tmp_path: Path) -> None:
    saved = tmp_path / "cand.jsonl"
    assert run(pins, "--save-trace", str(saved)).exit_code == 0
    r = invoke(["run", "--candidate-trace", str(saved), "--pins-dir", str(pins), "--engine", "hf"])
    assert r.exit_code == 2, r.output
    assert "--candidate-trace adjudicates a trace as it is: --engine cannot go with it" in r.stderr


def test_candidate_trace_for_another_model_is_refused(pins: Path, tmp_path: Path) -> None:
    saved = tmp_path / "cand.jsonl"
    assert run(pins, "--save-trace", str(saved)).exit_code == 0
    text = saved.read_text().replace('"model":"toy/model"', '"model":"toy/other"', 1)
    (tmp_path / "other.jsonl").write_text(text)
    r = invoke(
        ["run", "--candidate-trace", str(tmp_path / "other.jsonl"), "--model", TOY_MODEL, "--pins-dir", str(pins)]
    )
    assert r.exit_code == 2, r.output
    assert "is for model 'toy/other', but the pin" in r.stderr


def test_candidate_trace_missing_a_prompt_is_an_input_error(pins: Path, tmp_path: Path) -> None:
    saved = tmp_path / "cand.jsonl"
    assert run(pins, "--save-trace", str(saved)).exit_code == 0
    lines = saved.read_text().splitlines()
    (tmp_path / "short.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    r = invoke(
        ["run", "--candidate-trace", str(tmp_path / "short.jsonl"), "--pins-dir", str(pins), "--model", TOY_MODEL]
    )
    assert r.exit_code == 2, r.output
    assert "missing prompt(s) 'p05'" in r.stderr


def test_export_prompts_then_an_external_engine_writes_its_own_trace(pins: Path, tmp_path: Path) -> None:
    from helpers.fake_engine import FakeEngine

    from gate.core.engine import PromptInput

    out = tmp_path / "prompts.jsonl"
    r = invoke(["export-prompts", "--model", TOY_MODEL, "--pins-dir", str(pins), "-o", str(out)])
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    pin = load_pin(TOY_MODEL, pins)
    assert [(x["id"], tuple(x["prompt_token_ids"]), x["max_tokens"]) for x in rows] == [
        (rec.id, rec.prompt_token_ids, 12) for rec in pin.trace.records
    ]
    assert '"role":"candidate"' in r.stderr and "gate run --candidate-trace" in r.stderr

    # "A device with no Python": here the toy engine stands in, writing plain JSON lines.
    engine = FakeEngine(TOY_MODEL, tie_break="highest")
    recs = engine.generate([PromptInput(x["id"], tuple(x["prompt_token_ids"]), x["max_tokens"]) for x in rows], 0)
    trace = tmp_path / "device.jsonl"
    header = {
        "gate_trace": 1,
        "role": "candidate",
        "model": TOY_MODEL,
        "top_k": 0,
        "engine": {"name": "device", "version": "7"},
    }
    body = [{"id": x.id, "prompt_token_ids": list(x.prompt_token_ids), "token_ids": list(x.token_ids)} for x in recs]
    trace.write_text("".join(json.dumps(o) + "\n" for o in [header, *body]))
    r = invoke(
        ["run", "--candidate-trace", str(trace), "--pins-dir", str(pins), "--model", TOY_MODEL, "--format", "json"]
    )
    assert r.exit_code == 0, r.output
    rep = report(r)
    # Without forced data only each first divergence is classified: exact ties, higher id.
    assert {d["tie_break"] for d in rep["divergences"]} == {"higher_id"}
    assert rep["counts"]["unadjudicated_positions"] > 0


def test_export_prompts_to_stdout_and_refusing_to_clobber(pins: Path, tmp_path: Path) -> None:
    r = invoke(["export-prompts", "--model", TOY_MODEL, "--pins-dir", str(pins)])
    assert r.exit_code == 0, r.output
    assert len(r.stdout.splitlines()) == 6 and json.loads(r.stdout.splitlines()[0])["id"] == "p00"
    out = tmp_path / "p.jsonl"
    out.write_text("keep")
    r = invoke(["export-prompts", "--model", TOY_MODEL, "--pins-dir", str(pins), "-o", str(out)])
    assert r.exit_code == 2, r.output
    assert out.read_text() == "keep"


# --------------------------------------------------------------------------- output


def test_json_on_stdout_stays_clean_and_progress_goes_to_stderr(pins: Path) -> None:
    r = run(pins, "--engine-opt", "tie_break=highest", "--format", "json", "--timings")
    assert r.exit_code == 0, r.output
    report(r)  # stdout is exactly one JSON document
    assert "candidate" in r.stderr and "force" in r.stderr
    assert "timings: load" in r.stderr and "adjudication" in r.stderr


def test_output_file_and_force(pins: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    assert run(pins, "--format", "json", "-o", str(out)).exit_code == 0
    assert json.loads(out.read_text())["verdict"] == "strict_pass"
    r = run(pins, "--format", "json", "-o", str(out))
    assert r.exit_code == 2, r.output
    assert run(pins, "--format", "json", "-o", str(out), "--force").exit_code == 0


# --------------------------------------------------------------------------- the runner as a library


def test_runner_functions_compose(pins: Path) -> None:
    from helpers.fake_engine import FakeEngine

    pin = load_pin(TOY_MODEL, pins)
    engine = FakeEngine(TOY_MODEL, tie_break="highest")
    free = run_candidate(engine, pin)
    ids = diverged(pin, free)
    assert ids and set(ids) <= set(pin.suite.ids)
    forced, which = force_diverged(engine, pin, free)
    assert which == tuple(ids)
    assert all(len(r.forced_token_ids or ()) == 12 for r in forced.records if r.id in ids)

    outcome = gate_against_pin(engine, pin, Doctrine(), timings=Timings(load_s=1.5))
    assert outcome.result.verdict == "ratified_pass"
    assert outcome.timings.load_s == 1.5 and outcome.timings.total_s >= 1.5
    assert outcome.result.run is not None
    meta = outcome.result.run.to_dict()
    assert meta["timings"]["load_s"] == 1.5 and meta["forced_prompts"] == list(ids)


def test_generate_is_batched_as_the_engine_asks(pins: Path) -> None:
    from helpers.fake_engine import FakeEngine

    pin = load_pin(TOY_MODEL, pins)
    for opts, calls in (({}, 6), ({"batch_size": "4"}, 2), ({"batch_size": "0"}, 1)):
        engine = FakeEngine(TOY_MODEL, **opts)
        FakeEngine.history.clear()
        run_candidate(engine, pin)
        assert len([c for c in FakeEngine.history if c[0] == "generate"]) == calls, opts
    assert batch_size_for(FakeEngine(TOY_MODEL), 6) == 1


def test_add_token_texts_fills_forced_divergences(pins: Path) -> None:
    from helpers.fake_engine import FakeEngine

    pin = load_pin(TOY_MODEL, pins)
    engine = FakeEngine(TOY_MODEL, tie_break="highest")
    result = gate_against_pin(engine, pin, Doctrine()).result
    forced = [d for d in result.divergences if d.source == "forced"]
    assert forced and all(d.candidate_text == f"<t{d.candidate_token}>" for d in forced)
    assert all(text == f"<t{t}>" for d in forced for t, _, text in d.alternatives)
    # A decoder that knows nothing leaves the result as it was.
    assert add_token_texts(result, lambda ids: None) is result


def test_a_saved_trace_carries_the_hashes_and_they_are_checked(pins: Path, tmp_path: Path) -> None:
    saved = tmp_path / "cand.jsonl"
    assert run(pins, "--save-trace", str(saved)).exit_code == 0
    header, *rest = saved.read_text().splitlines(keepends=True)
    assert json.loads(header)["engine"]["weights_sha256"] == "toy-weights-0"
    (tmp_path / "other.jsonl").write_text(header.replace("toy-weights-0", "toy-weights-9") + "".join(rest))
    r = invoke(
        ["run", "--candidate-trace", str(tmp_path / "other.jsonl"), "--pins-dir", str(pins), "--model", TOY_MODEL]
    )
    assert r.exit_code == 2, r.output
    assert "the candidate trace" in r.stderr and "weights hash is toy-weights-9" in r.stderr


def test_the_pins_own_doctrine_applies_unless_the_command_line_names_one(pins: Path) -> None:
    settings_path = pins / "toy" / "model" / "oracle.json"
    settings = json.loads(settings_path.read_text())
    settings["doctrine"] = {"near_tie_mnats": 300}
    settings_path.write_text(json.dumps(settings))
    args = ("--engine-opt", "second_bias=0.3", "--format", "json")
    r = run(pins, *args)
    assert r.exit_code == 0, r.output
    rep = report(r)
    assert rep["doctrine"]["near_tie_mnats"] == 300.0 and rep["counts"]["near_ties"] > 0
    r = run(pins, *args, "--near-tie-mnats", "125")
    assert r.exit_code == 1, r.output
    assert report(r)["doctrine"]["near_tie_mnats"] == 125.0


def test_a_bad_threshold_fails_before_the_engine_loads(pins: Path) -> None:
    from helpers.fake_engine import FakeEngine

    FakeEngine.history.clear()
    r = run(pins, "--near-tie-mnats", "-1")
    assert r.exit_code == 2, r.output
    assert "--near-tie-mnats: must be a number >= 0, found -1.0" in r.stderr
    assert FakeEngine.history == []


def test_model_hashes_from_info_manifest_or_a_small_folder(tmp_path: Path) -> None:
    from gate.models.default import MANIFEST
    from gate.models.hashing import tokenizer_sha256, weights_sha256
    from gate.workflows.common.provenance import model_hashes

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / "tokenizer.json").write_text("{}")
    # An engine that states its hashes is taken at its word.
    stated = {"weights_sha256": "w", "tokenizer_sha256": "t", "model_path": str(folder)}
    assert model_hashes(stated) == {"weights_sha256": "w", "tokenizer_sha256": "t"}
    # A small local folder is hashed as gate.models.hashing does for pins.
    assert model_hashes({"model_path": str(folder)}) == {
        "weights_sha256": weights_sha256(folder),
        "tokenizer_sha256": tokenizer_sha256(folder),
    }
    # A folder gate built carries its hashes in a manifest, read instead of re-hashing.
    (folder / MANIFEST).write_text(json.dumps({"weights_sha256": "mw", "tokenizer_sha256": "mt"}))
    assert model_hashes({"model_path": str(folder)}) == {"weights_sha256": "mw", "tokenizer_sha256": "mt"}
    # Nothing local: nothing to check.
    assert model_hashes({"model_path": str(tmp_path / "absent")}) == {}
    assert model_hashes({}) == {}
