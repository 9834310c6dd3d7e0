"""A candidate never chooses its pin: the `gate_check` fixture (and `gate_candidate`, the
Action's gate too) judges against the pin the user names, else the default model's, as `gate
run --candidate-trace` does. A trace whose header names another model, one with a lax pin in
the pins folder, is refused (exit 2, naming both models), never judged by that lax pin."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from helpers.pin_candidates import default_pin_trace, planted_flip, write_trace_file

from gate.core.pins.pin import load_pin
from gate.core.traces.trace import encode_trace
from gate.errors import GateError
from gate.integrations.gating import gate_candidate
from gate.models.default import DEFAULT_MODEL

pytest_plugins = ["pytester"]

EVIL = "evil/model"
LAX = {"near_tie_mnats": 5000.0}


def lax_pin(pins: Path) -> Path:
    """The default pin copied into `pins` as it is, and under `pins/evil/model` with a 5-nat
    near-tie threshold as its doctrine."""
    source = load_pin(DEFAULT_MODEL)
    shutil.copytree(source.folder.path, pins / DEFAULT_MODEL)
    folder = pins / EVIL
    shutil.copytree(source.folder.path, folder)
    settings = json.loads((folder / "oracle.json").read_text())
    settings.update(model=EVIL, doctrine=LAX)
    (folder / "oracle.json").write_text(json.dumps(settings))
    pin = source.trace
    header = replace(pin.header, model=EVIL, extra={**pin.header.extra, "doctrine": LAX})
    (folder / "pin.jsonl").write_bytes(encode_trace(header, pin.records))
    return folder


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a pins folder holding the lax pin, a candidate for `evil/model` flipping a 1.5-2 nat gap)."""
    root = tmp_path_factory.mktemp("hostile-pin")
    pins = root / "pins"
    lax_pin(pins)
    flip = planted_flip(default_pin_trace(), 1.5, 2.0)
    trace = replace(flip, header=replace(flip.header, model=EVIL))
    return pins, write_trace_file(trace, root / "candidate.jsonl")


def test_the_lax_pin_ratifies_the_flip_only_when_the_user_names_it(hostile: tuple[Path, Path]) -> None:
    pins, candidate = hostile
    named = gate_candidate(candidate, model=EVIL, pins_dir=pins).result
    assert named.verdict == "ratified_pass" and named.doctrine.near_tie_mnats == 5000.0
    with pytest.raises(GateError, match=f"is for model '{EVIL}', but the pin .* is for '{DEFAULT_MODEL}'") as info:
        gate_candidate(candidate, pins_dir=pins)
    assert info.value.exit_code == 2


def test_the_fixture_refuses_a_trace_that_names_another_model(
    pytester: pytest.Pytester, hostile: tuple[Path, Path]
) -> None:
    pins, candidate = hostile
    pytester.makepyfile(test_foreign=f"def test_engine(gate_check):\n    gate_check({str(candidate)!r})\n")
    r = pytester.runpytest("-p", "no:cacheprovider", "--gate-pins-dir", str(pins))
    r.assert_outcomes(failed=1)
    out = r.stdout.str()
    assert f"is for model '{EVIL}'" in out and "ratified" not in out, out
