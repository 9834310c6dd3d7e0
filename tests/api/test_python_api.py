"""The Python API through `import gate` alone: load a pin (by model id or by its folder),
gate an engine object or a registered engine name against it, adjudicate two traces. The
results are the very ones `gate run` prints (its JSON report's verdict and summary)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from helpers.fake_engine import FakeEngine
from helpers.gate_cli import TOY_MODEL, record_toy_pin, register_fake, run_fake

import gate


@pytest.fixture(autouse=True)
def _fake(monkeypatch: pytest.MonkeyPatch) -> None:
    register_fake(monkeypatch)


@pytest.fixture
def pins(tmp_path: Path) -> Path:
    root = tmp_path / "pins"
    record_toy_pin(root)
    return root


def test_load_pin_by_model_id_and_by_folder(pins: Path) -> None:
    pin = gate.load_pin(TOY_MODEL, pins)
    assert isinstance(pin, gate.Pin)
    assert isinstance(pin.trace, gate.Trace) and pin.trace.header.role == "oracle"
    assert isinstance(pin.doctrine, gate.Doctrine)
    by_folder = gate.load_pin(pins / TOY_MODEL)
    assert by_folder.trace.records == pin.trace.records
    assert by_folder.doctrine == pin.doctrine


def test_load_pin_of_a_folder_under_the_wrong_name_is_a_pin_error(pins: Path, tmp_path: Path) -> None:
    moved = tmp_path / "elsewhere" / "model"
    moved.parent.mkdir()
    (pins / TOY_MODEL).rename(moved)
    with pytest.raises(gate.PinError, match="names model 'toy/model'"):
        gate.load_pin(moved)


def test_no_pin_is_a_pin_error(tmp_path: Path) -> None:
    with pytest.raises(gate.PinError, match="no pin folder for toy/none"):
        gate.load_pin("toy/none", tmp_path)


def test_run_by_engine_name_gives_the_cli_s_verdict(pins: Path) -> None:
    result = gate.run("fake", TOY_MODEL, pins_dir=pins, options={"tie_break": "highest"})
    assert isinstance(result, gate.GateResult)
    cli = json.loads(run_fake(pins, "--engine-opt", "tie_break=highest").stdout)
    assert (result.verdict, result.summary, result.exit_code) == (cli["verdict"], cli["summary"], 0)
    assert result.verdict == "ratified_pass"
    assert all(isinstance(d, gate.Divergence) and d.cls == "exact_tie" for d in result.divergences)
    assert FakeEngine.history[-1] == ("close", None)  # an engine gate loaded, gate closes


def test_run_of_an_engine_object_leaves_it_open(pins: Path) -> None:
    engine = FakeEngine(TOY_MODEL, bias_token="7", bias="3.0")
    FakeEngine.history.clear()
    result = gate.run(engine, TOY_MODEL, pins_dir=pins)
    assert result.verdict == "fail" and result.exit_code == 1
    assert {d.cls for d in result.divergences} == {"defect"}
    assert ("close", None) not in FakeEngine.history


def test_run_with_a_doctrine_of_the_callers(pins: Path) -> None:
    strict = gate.run(
        "fake", TOY_MODEL, pins_dir=pins, options={"tie_break": "highest"}, doctrine=gate.Doctrine(strict=True)
    )
    assert strict.verdict == "ratified_pass" and strict.exit_code == 1


def test_compare_two_traces_read_and_written_through_the_front_door(pins: Path, tmp_path: Path) -> None:
    pin = gate.load_pin(TOY_MODEL, pins)
    out = tmp_path / "copy.jsonl"
    gate.write_trace(out, replace(pin.trace, header=replace(pin.trace.header, role="candidate")))
    again = gate.read_trace(out)
    result = gate.compare(pin.trace, again)
    assert result.verdict == "strict_pass"
    assert all(isinstance(p, gate.PromptResult) for p in result.prompts)
    assert "strict_pass" in gate.render(result, "json")


class _Unclosable:
    """A plugin object with every contract method but `close()`: what an engine team writes
    when it forgets one method."""

    name = "unclosable"

    def __init__(self, inner: FakeEngine) -> None:
        self.inner = inner
        self.info = inner.info
        self.generate = inner.generate
        self.encode = inner.encode
        self.decode_tokens = inner.decode_tokens


class _CloseFails(FakeEngine):
    """An engine whose `close()` fails as well as its run."""

    def close(self) -> None:
        raise RuntimeError("close failed too")


def test_run_of_an_object_lacking_a_contract_method_names_what_it_lacks(pins: Path) -> None:
    engine = _Unclosable(FakeEngine(TOY_MODEL))
    FakeEngine.history.clear()
    with pytest.raises(gate.EngineError, match=r"lacks close\(\) of the plugin contract") as caught:
        gate.run(engine, TOY_MODEL, pins_dir=pins)  # type: ignore[arg-type]
    assert "_Unclosable" in str(caught.value)
    assert FakeEngine.history == []  # refused before any call into it


def test_gate_candidate_refuses_an_object_lacking_a_contract_method_as_gate_run_does(pins: Path) -> None:
    from gate.integrations.gating import gate_candidate

    with pytest.raises(gate.EngineError, match=r"lacks close\(\) of the plugin contract"):
        gate_candidate(_Unclosable(FakeEngine(TOY_MODEL)), model=TOY_MODEL, pins_dir=pins)  # type: ignore[arg-type]


def test_a_failing_close_never_hides_the_run_s_own_error(pins: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gate.engines import registry

    monkeypatch.setitem(registry.BUILTIN, "closefails", f"{__name__}:_CloseFails")
    with pytest.raises(gate.EngineError, match="crashed in generate") as caught:
        gate.run("closefails", TOY_MODEL, pins_dir=pins, options={"fail": "generate"})
    assert "close failed" not in str(caught.value)
