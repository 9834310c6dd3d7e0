"""The pin's doctrine is one thing: oracle.json and the pin trace header cannot disagree
silently, a floor whose limits are not finite is refused, and `gate run --candidate-trace`
judges against the model asked for (the default model unless `--model` names another),
never against whichever pin the trace's own header names. Pure: no engine, no torch."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from helpers.gate_cli import invoke
from helpers.pin_attacks import PIN, candidate, same, write

from gate.core.verdict.floor import Floor
from gate.errors import InputError

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


def _pins(tmp_path: Path) -> Path:
    """A copy of the default pin folder under tmp_path/pins."""
    root = tmp_path / "pins"
    shutil.copytree(PIN.parent, root / MODEL)
    return root


def _edit_header(pin: Path, change: Any) -> None:
    lines = pin.read_bytes().splitlines()
    head = json.loads(lines[0])
    change(head)
    pin.write_bytes(b"\n".join([json.dumps(head).encode(), *lines[1:]]) + b"\n")


def _candidate(tmp_path: Path, **header: Any) -> Path:
    head, recs = candidate(same)
    head.update(header)
    for r in recs:
        r.pop("model", None)
    return write(tmp_path / "cand.jsonl", head, recs)


def test_the_honest_copy_is_judged_against_the_default_pin(tmp_path: Path) -> None:
    r = invoke(["run", "--candidate-trace", str(_candidate(tmp_path)), "--format", "json"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["distribution"]["judged"] is True and report["distribution"]["coverage"]["complete"] is True


@pytest.mark.parametrize("drop", ["floor", "evidence"])
def test_a_header_doctrine_that_lacks_a_field_oracle_json_has_is_refused(tmp_path: Path, drop: str) -> None:
    pins = _pins(tmp_path)
    _edit_header(pins / MODEL / "pin.jsonl", lambda h: h["doctrine"].pop(drop))
    r = invoke(["run", "--candidate-trace", str(_candidate(tmp_path)), "--pins-dir", str(pins)])
    assert r.exit_code == 2, r.output
    msg = " ".join(r.stderr.split())
    assert f"'doctrine.{drop}'" in msg and "pin.jsonl" in msg and "oracle.json" in msg, msg
    assert "Traceback" not in r.output


def test_a_floor_value_that_differs_between_the_two_files_is_refused(tmp_path: Path) -> None:
    pins = _pins(tmp_path)
    settings = pins / MODEL / "oracle.json"
    raw = json.loads(settings.read_text())
    raw["doctrine"]["floor"]["margin"] = 100.0
    settings.write_text(json.dumps(raw))
    r = invoke(["run", "--candidate-trace", str(_candidate(tmp_path)), "--pins-dir", str(pins)])
    assert r.exit_code == 2, r.output
    assert "'doctrine.floor.margin'" in r.stderr and "100.0" in r.stderr


def test_agreeing_doctrines_are_judged_as_before(tmp_path: Path) -> None:
    pins = _pins(tmp_path)
    r = invoke(["run", "--candidate-trace", str(_candidate(tmp_path)), "--pins-dir", str(pins)])
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("margin", [1e308, float("inf")])
def test_a_floor_whose_limits_are_not_finite_is_refused(margin: float) -> None:
    with pytest.raises(InputError, match="finite"):
        Floor(kl_mean_mnats=1.74, kl_p99_mnats=11.2, same_top_rate=0.976, margin=margin, measured_by="x")


def test_a_header_floor_with_an_overflowing_margin_is_exit_2(tmp_path: Path) -> None:
    pins = _pins(tmp_path)
    for f in ("pin.jsonl",):
        _edit_header(pins / MODEL / f, lambda h: h["doctrine"]["floor"].update(margin=1e308))
    r = invoke(["compare", str(pins / MODEL / "pin.jsonl"), str(_candidate(tmp_path))])
    assert r.exit_code == 2, r.output
    assert "not finite" in r.stderr


def test_a_candidate_trace_for_another_model_is_refused_without_model(tmp_path: Path) -> None:
    """Its header names another model: the default model's pin is the one asked for, and the
    trace is not for it (exit 2, saying how to name the other)."""
    pins = _pins(tmp_path)
    other = "someorg/other-model"
    shutil.copytree(pins / MODEL, pins / other)
    _edit_header(pins / other / "pin.jsonl", lambda h: h.update(model=other))
    cand = _candidate(tmp_path, model=other)
    r = invoke(["run", "--candidate-trace", str(cand), "--pins-dir", str(pins)])
    assert r.exit_code == 2, r.output
    msg = " ".join(r.stderr.split())
    assert f"is for model '{other}'" in msg and f"--model {other}" in msg, msg
    # Named, it is judged against its own pin.
    r = invoke(["run", "--candidate-trace", str(cand), "--pins-dir", str(pins), "--model", other])
    assert r.exit_code == 0, r.output
