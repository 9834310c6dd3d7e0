"""`forced_mode` (candidate records, beside `forced_token_ids`): `"decode"` or `"prefill"`
(docs/reference/trace-format.md). It was kept unchecked, whatever it held: a number, an
object, a mode no engine writes, or a mode with no forced decode to describe. Exit 2
naming the line and field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from gate.core.traces.reader import read_trace
from gate.errors import TraceError

HEADER = {"gate_trace": 1, "role": "candidate", "model": "m", "top_k": 1, "engine": {"name": "e", "version": "1"}}
RECORD = {"id": "p", "prompt_token_ids": [1], "token_ids": [2], "forced_token_ids": [2]}


def _read(tmp_path: Path, record: dict[str, Any], role: str = "candidate") -> Any:
    path = tmp_path / "c.jsonl"
    path.write_bytes(orjson.dumps({**HEADER, "role": role}) + b"\n" + orjson.dumps(record) + b"\n")
    return read_trace(path)


@pytest.mark.parametrize("mode", ["decode", "prefill"])
def test_the_two_modes_are_kept(tmp_path: Path, mode: str) -> None:
    (rec,) = _read(tmp_path, {**RECORD, "forced_mode": mode}).records
    assert rec.forced_mode == mode and "forced_mode" not in rec.extra


@pytest.mark.parametrize("mode", ["Prefill", "teacher", "", 1, True, ["decode"], {"mode": "decode"}])
def test_any_other_value_is_refused(tmp_path: Path, mode: Any) -> None:
    with pytest.raises(TraceError) as info:
        _read(tmp_path, {**RECORD, "forced_mode": mode})
    assert info.value.line == 2 and info.value.field == "forced_mode"
    assert "'decode' or 'prefill'" in info.value.problem


def test_null_is_no_mode(tmp_path: Path) -> None:
    (rec,) = _read(tmp_path, {**RECORD, "forced_mode": None}).records
    assert rec.forced_mode is None


def test_a_mode_without_a_forced_decode_is_refused(tmp_path: Path) -> None:
    record = {k: v for k, v in RECORD.items() if k != "forced_token_ids"}
    with pytest.raises(TraceError) as info:
        _read(tmp_path, {**record, "forced_mode": "decode"})
    assert info.value.field == "forced_mode" and "forced_token_ids" in info.value.problem
