"""`gate pin reference` (`gate.workflows.pins.reference`): the float32 reference's lists are
added to a pin, the oracle's own fields stay value for value, the pin's digest does not move,
the floor goes into both copies of the doctrine, and a second run needs --force. With
`floor_only` a new floor replaces the old one (with --force) and nothing else moves: the lists
are not recorded again, every record line stays byte for byte. A tiny
random Llama pin recorded by the HF engine (tests/helpers/tiny_pin.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_adding_the_reference_keeps_the_oracle_and_judges_against_float32(tmp_path: Path) -> None:
    from helpers.tiny_pin import MODEL, build_tiny_pin, one_thread

    from gate.core.pins.pin import load_pin
    from gate.core.traces.digest import trace_sha256
    from gate.core.traces.reader import read_trace
    from gate.core.traces.trace import Trace, TraceHeader
    from gate.core.verdict.adjudicate import compare
    from gate.core.verdict.doctrine import Doctrine
    from gate.core.verdict.floor import Floor
    from gate.core.verdict.reference import REFERENCE_KEY, reference_of
    from gate.errors import PinError
    from gate.workflows.pins.reference import add_reference

    with one_thread():
        weights, pins = build_tiny_pin(tmp_path)
        pin_path = pins / MODEL / "pin.jsonl"
        before_lines = [json.loads(x) for x in pin_path.read_text().splitlines()]
        before = read_trace(pin_path, role="oracle")
        floor = Floor(0.5, 5.0, 0.95, 1.5, "test floor")
        add_reference(MODEL, pins, model_path=weights, floor=floor)
        with pytest.raises(PinError, match="--force"):
            add_reference(MODEL, pins, model_path=weights)

    after_lines = [json.loads(x) for x in pin_path.read_text().splitlines()]
    assert after_lines[0]["reference"]["dtype"] == "float32"
    assert after_lines[0]["doctrine"]["reference_floor"] == floor.to_dict()
    head = {k: v for k, v in after_lines[0].items() if k not in ("reference", "doctrine")}
    assert head == {k: v for k, v in before_lines[0].items() if k != "doctrine"}
    for old, new in zip(before_lines[1:], after_lines[1:], strict=True):
        lists = new.pop(REFERENCE_KEY)
        assert new == old  # every field the oracle recorded, value for value
        assert len(lists) == len(old["token_ids"]) and all(len(x) == 5 for x in lists)
    settings = json.loads((pins / MODEL / "oracle.json").read_text())
    assert settings["doctrine"]["reference_floor"] == floor.to_dict()

    # A new floor alone: no engine is loaded, the lists stay, only the doctrine's
    # reference_floor moves (in the header and in oracle.json).
    lines_before = pin_path.read_bytes().splitlines(keepends=True)
    raised = Floor(0.5, 9.0, 0.95, 1.5, "raised test floor")
    with pytest.raises(PinError, match="--force"):
        add_reference(MODEL, pins, floor=raised, floor_only=True)
    assert pin_path.read_bytes().splitlines(keepends=True) == lines_before
    add_reference(MODEL, pins, floor=raised, floor_only=True, force=True)
    lines_now = pin_path.read_bytes().splitlines(keepends=True)
    assert lines_now[1:] == lines_before[1:]
    head_now, head_before = json.loads(lines_now[0]), json.loads(lines_before[0])
    assert head_now["doctrine"]["reference_floor"] == raised.to_dict()
    head_now["doctrine"]["reference_floor"] = head_before["doctrine"]["reference_floor"]
    assert head_now == head_before
    settings_now = json.loads((pins / MODEL / "oracle.json").read_text())
    assert settings_now["doctrine"]["reference_floor"] == raised.to_dict()
    settings_now["doctrine"]["reference_floor"] = settings["doctrine"]["reference_floor"]
    assert settings_now == settings

    pin = load_pin(MODEL, pins)
    assert trace_sha256(pin.trace) == trace_sha256(before)
    ref = reference_of(pin.trace)
    assert ref is not None and set(ref) == {r.id for r in pin.trace.records}
    # The oracle's own tokens as a candidate (a bf16 engine that is the oracle bit for bit):
    # judged against the float32 reference, by its floor.
    o = pin.trace
    cand = Trace(
        TraceHeader("candidate", o.header.model, o.header.top_k, dict(o.header.engine)),
        tuple(
            r.__class__(
                id=r.id, prompt_token_ids=r.prompt_token_ids, token_ids=r.token_ids, top_logprobs=r.top_logprobs
            )
            for r in o.records
        ),
    )
    d = compare(o, cand, Doctrine(reference_floor=floor)).distribution
    assert d is not None and d.by_reference and d.judged
    assert d.reference is not None and d.reference.kl_mean_mnats is not None and d.reference.kl_mean_mnats > 0


def test_a_floor_alone_needs_the_pin_to_carry_its_reference(tmp_path: Path) -> None:
    """`floor_only` on a pin without float32 lists, or without a floor, is an input error and
    writes nothing (no engine is loaded: the pin is a written file)."""
    from gate.core.traces.trace import PromptRecord, TraceHeader, encode_trace
    from gate.core.verdict.floor import Floor
    from gate.errors import InputError, PinError
    from gate.workflows.pins.reference import add_reference

    folder = tmp_path / "pins" / "org" / "m"
    folder.mkdir(parents=True)
    header = TraceHeader("oracle", "org/m", 2, {"name": "vllm", "version": "0"})
    record = PromptRecord(id="a", prompt_token_ids=(1, 2), token_ids=(3,), top_logprobs=(((3, -0.1), (4, -2.5)),))
    pin_bytes = encode_trace(header, [record])
    (folder / "pin.jsonl").write_bytes(pin_bytes)
    (folder / "oracle.json").write_text('{"model": "org/m", "engine": "vllm"}\n')
    floor = Floor(0.5, 9.0, 0.95, 1.5, "test floor")
    with pytest.raises(PinError, match="float32 reference"):
        add_reference("org/m", tmp_path / "pins", floor=floor, floor_only=True, force=True)
    with pytest.raises(InputError, match="--floor"):
        add_reference("org/m", tmp_path / "pins", floor_only=True)
    assert (folder / "pin.jsonl").read_bytes() == pin_bytes
    assert (folder / "oracle.json").read_text() == '{"model": "org/m", "engine": "vllm"}\n'
