"""Every header field gate reads is type-checked in the reader: a wrong type is exit 2
naming the field, never an internal error (exit 4) where the field is used. Versioned
files of an unknown version are refused, never read as the version this gate knows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from helpers.gate_cli import TOY_MODEL, invoke, record_toy_pin, register_fake

from gate.core.traces.reader import read_trace
from gate.errors import TraceError

SEED = Path(__file__).resolve().parents[2] / "docs" / "examples"


def _with_header(src: Path, dst: Path, change: dict[str, Any], engine: dict[str, Any] | None = None) -> Path:
    first, rest = src.read_bytes().split(b"\n", 1)
    head = orjson.loads(first)
    head.update(change)
    if engine is not None:
        head["engine"] = {**head["engine"], **engine}
    dst.write_bytes(orjson.dumps(head) + b"\n" + rest)
    return dst


BAD_FIELDS = [
    (
        {},
        {"hardware": {"device_type": "cpu", "torch_cpu_capability": "AVX2", "cpu_flags": [["avx2"]]}},
        "engine.hardware.cpu_flags",
    ),
    ({}, {"hardware": "a big one"}, "engine.hardware"),
    ({"hardware": {"threads": "4"}}, None, "hardware.threads"),
    ({}, {"hardware": {"forced_isa": ["AVX2"]}}, "engine.hardware.forced_isa"),
    ({}, {"hardware": {"device_type": ["cpu"]}}, "engine.hardware.device_type"),
    ({"vocab_size": "49152"}, None, "vocab_size"),
    ({}, {"vocab_size": -1}, "engine.vocab_size"),
    ({"created_at": 20261201}, None, "created_at"),
    ({"suite_sha256": ["abc"]}, None, "suite_sha256"),
    ({"pin_suite_sha256": 7}, None, "pin_suite_sha256"),
    ({"prompt_sha256": "abc"}, None, "prompt_sha256"),
    ({"weights_sha256": {"a": 1}}, None, "weights_sha256"),
    ({"doctrine": "strict"}, None, "doctrine"),
    ({"engine_options": ["a=1"]}, None, "engine_options"),
    ({"gate_progress": 2}, None, "gate_progress"),
]


@pytest.mark.parametrize(("change", "engine", "fld"), BAD_FIELDS, ids=[b[2] for b in BAD_FIELDS])
def test_a_header_field_of_the_wrong_type_is_refused_naming_it(
    change: dict[str, Any], engine: dict[str, Any] | None, fld: str, tmp_path: Path
) -> None:
    bad = _with_header(SEED / "seed-candidate.jsonl", tmp_path / "cand.jsonl", change, engine)
    with pytest.raises(TraceError) as info:
        read_trace(bad)
    assert info.value.field == fld, str(info.value)
    assert info.value.exit_code == 2


def test_cpu_flags_holding_lists_is_exit_2_not_an_internal_error(tmp_path: Path) -> None:
    hw = {"device_type": "cpu", "torch_cpu_capability": "AVX2", "cpu_flags": [["avx512_bf16"]]}
    oracle = _with_header(SEED / "seed-oracle.jsonl", tmp_path / "oracle.jsonl", {}, {"hardware": hw})
    cand = _with_header(SEED / "seed-candidate.jsonl", tmp_path / "cand.jsonl", {}, {"hardware": hw})
    r = invoke(["compare", str(oracle), str(cand)])
    assert r.exit_code == 2, r.output
    assert "engine.hardware.cpu_flags" in r.stderr and "Traceback" not in r.output


def test_honest_headers_still_read(tmp_path: Path) -> None:
    for name in ("seed-oracle.jsonl", "seed-candidate.jsonl"):
        read_trace(SEED / name)
    ok = {"hardware": {"device_type": "cpu", "torch_cpu_capability": "AVX2", "cpu_flags": ["avx2"], "threads": 1}}
    read_trace(_with_header(SEED / "seed-candidate.jsonl", tmp_path / "c.jsonl", {"device": None}, ok))


@pytest.mark.parametrize("version", [2, 0, "1", None])
def test_a_golden_of_an_unknown_version_is_refused(
    version: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    register_fake(monkeypatch)
    pins = tmp_path / "pins"
    record_toy_pin(pins)
    golden = tmp_path / "golden.jsonl"
    common = ["--model", TOY_MODEL, "--pins-dir", str(pins), "--engine", "fake", "--golden", str(golden)]
    r = invoke(["goldens", "record", *common])
    assert r.exit_code == 0, r.output
    change: dict[str, Any] = {"golden": version}
    first, rest = golden.read_bytes().split(b"\n", 1)
    head = orjson.loads(first)
    if version is None:
        del head["golden"]
    else:
        head.update(change)
    golden.write_bytes(orjson.dumps(head) + b"\n" + rest)
    r = invoke(["goldens", "check", *common])
    assert r.exit_code == 2, r.output
    assert "field 'golden'" in r.stderr
    if version == 2:
        assert "unsupported golden version 2" in r.stderr


def test_a_live_engines_hardware_of_odd_types_does_not_crash_the_machine_key() -> None:
    from gate.core.traces.machine import machine_key

    hw = {"device_type": "cpu", "torch_cpu_capability": "AVX2", "cpu_flags": [["amx_bf16"], "avx512_bf16"]}
    assert machine_key(hw) == "cpu:AVX2+bf16"
